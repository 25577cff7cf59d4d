"""Figures of selection under competition (definitions §9): context scaling and the supporting fact.

:func:`n_star_by_context` (``N*`` and ``N*/L`` against ``L``, log-log), :func:`fact_attention`
(the fact's mass and rank against background ``m``: median and quartiles over heads, one head
selectable) and :func:`fact_loss` (the answer's loss against ``m`` for several ``N``).

Examples
--------
>>> import pandas as pd
>>> table = pd.DataFrame({"context": [128, 256], "rank_by": "attention", "renormalize": False,
...                       "n_star": pd.array([16, 32], dtype="Int64"), "n_star_over_context": [0.125, 0.125]})
>>> [t.name for t in n_star_by_context(table).data]
['attention (deletion)', 'attention (deletion)']
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tl_geometry.errors import InputError
from tl_geometry.plot.base import as_array, full_log_ticks
from tl_geometry.plot.rankings import RANKING_COLORS


def _label(rank_by: str, renorm: bool) -> str:
    return f"{rank_by} ({'renormalised' if renorm else 'deletion'})"


def n_star_by_context(table: pd.DataFrame) -> go.Figure:
    """``N*_tau(L)`` (left) and ``N*_tau(L) / L`` (right) against ``L``, log-log, per ranking and renormalisation.

    Parameters
    ----------
    table : the table of :func:`tl_geometry.context_scaling` (columns ``context``, ``rank_by``,
        ``renormalize``, ``n_star``, ``n_star_over_context``, and ``n_max``). A context where no size
        passes (censored ``N*``) is drawn as an open marker at ``n_max``, labelled "> n_max".
    """
    needed = {"context", "rank_by", "renormalize", "n_star", "n_star_over_context"}
    if not isinstance(table, pd.DataFrame) or not needed <= set(table.columns) or table.empty:
        raise InputError("this figure needs the table of tlg.context_scaling(model, corpus)")
    points = table.drop_duplicates(["context", "rank_by", "renormalize"])
    fig = make_subplots(rows=1, cols=2, subplot_titles=("N*_tau against L", "N*_tau / L against L"))
    for (rank_by, renorm), group in points.groupby(["rank_by", "renormalize"], sort=False):
        group = group.sort_values("context")
        censored = group.n_star.isna().to_numpy()
        # a censored N* (no size passed) is drawn open at the largest size measured: "> n_max"
        n_max = group["n_max"] if "n_max" in group else pd.Series(pd.NA, index=group.index)
        stars = [float(m) if c else float(s) for s, c, m in zip(group.n_star, censored, n_max)]
        keep = [not (c and pd.isna(m)) for c, m in zip(censored, n_max)]  # an older table has no n_max
        x = [int(L) for L, k in zip(group.context, keep) if k]
        style = dict(color=RANKING_COLORS.get(rank_by, "#000000"), dash="dot" if renorm else "solid")
        marker = dict(symbol=["circle-open" if c else "circle" for c, k in zip(censored, keep) if k], size=9)
        text = [f"> {int(m)}" if c else "" for c, m, k in zip(censored, n_max, keep) if k]
        for col, values in ((1, stars), (2, [v / L for v, L in zip(stars, group.context)])):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[v for v, k in zip(values, keep) if k],
                    mode="lines+markers+text",
                    text=text,
                    textposition="top center",
                    marker=marker,
                    line=style,
                    name=_label(rank_by, bool(renorm)),
                    legendgroup=_label(rank_by, bool(renorm)),
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(type="log", title_text="context L (tokens)")
    fig.update_yaxes(type="log", title_text="N*", row=1, col=1)
    fig.update_yaxes(type="log", title_text="N* / L", row=1, col=2)
    fig.update_layout(
        title=dict(text="Context scaling: the same targets from longer contexts"), template="plotly_white"
    )
    return full_log_ticks(fig)


def _fact_result(result: Any) -> Any:
    if not hasattr(result, "heads") or not hasattr(result, "loss"):
        raise InputError("this figure needs the result of tlg.supporting_fact(model)")
    return result


def fact_attention(result: Any, head: tuple[int, int] | None = None) -> go.Figure:
    """The fact's attention mass (left) and best rank (right, log) at the answer query against background ``m``.

    Per ``m``, each head's value is its median over the facts; the line is the median over heads,
    the band their quartiles.

    Parameters
    ----------
    result : a :class:`tl_geometry.competition.SupportingFact`.
    head : ``(layer, head)`` to draw as its own line (its median over facts), or None.
    """
    heads = _fact_result(result).heads
    per_head = heads.groupby(["amount", "layer", "head"], as_index=False)[["mass", "best_rank"]].median()
    if head is not None:
        layer, h = head
        if not ((per_head.layer == layer) & (per_head["head"] == h)).any():
            raise InputError(f"head {head} is not a (layer, head) of this result")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("fact mass", "fact best rank"))
    for col, metric in ((1, "mass"), (2, "best_rank")):
        q = per_head.groupby("amount")[metric].quantile([0.25, 0.5, 0.75]).unstack()
        x = as_array(q.index)
        fig.add_trace(
            go.Scatter(x=x, y=as_array(q[0.75]), mode="lines", line=dict(width=0), showlegend=False, name="q75"),
            row=1,
            col=col,
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=as_array(q[0.25]),
                mode="lines",
                line=dict(width=0),
                fill="tonexty",
                fillcolor="rgba(0,114,178,0.2)",
                name="quartiles over heads",
                showlegend=col == 1,
            ),
            row=1,
            col=col,
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=as_array(q[0.5]),
                mode="lines+markers",
                line=dict(color="#0072B2"),
                name="median over heads",
                showlegend=col == 1,
            ),
            row=1,
            col=col,
        )
        if head is not None:
            one = per_head[(per_head.layer == head[0]) & (per_head["head"] == head[1])].sort_values("amount")
            fig.add_trace(
                go.Scatter(
                    x=as_array(one.amount),
                    y=as_array(one[metric]),
                    mode="lines+markers",
                    line=dict(color="#D55E00"),
                    name=f"L{head[0]}H{head[1]}",
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="background m (tokens)")
    fig.update_yaxes(title_text="mass of the fact's tokens", row=1, col=1)
    top = max(float(per_head.best_rank.max()), 2.0)
    fig.update_yaxes(  # ranks start at 1: the axis too (log10(1) = 0)
        title_text="best rank (1 = highest weight)", type="log", range=[0, np.log10(top) + 0.05], row=1, col=2
    )
    fig.update_layout(title=dict(text="A supporting fact under competition"), template="plotly_white")
    return full_log_ticks(fig)


def fact_loss(result: Any) -> go.Figure:
    """The answer's NLL (mean over facts) against background ``m``: full attention and each top-``N``."""
    loss = _fact_result(result).loss
    if loss.empty:
        raise InputError("the supporting-fact result holds no loss rows: pass ns=(...) to tlg.supporting_fact")
    fig = go.Figure()
    full = loss.drop_duplicates(["amount", "fact_id"]).groupby("amount").nll_full.mean()
    fig.add_trace(
        go.Scatter(
            x=as_array(full.index),
            y=as_array(full),
            mode="lines+markers",
            name="full attention",
            line=dict(color="#000"),
        )
    )
    for n, group in loss.groupby("n"):
        mean = group.groupby("amount").nll.mean()
        fig.add_trace(go.Scatter(x=as_array(mean.index), y=as_array(mean), mode="lines+markers", name=f"top-{n}"))
    fig.update_layout(
        title=dict(text="Answer loss against background"),
        template="plotly_white",
        xaxis_title="background m (tokens)",
        yaxis_title="answer NLL (nats, mean over facts)",
    )
    return fig


