"""Figure 5 of the paper: mean precision and recall over the selection size N, and the envelopes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tl_geometry.errors import InputError
from tl_geometry.io.row_sums import means_of_sums
from tl_geometry.plot.base import BOUNDS, N_AXIS, as_array, base_layout, full_log_ticks, select_query, separability_sums
from tl_geometry.plot.colors import LOWER_COLOR, MEASURED_COLOR, METRIC_COLORS, UPPER_COLOR
from tl_geometry.theory.observer import envelopes as envelope_table

if TYPE_CHECKING:
    from tl_geometry.pipeline.result import AnalysisResult


_METRICS = ("precision", "recall", "f_at_rmax", "f_at_rmin")


def separability_by_n(
    result: AnalysisResult | pd.DataFrame,
    metrics: Sequence[str] = ("precision", "recall"),
    *,
    query_pos: int | None = None,
) -> go.Figure:
    """Mean precision and recall (or any of the F-scores) against ``N``, log x (Fig. 5, measured part).

    Parameters
    ----------
    result : AnalysisResult or DataFrame
        Any result of ``tlg.analyze`` or its ``separability`` table.
    metrics : columns to draw, default ``("precision", "recall")``; also ``"f_at_rmax"``,
        ``"f_at_rmin"``.
    query_pos : int, optional
        Use only the rows of this query position (default: every row).

    Returns
    -------
    plotly.graph_objects.Figure
        One trace per metric, named after its column; ``y`` at each ``N`` is the mean of that
        column over every row with that ``N`` (sequences, layers, heads, query positions).

    Notes
    -----
    How to read it: ``precision(N) = P(r_max, N)`` and ``recall(N) = R(r_min, N)`` (definitions §2).
    Both are 1 at ``N = 1`` and ``N = K`` by construction; the paper finds the strongest
    non-trivial separability at small ``N`` (1–4) and the weakest at intermediate ``N`` (tens).
    """
    sep = separability_sums(result, "run tlg.analyze(...)", "separability", ["n", *metrics])
    sep = select_query(sep, query_pos, "separability")
    bad = [m for m in metrics if m not in _METRICS]
    if bad:
        raise InputError(f"separability(): unknown metrics {bad}; choose from {list(_METRICS)}")
    mean = means_of_sums(sep, ["n"]).set_index("n")
    fig = go.Figure()
    for m in metrics:
        fig.add_trace(
            go.Scatter(
                x=mean.index.to_numpy(),
                y=as_array(mean[m]),
                mode="lines+markers",
                name=m,
                line=dict(color=METRIC_COLORS[m]),
            )
        )
    n_rows = int(sep["n_rows"].sum())
    title = f"Separability of top-N selection (Fig. 5): mean per N over {n_rows} rows (sequences, layers, heads)"
    return base_layout(fig, title, N_AXIS, "mean over sequences, layers and heads (share, 0–1)", log_x=True)


def envelopes_by_n(
    result: AnalysisResult | pd.DataFrame, *, query_pos: int | None = None, kappa: float | None = None
) -> go.Figure:
    """Mean precision (left) and recall (right) over ``N`` with the mean theoretical envelopes (Fig. 5).

    Parameters
    ----------
    result : AnalysisResult or DataFrame
        A result of ``tlg.analyze(..., bounds=True)`` (``kappa`` is read from
        ``result.config["bounds"]["kappa"]``), or a separability table with the bound columns
        (``kappa`` from its ``attrs`` or the argument).
    query_pos : int, optional
        Use only the rows of this query position (default: every row).
    kappa : float, optional
        The concentration constant, when it cannot be read from ``result``; if given together with
        a result, it must agree with the one the bounds were computed with.

    Returns
    -------
    plotly.graph_objects.Figure
        Two panels, three traces each (precision first): ``"mean precision"`` (solid blue),
        ``"upper envelope (κ = …)"`` (dotted orange), ``"lower envelope (κ = …)"`` (dashed green),
        then the same for recall; ``y`` are the per-``N`` means of :func:`tl_geometry.envelopes`.
        The title states ``kappa``.

    Notes
    -----
    How to read it: the theorems bound the *expected* precision / recall, so the measured mean
    should lie between the mean envelopes (``m_mean_inside`` in ``result.envelopes()``). Upper
    envelopes near the measured curve mean the bound is tight; a lower envelope at 0 is vacuous
    (no guarantee at that ``N``). The envelopes scale with ``kappa``, a constant the paper leaves
    unnamed, so the figure is only meaningful with it stated.
    """
    sep = separability_sums(
        result,
        BOUNDS,
        "envelopes",
        ["n", "precision", "recall", "precision_lower", "precision_upper", "recall_lower", "recall_upper"],
    )
    stated = (getattr(result, "config", None) or {}).get("bounds") or {}
    known = stated.get("kappa", getattr(result, "attrs", {}).get("kappa"))
    if known is not None and kappa is not None and float(known) != float(kappa):
        raise InputError(f"envelopes(): kappa={kappa} was given but the bounds were computed with kappa={known}")
    kappa = known if known is not None else kappa
    if kappa is None:
        raise InputError("envelopes(): the table does not record kappa; pass kappa= (the value given to tlg.analyze)")
    table = envelope_table(select_query(sep, query_pos, "envelopes"))
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("Precision P(r_max, N)", "Recall R(r_min, N)"),
        shared_xaxes=False,
        horizontal_spacing=0.08,
    )
    k_text = f"κ = {float(kappa):g}"
    for col, m in enumerate(("precision", "recall"), start=1):
        x = table["n"].to_numpy()
        fig.add_trace(
            go.Scatter(
                x=x, y=as_array(table[m]), mode="lines+markers", name=f"mean {m}", line=dict(color=MEASURED_COLOR)
            ),
            row=1,
            col=col,
        )
        for side, color, dash in (("upper", UPPER_COLOR, "dot"), ("lower", LOWER_COLOR, "dash")):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=as_array(table[f"{m}_{side}"]),
                    mode="lines",
                    name=f"{side} envelope ({k_text})",
                    line=dict(color=color, dash=dash),
                    legendgroup=side,
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
    fig.update_layout(
        title=dict(text=f"Measured separability and the envelopes of Theorems 1–2 (Fig. 5), {k_text}"),
        template="plotly_white",
    )
    fig.update_xaxes(type="log", title_text=N_AXIS)
    fig.update_yaxes(title_text="mean (share, 0–1)", range=[-0.02, 1.02])
    return full_log_ticks(fig)
