"""Colours and line styles shared by every figure, so a regime or a quantity looks the same everywhere."""

from __future__ import annotations

#: One colour per head regime (Okabe-Ito, colour-blind safe); keys are the labels of
#: :func:`tl_geometry.taxonomy.classify_heads`.
REGIME_COLORS: dict[str, str] = {
    "Retriever": "#0072B2",  # blue
    "Mixer": "#009E73",  # bluish green
    "Reset": "#D55E00",  # vermillion
    "Unclassified": "#999999",  # grey
}

#: Display order of the regimes: the paper's left-to-right order (Figures 7, 10), then Unclassified.
REGIME_ORDER: tuple[str, ...] = ("Retriever", "Mixer", "Reset", "Unclassified")

#: Colours of the measured curves and of the envelopes (the paper's Figure 5: measured solid blue,
#: upper envelope dotted orange, lower envelope dashed green).
METRIC_COLORS: dict[str, str] = {
    "precision": "#1f77b4",
    "recall": "#d62728",
    "f_at_rmax": "#9467bd",
    "f_at_rmin": "#8c564b",
}
MEASURED_COLOR = "#1f77b4"
UPPER_COLOR = "#ff7f0e"
LOWER_COLOR = "#2ca02c"

#: Correlation curves (Figure 6).
PEARSON_COLOR = "#1f77b4"
SPEARMAN_COLOR = "#ff7f0e"