CONDITION_COLORS = {"neutral": "#0072B2", "competitors": "#D55E00"}


def _retrieval(result: Any) -> Any:
    if not all(hasattr(result, name) for name in ("heads", "answers", "summary", "n_star")):
        raise InputError("this figure needs the result of tlg.competition.retrieval_under_competition(model)")
    return result


def retrieval_n_star(result: Any, tolerance: float | None = None) -> go.Figure:
    """``N*`` against background ``m`` per condition (left) and full-attention accuracy with 95 % Wilson
    intervals (right). A censored ``N*`` (no size within the tolerance) is drawn as an open marker at
    the largest size tried, labelled "> max"; it is never left out."""
    stars = _retrieval(result).n_star(tolerance)
    summary = result.summary().drop_duplicates(["condition", "amount"])
    fig = make_subplots(rows=1, cols=2, subplot_titles=("N* against background", "accuracy under full attention"))
    for condition, group in stars.groupby("condition", sort=False):
        group = group.sort_values("amount")
        color = CONDITION_COLORS.get(str(condition), "#000000")
        y = [int(r.n_max) if r.censored else int(r.n_star) for r in group.itertuples()]
        symbols = ["circle-open" if c else "circle" for c in group.censored]
        fig.add_trace(
            go.Scatter(
                x=as_array(group.amount),
                y=y,
                mode="lines+markers+text",
                text=[t if c else "" for t, c in zip(group.n_star_text, group.censored)],
                textposition="top center",
                marker=dict(symbol=symbols, size=10, color=color),
                line=dict(color=color),
                name=str(condition),
                legendgroup=str(condition),
            ),
            row=1,
            col=1,
        )
        acc = summary[summary.condition == condition].sort_values("amount")
        fig.add_trace(
            go.Scatter(
                x=as_array(acc.amount),
                y=as_array(acc.accuracy_full),
                error_y=dict(
                    type="data",
                    symmetric=False,
                    array=as_array(acc.accuracy_full_high - acc.accuracy_full),
                    arrayminus=as_array(acc.accuracy_full - acc.accuracy_full_low),
                ),
                mode="lines+markers",
                line=dict(color=color),
                name=str(condition),
                legendgroup=str(condition),
                showlegend=False,
            ),
            row=1,
            col=2,
        )
    fig.update_xaxes(title_text="background m (tokens)")
    fig.update_yaxes(type="log", title_text="N* (open: censored, > max)", row=1, col=1)
    fig.update_yaxes(title_text="candidate accuracy", range=[0, 1.05], row=1, col=2)
    fig.update_layout(title=dict(text="Retrieval under competition"), template="plotly_white")
    return fig


