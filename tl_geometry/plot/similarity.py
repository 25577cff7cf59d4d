"""Figure 3 of the paper: how well ``c(k) ~ exp(-beta k)`` fits, and the curves themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from ..errors import InputError
from ._common import DIAGNOSTICS, as_array, base_layout, get_table

if TYPE_CHECKING:
    from ..analysis import AnalysisResult


def mae_histogram(result: AnalysisResult | pd.DataFrame, *, nbins: int | None = None) -> go.Figure:
    """Histogram of the mean absolute error of the exponential similarity fit (Fig. 3).

    Parameters
    ----------
    result : AnalysisResult or DataFrame
        A result of ``tlg.analyze(..., diagnostics=True)`` or its ``similarity`` table: per
        ``(layer, kv_head)``, ``mae = mean_{k=1..k_max} |c(k) - exp(-beta k)|``.
    nbins : int, optional
        Number of bins.

    Returns
    -------
    plotly.graph_objects.Figure
        One histogram trace ``"mae"`` (``x`` = the per-pair MAEs) and a vertical line at their
        mean, stated in the title (the paper reports an average of 0.09 on LLaMA-2).

    Notes
    -----
    How to read it: small MAEs support Assumption 2 (cosines decay exponentially with the lag).
    Read it with ``beta`` and ``share_negative`` of the same table: nearly orthogonal values give
    ``c(k) ~ 0``, a huge ``beta`` and a small MAE — a good fit of a trivial curve, not support.
    """
    table = get_table(result, "similarity", DIAGNOSTICS, "mae_histogram", ["layer", "kv_head", "mae"])
    mae = as_array(table["mae"])
    mean = float(np.nanmean(mae))
    fig = go.Figure(go.Histogram(x=mae, nbinsx=nbins, name="mae", marker_color="#1f77b4"))
    fig.add_vline(x=mean, line_dash="dash", line_color="black", annotation_text=f"mean {mean:.3f}")
    title = f"Error of the exponential similarity fit (Fig. 3): {len(mae)} (layer, kv_head) pairs, mean MAE {mean:.3f}"
    return base_layout(fig, title, "MAE of c(k) against exp(−βk) (cosine units)", "number of (layer, kv_head) pairs")


def similarity_curves(result: AnalysisResult | pd.DataFrame, pairs: Sequence[tuple[int, int]] | None = None) -> go.Figure:
    """Measured ``c(k)`` and its exponential fit ``exp(-beta k)`` per (layer, kv_head) (Fig. 3's data).

    Parameters
    ----------
    result : AnalysisResult or DataFrame
        A result of ``tlg.analyze(..., diagnostics=True)`` or its ``similarity_curve`` table
        (``c`` = mean ``cos(v_i, v_j)`` over pairs ``i, j > 0`` at lag ``k = |i - j|``, ``fit``).
    pairs : list of (layer, kv_head), optional
        Which curves to draw (default: every pair in the table; with many layers pass a few).

    Returns
    -------
    plotly.graph_objects.Figure
        Two traces per pair, in the order given (default: sorted): ``"L{layer} kv{g}: c(k)"``
        (solid, markers) and ``"L{layer} kv{g}: fit"`` (dashed, same colour).

    Notes
    -----
    How to read it: where the markers follow the dashed curve, Assumption 2 holds for that head;
    negative ``c(k)`` (which the model cannot express) or a slow, non-exponential decay are the
    usual departures. The lag axis is linear, the cosine axis linear (cosines can be negative).
    """
    curve = get_table(result, "similarity_curve", DIAGNOSTICS, "similarity_curves", ["layer", "kv_head", "k", "c", "fit"])
    held = sorted({(int(a), int(b)) for a, b in zip(curve["layer"], curve["kv_head"])})
    chosen = held if pairs is None else [(int(a), int(b)) for a, b in pairs]
    unknown = [p for p in chosen if p not in held]
    if unknown:
        raise InputError(f"similarity_curves(): pairs {unknown} are not in the table (it holds {held[:8]}...)")
    fig = go.Figure()
    palette = qualitative.Plotly
    for idx, (layer, g) in enumerate(chosen):
        part = curve[(curve["layer"] == layer) & (curve["kv_head"] == g)].sort_values("k")
        color = palette[idx % len(palette)]
        group = f"L{layer} kv{g}"
        fig.add_trace(go.Scatter(x=part["k"].to_numpy(), y=as_array(part["c"]), mode="lines+markers",
                                 name=f"{group}: c(k)", legendgroup=group, line=dict(color=color)))  # fmt: skip
        fig.add_trace(go.Scatter(x=part["k"].to_numpy(), y=as_array(part["fit"]), mode="lines",
                                 name=f"{group}: fit", legendgroup=group, line=dict(color=color, dash="dash")))  # fmt: skip
    title = "Cosine similarity by lag, c(k), and its fit exp(−βk) (Fig. 3, curves)"
    return base_layout(fig, title, "lag k = |i − j| (positions)", "mean cos(v_i, v_j), i, j > 0")
