"""Figure 3 of the paper: how well ``c(k) ~ exp(-beta k)`` fits, and the curves themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tl_geometry.errors import InputError
from tl_geometry.plot.base import DIAGNOSTICS, as_array, base_layout, get_table

if TYPE_CHECKING:
    from tl_geometry.pipeline.result import AnalysisResult


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


def similarity_curves(
    result: AnalysisResult | pd.DataFrame,
    pairs: Sequence[tuple[int, int]] | None = None,
    *,
    selected: tuple[int, int] | None = None,
) -> go.Figure:
    """``c(k)`` and its fit ``exp(-beta k)``: median and quartiles across (layer, kv_head), one pair selectable (Fig. 3).

    Parameters
    ----------
    result : AnalysisResult or DataFrame
        A result of ``tlg.analyze(..., diagnostics=True)`` or its ``similarity_curve`` table
        (``c`` = mean ``cos(v_i, v_j)`` over pairs ``i, j > 0`` at lag ``k = |i - j|``, ``fit``).
    pairs : list of (layer, kv_head), optional
        The pairs summarised and offered in the menu (default: every pair in the table).
    selected : (layer, kv_head), optional
        The pair shown first (default: the first of ``pairs``, sorted).

    Returns
    -------
    plotly.graph_objects.Figure
        Four summary traces over the chosen pairs, per lag ``k``: ``"c(k): 25th percentile"``
        (no line), ``"c(k): quartile band"`` (the 75th percentile, filled down to the 25th),
        ``"c(k): median"`` (solid) and ``"fit: median"`` (dashed); then two traces per pair,
        ``"L{layer} kv{g}: c(k)"`` (markers) and ``"L{layer} kv{g}: fit"`` (dashed), of which only
        the selected pair's are visible. A dropdown (``layout.updatemenus[0]``, one button per
        pair) switches the visible pair. With 30 layers x 3 kv heads, 90 curves drawn at once
        could not be read.

    Notes
    -----
    How to read it: where the markers follow the dashed curve, Assumption 2 holds for that head;
    the band shows how far the heads spread around the median. Negative ``c(k)`` (which the model
    cannot express) or a slow, non-exponential decay are the usual departures. Linear axes
    (cosines can be negative).
    """
    curve = get_table(
        result, "similarity_curve", DIAGNOSTICS, "similarity_curves", ["layer", "kv_head", "k", "c", "fit"]
    )
    held = sorted({(int(a), int(b)) for a, b in zip(curve["layer"], curve["kv_head"])})
    chosen = held if pairs is None else [(int(a), int(b)) for a, b in pairs]
    unknown = [p for p in chosen if p not in held]
    if unknown:
        raise InputError(f"similarity_curves(): pairs {unknown} are not in the table (it holds {held[:8]}...)")
    first = chosen[0] if selected is None else (int(selected[0]), int(selected[1]))
    if first not in chosen:
        raise InputError(f"similarity_curves(): selected={first} is not among the pairs drawn")
    keys = pd.MultiIndex.from_tuples(chosen, names=["layer", "kv_head"])
    part = curve.set_index(["layer", "kv_head"]).loc[keys].reset_index()
    fig = go.Figure()
    _add_band(fig, part)
    for layer, g in chosen:
        one = part[(part["layer"] == layer) & (part["kv_head"] == g)].sort_values("k")
        group, visible = f"L{layer} kv{g}", (layer, g) == first
        fig.add_trace(
            go.Scatter(
                x=one["k"].to_numpy(),
                y=as_array(one["c"]),
                mode="markers",
                name=f"{group}: c(k)",
                legendgroup=group,
                visible=visible,
                marker=dict(color=_SELECTED),
            )
        )
        fig.add_trace(
            go.Scatter(
                x=one["k"].to_numpy(),
                y=as_array(one["fit"]),
                mode="lines",
                name=f"{group}: fit",
                legendgroup=group,
                visible=visible,
                line=dict(color=_SELECTED, dash="dash"),
            )
        )
    fig.update_layout(updatemenus=[_pair_menu(chosen, first)])
    title = (
        f"Cosine similarity by lag, c(k), and its fit exp(−βk) (Fig. 3): median and quartiles of {len(chosen)} "
        "(layer, kv_head) pairs"
    )
    return base_layout(fig, title, "lag k = |i − j| (positions)", "mean cos(v_i, v_j), i, j > 0")


_BAND = "#1f77b4"
_SELECTED = "#d62728"
_N_SUMMARY = 4


def _add_band(fig: go.Figure, part: pd.DataFrame) -> None:
    """Quartile band and medians of ``c`` and ``fit`` across the pairs, per lag."""
    by_k = part.groupby("k")
    q = by_k["c"].quantile([0.25, 0.5, 0.75]).unstack()
    x = q.index.to_numpy()
    fig.add_trace(
        go.Scatter(
            x=x,
            y=as_array(q[0.25]),
            mode="lines",
            line=dict(width=0),
            name="c(k): 25th percentile",
            showlegend=False,
            hoverinfo="skip",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=as_array(q[0.75]),
            mode="lines",
            line=dict(width=0),
            fill="tonexty",
            fillcolor="rgba(31, 119, 180, 0.2)",
            name="c(k): quartile band",
        )
    )
    fig.add_trace(go.Scatter(x=x, y=as_array(q[0.5]), mode="lines", name="c(k): median", line=dict(color=_BAND)))
    fit = by_k["fit"].median()
    fig.add_trace(
        go.Scatter(
            x=fit.index.to_numpy(),
            y=as_array(fit),
            mode="lines",
            name="fit: median",
            line=dict(color=_BAND, dash="dash"),
        )
    )


def _pair_menu(chosen: list[tuple[int, int]], first: tuple[int, int]) -> dict:
    """A dropdown with one button per pair: the summary traces stay, only that pair's two show."""
    buttons = []
    for i, (layer, g) in enumerate(chosen):
        visible = [True] * _N_SUMMARY + [j == i for j in range(len(chosen)) for _ in range(2)]
        buttons.append(dict(label=f"layer {layer}, kv head {g}", method="restyle", args=[{"visible": visible}]))
    return dict(
        buttons=buttons,
        active=chosen.index(first),
        direction="down",
        x=1.0,
        xanchor="right",
        y=1.12,
        yanchor="top",
        showactive=True,
    )