def retrieval_loss(result: Any) -> go.Figure:
    """The mean answer-loss increase over full attention (nats) against ``N``, one line per condition and ``m``."""
    summary = _retrieval(result).summary()
    fig = go.Figure()
    for (condition, amount), group in summary.groupby(["condition", "amount"], sort=False):
        group = group.sort_values("n")
        fig.add_trace(
            go.Scatter(
                x=as_array(group.n),
                y=as_array(group.delta_loss),
                mode="lines+markers",
                line=dict(color=CONDITION_COLORS.get(str(condition), "#000000"), dash="dot" if amount else "solid"),
                name=f"{condition}, m = {amount}",
            )
        )
    fig.update_layout(
        title=dict(text="Answer-loss increase of top-N selection"),
        template="plotly_white",
        xaxis=dict(type="log", title="N (keys kept per query)"),
        yaxis_title="mean answer loss - full attention's (nats)",
    )
    return fig


def retrieval_support(result: Any) -> go.Figure:
    """The support keys at the answer query against ``m``: mass, rank displacement (log), recall among the
    top keys, pairwise outrank probability (means over examples, layers and heads), per condition."""
    support = _retrieval(result).support()
    names = ("mass", "rank_displacement", "recall_at_top", "pairwise_outrank")
    fig = make_subplots(rows=1, cols=4, subplot_titles=("mass", "rank displacement", "recall@top", "P(outranked)"))
    for condition, group in support.groupby("condition", sort=False):
        group = group.sort_values("amount")
        for col, name in enumerate(names, start=1):
            fig.add_trace(
                go.Scatter(
                    x=as_array(group.amount),
                    y=as_array(group[name]),
                    mode="lines+markers",
                    line=dict(color=CONDITION_COLORS.get(str(condition), "#000000")),
                    name=str(condition),
                    legendgroup=str(condition),
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="background m (tokens)")
    fig.update_layout(title=dict(text="Support keys at the answer query"), template="plotly_white")
    return fig


__all__ = [
    "CONDITION_COLORS",
    "fact_attention",
    "fact_loss",
    "n_star_by_context",
    "retrieval_loss",
    "retrieval_n_star",
    "retrieval_support",
]
