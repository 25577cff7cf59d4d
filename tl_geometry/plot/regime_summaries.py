"""Figures 8 and 11 of the paper: regime shares by layer, and precision / recall by regime."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tl_geometry.errors import InputError
from tl_geometry.plot.base import N_AXIS, as_array, base_layout, full_log_ticks, separability_sums
from tl_geometry.plot.colors import REGIME_COLORS, REGIME_ORDER
from tl_geometry.plot.regime_curves import check_heads
from tl_geometry.taxonomy import regime_pr_curves, regime_shares

if TYPE_CHECKING:
    from tl_geometry.pipeline.result import AnalysisResult


def regimes_by_layer(heads: pd.DataFrame) -> go.Figure:
    """Stacked share of each regime among the heads of every layer (Fig. 8).

    Parameters
    ----------
    heads : DataFrame
        :func:`tl_geometry.taxonomy.classify_heads` output (one row per (layer, head)).

    Returns
    -------
    plotly.graph_objects.Figure
        Stacked bars, one trace per label in the order Retriever, Mixer, Reset, Unclassified,
        coloured by :data:`REGIME_COLORS`: ``x`` the layers, ``y`` the share of that layer's
        heads with the label (:func:`tl_geometry.taxonomy.regime_shares`; the counts are on hover).

    Notes
    -----
    How to read it: each bar sums to 1. The paper (LLaMA-2-7B) sees Retriever heads mostly in
    the first two layers, Reset heads prevailing in the first few, and Mixer heads predominant
    from the lower-middle layers on. A large grey share means the thresholds
    (:class:`tl_geometry.taxonomy.RegimeThresholds`) leave many heads unclassified.
    """
    check_heads(heads, "regimes_by_layer")
    shares = regime_shares(heads)
    shares["regime"] = shares["regime"].astype(str)
    fig = go.Figure()
    for regime in REGIME_ORDER:
        part = shares[shares["regime"] == regime].sort_values("layer")
        fig.add_trace(
            go.Bar(
                x=part["layer"].to_numpy(),
                y=as_array(part["share"]),
                name=regime,
                marker_color=REGIME_COLORS[regime],
                customdata=part["n_heads"].to_numpy(),
                hovertemplate=f"{regime}<br>layer %{{x}}: %{{y:.0%}} (%{{customdata}} heads)<extra></extra>",
            )
        )
    fig = base_layout(fig, "Head regimes by layer (Fig. 8)", "layer", "share of heads (0–1)")
    fig.update_layout(barmode="stack")
    fig.update_yaxes(range=[0, 1])
    return fig


def regime_pr(
    result: AnalysisResult | pd.DataFrame,
    heads: pd.DataFrame,
    *,
    query_pos: int | None = None,
    include_unclassified: bool = True,
) -> go.Figure:
    """Mean precision (left) and recall (right) over ``N`` for each regime (Fig. 11).

    Parameters
    ----------
    result : AnalysisResult or DataFrame
        Any result of ``tlg.analyze`` or its ``separability`` table.
    heads : DataFrame
        :func:`tl_geometry.taxonomy.classify_heads` output for the same model.
    query_pos : int, optional
        The query position, when the separability table holds several.
    include_unclassified : bool, default True
        Also draw the Unclassified heads (grey).

    Returns
    -------
    plotly.graph_objects.Figure
        Two panels; in each, one trace per regime that has heads, in the order Retriever, Mixer,
        Reset, Unclassified, named after the regime and coloured by :data:`REGIME_COLORS`.
        ``y`` is :func:`tl_geometry.taxonomy.regime_pr_curves`: per (layer, head, N) the mean
        over sequences, then the mean over the regime's heads (count on hover). Log ``N`` axes.

    Notes
    -----
    How to read it: the paper finds modest differences in the global means — Retriever with higher
    recall at large ``N`` but lower precision, Mixer with moderate recall and slowly falling
    precision, Reset U-shaped — the regimes differ more in geometry (:func:`regime_diagnostics`)
    than in raw precision / recall.
    """
    check_heads(heads, "regime_pr")
    sep = separability_sums(result, "run tlg.analyze(...)", "regime_pr", ["layer", "head", "n", "precision", "recall"])
    curves = regime_pr_curves(sep, heads, query_pos=query_pos)
    curves["regime"] = curves["regime"].astype(str)
    order = [r for r in REGIME_ORDER if include_unclassified or r != "Unclassified"]
    present = [r for r in order if (curves["regime"] == r).any()]
    if not present:
        raise InputError("regime_pr(): no head of the chosen regimes is in the separability table")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Precision P(r_max, N)", "Recall R(r_min, N)"))
    for col, metric in enumerate(("precision", "recall"), start=1):
        for regime in present:
            part = curves[curves["regime"] == regime].sort_values("n")
            fig.add_trace(
                go.Scatter(
                    x=part["n"].to_numpy(),
                    y=as_array(part[metric]),
                    mode="lines+markers",
                    name=regime,
                    legendgroup=regime,
                    showlegend=col == 1,
                    line=dict(color=REGIME_COLORS[regime]),
                    customdata=part["n_heads"].to_numpy(),
                    hovertemplate=f"{regime}<br>N = %{{x}}: %{{y:.3f}} (%{{customdata}} heads)<extra></extra>",
                ),
                row=1,
                col=col,
            )
    fig.update_layout(title=dict(text="Precision and recall by head regime (Fig. 11)"), template="plotly_white")
    fig.update_xaxes(type="log", title_text=N_AXIS)
    fig.update_yaxes(title_text="mean over the regime's heads (share, 0–1)", range=[-0.02, 1.02])
    return full_log_ticks(fig)
