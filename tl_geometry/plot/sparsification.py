"""Figures of the top-N intervention (definitions §8): loss curves, geometry against loss, localised loss.

:func:`loss_curve` (b), :func:`geometry_vs_loss` (c) and :func:`localized_loss_map` (d); the
static ``"sink_window"`` pattern is drawn as a dashed grey baseline. How to read them:
docs/figures.md.

Examples
--------
>>> import pandas as pd
>>> from tl_geometry.intervention.curve import SparsificationCurve, CURVE_COLUMNS
>>> rows = [{"rank_by": r, "renormalize": False, "n": n, "nll": 1 + d, "nll_full": 1.0, "delta_nll_rel": d,
...          "n_tokens": 9, "stage": "grid"} for r, k in (("attention", 0.5), ("sink_window", 2.0))
...         for n, d in ((1, k), (4, k / 8), (16, 0.0))]
>>> fig = loss_curve(SparsificationCurve(pd.DataFrame(rows, columns=CURVE_COLUMNS), 1.0, {}))
>>> [t.name for t in fig.data]
['attention (deletion)', 'N* attention (deletion) = 16', 'sink_window (deletion)', 'N* sink_window (deletion) = 16']
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tl_geometry.errors import InputError
from tl_geometry.intervention.curve import DEFAULT_TOLERANCE, SparsificationCurve
from tl_geometry.intervention.function import geometry_vs_function
from tl_geometry.plot.base import full_log_ticks

RANKING_COLORS = {"attention": "#0072B2", "contribution": "#009E73", "random": "#D55E00", "sink_window": "#777777"}
BASELINE = "sink_window"


def _label(rank_by: str, renorm: bool) -> str:
    return f"{rank_by} ({'renormalised' if renorm else 'deletion'})"


def _curve(curve: Any) -> SparsificationCurve:
    if not isinstance(curve, SparsificationCurve) or curve.table.empty:
        raise InputError("this figure needs a SparsificationCurve with points: tlg.sparsification_curve(model, corpus)")
    return curve


def loss_curve(curve: SparsificationCurve, tolerance: float = DEFAULT_TOLERANCE) -> go.Figure:
    """(b) ``delta_nll_rel(N)`` per ranking and renormalisation; log ``N``; tolerance line; ``N*`` marked.

    Solid lines: deletion; dotted: renormalisation; ``sink_window`` dashed grey (the static
    baseline). A star marks ``N*_tau`` over the sizes measured (``refine=False``: no new passes).
    """
    curve = _curve(curve)
    n_star = curve.effective_set_size(tolerance, refine=False).set_index(["rank_by", "renormalize"])["n_star"]
    fig = go.Figure()
    for (rank_by, renorm), points in curve.table.groupby(["rank_by", "renormalize"], sort=False):
        points = points.sort_values("n")
        color = RANKING_COLORS.get(rank_by, "#000000")
        dash = "dash" if rank_by == BASELINE else ("dot" if renorm else "solid")
        fig.add_trace(
            go.Scatter(
                x=points.n,
                y=points.delta_nll_rel,
                mode="lines+markers",
                name=_label(rank_by, renorm),
                line=dict(color=color, dash=dash),
            )
        )
        star = n_star.get((rank_by, bool(renorm)))
        if star is not None and not pd.isna(star):
            y = float(points.loc[points.n == star, "delta_nll_rel"].iloc[0])
            fig.add_trace(
                go.Scatter(
                    x=[int(star)],
                    y=[y],
                    mode="markers",
                    marker=dict(symbol="star", size=14, color=color),
                    name=f"N* {_label(rank_by, renorm)} = {int(star)}",
                    showlegend=True,
                )
            )
    fig.add_hline(y=tolerance, line=dict(color="black", dash="dash", width=1), annotation_text=f"τ = {tolerance:g}")
    fig.update_layout(
        title="Loss of the top-N intervention by N (relative NLL increase)",
        template="plotly_white",
        xaxis=dict(type="log", title="N (keys kept per query, log scale)"),
        yaxis=dict(title="delta_nll_rel = (NLL_N − NLL) / NLL"),
    )
    return full_log_ticks(fig)


def geometry_vs_loss(
    result: Any, curve: SparsificationCurve, geometry: str = "f_at_rmax", renormalize: bool = False
) -> go.Figure:
    """(c) Mean ``geometry`` (F) against ``delta_nll_rel``, one point per ``N``, per ranking, with Spearman's rho."""
    curve = _curve(curve)
    if geometry not in ("f_at_rmax", "f_at_rmin"):
        raise InputError(f"geometry={geometry!r}: use 'f_at_rmax' or 'f_at_rmin'")
    rhos = geometry_vs_function(result, curve).set_index(["rank_by", "renormalize", "geometry"])["rho"]
    sep = getattr(result, "separability", result)
    fig = go.Figure()
    table = curve.table[curve.table.renormalize == renormalize]
    for rank_by, points in table.groupby("rank_by", sort=False):
        rows = (
            sep[sep["rank_by"] == rank_by]
            if "rank_by" in sep.columns
            else (sep if rank_by == "attention" else sep.iloc[:0])
        )
        both = rows.groupby("n")[geometry].mean().to_frame().join(points.groupby("n").delta_nll_rel.mean(), how="inner")
        if both.empty:
            continue
        rho = rhos.get((rank_by, bool(renormalize), geometry), np.nan)
        fig.add_trace(
            go.Scatter(
                x=both[geometry],
                y=both.delta_nll_rel,
                mode="markers+text",
                text=[f"N={n}" for n in both.index],
                textposition="top center",
                name=f"{rank_by} (ρ = {rho:.2f})",
                marker=dict(
                    color=RANKING_COLORS.get(rank_by, "#000000"), symbol="diamond" if rank_by == BASELINE else "circle"
                ),
            )
        )
    if not fig.data:
        raise InputError("no size N is both in the separability table and in the curve: analyse with the curve's ns")
    fig.update_layout(
        title=f"Geometry against function: mean {geometry} vs loss, one point per N",
        template="plotly_white",
        xaxis=dict(title=f"mean {geometry}"),
        yaxis=dict(title="delta_nll_rel"),
    )
    return fig


def localized_loss_map(local: pd.DataFrame) -> go.Figure:
    """(d) Layer x head heat map of ``delta_nll_rel`` with one (layer, head) restricted at a time.

    A table by layer (``unit="layer"``) is drawn as one column.
    """
    if (
        not isinstance(local, pd.DataFrame)
        or local.empty
        or not {"layer", "head", "delta_nll_rel"} <= set(local.columns)
    ):
        raise InputError("localized_loss_map needs the table of tlg.localized_loss(model, corpus, unit='head')")
    by_head = local["head"].notna().all()
    grid = (
        local.pivot(index="layer", columns="head", values="delta_nll_rel")
        if by_head
        else local.set_index("layer")[["delta_nll_rel"]].rename(columns={"delta_nll_rel": "all heads"})
    )
    n, rank_by = local["n"].iloc[0], local["rank_by"].iloc[0]
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(float),
            x=[str(c) for c in grid.columns],
            y=list(grid.index),
            colorscale="Reds",
            colorbar=dict(title="delta_nll_rel"),
        )
    )
    fig.update_layout(
        title=f"Localised loss: one {'head' if by_head else 'layer'} restricted to top-{n} ({rank_by})",
        template="plotly_white",
        xaxis=dict(title="head"),
        yaxis=dict(title="layer", autorange="reversed"),
    )
    return fig


__all__ = ["RANKING_COLORS", "geometry_vs_loss", "localized_loss_map", "loss_curve"]
