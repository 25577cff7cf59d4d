"""Separability under each ranking against the random control (definitions §7), by ``N``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tl_geometry.errors import InputError
from tl_geometry.io.row_sums import means_of_sums
from tl_geometry.plot.base import N_AXIS, as_array, full_log_ticks, select_query, separability_sums

if TYPE_CHECKING:
    from tl_geometry.pipeline.result import AnalysisResult

_METRICS = ("precision", "recall", "f_at_rmax", "f_at_rmin")
#: One colour per ranking (the random control grey, as a baseline).
RANKING_COLORS = {"attention": "#1f77b4", "contribution": "#d62728", "random": "#7f7f7f", "sink_window": "#2ca02c"}


def separability_by_ranking(
    result: AnalysisResult | pd.DataFrame,
    metrics: Sequence[str] = ("precision", "recall", "f_at_rmax"),
    *,
    query_pos: int | None = None,
) -> go.Figure:
    """Mean precision, recall and F of each ranking against ``N``, log x, one panel per metric.

    Parameters
    ----------
    result : AnalysisResult or DataFrame
        A result of ``tlg.analyze(..., rank_by=("attention", "random", ...))`` or its ``separability``
        table (with its ``rank_by`` column).
    metrics : columns to draw, default ``("precision", "recall", "f_at_rmax")``; also ``"f_at_rmin"``.
    query_pos : int, optional
        Use only the rows of this query position (default: every row).

    Returns
    -------
    plotly.graph_objects.Figure
        One panel per metric, one trace per ranking named after it; ``y`` at each ``N`` is the mean
        of the metric over every row of that ranking and ``N`` (sequences, layers, heads, query
        positions; a random row is already the mean of its draws).

    Notes
    -----
    Precision and recall of attention selection mean something only next to the random control
    (definitions §7): at ``N = 1`` the Euclidean F is 1 for any selection, so read the gap between
    the attention (or contribution) curve and the grey random curve.

    Examples
    --------
    >>> import pandas as pd
    >>> table = pd.DataFrame({"rank_by": ["attention", "attention", "random", "random"], "n": [1, 2, 1, 2],
    ...                       "precision": [1.0, 0.9, 1.0, 0.5], "recall": [1.0, 0.8, 1.0, 0.4],
    ...                       "f_at_rmax": [1.0, 0.95, 1.0, 0.67]})
    >>> fig = separability_by_ranking(table, ["precision"])
    >>> [(t.name, t.y.tolist()) for t in fig.data]
    [('attention', [1.0, 0.9]), ('random', [1.0, 0.5])]
    """
    sep = _table(result)
    bad = [m for m in metrics if m not in _METRICS]
    if bad or not metrics:
        raise InputError(f"separability_by_ranking(): unknown metrics {bad}; choose from {list(_METRICS)}")
    missing = [c for c in ["rank_by", "n", *metrics] if c not in sep.columns]
    if missing:
        raise InputError(
            f"separability_by_ranking() needs the columns {missing}: run tlg.analyze(..., rank_by=('attention', 'random'))"
        )
    sep = select_query(sep, query_pos, "separability_by_ranking")
    rankings = list(dict.fromkeys(sep["rank_by"]))
    mean = means_of_sums(sep, ["rank_by", "n"]).set_index(["rank_by", "n"])
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=list(metrics), shared_yaxes=True)
    for col, metric in enumerate(metrics, start=1):
        for name in rankings:
            curve = mean.loc[name, metric]
            fig.add_trace(
                go.Scatter(
                    x=curve.index.to_numpy(),
                    y=as_array(curve),
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    line=dict(color=RANKING_COLORS.get(name)),
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text=N_AXIS, type="log", row=1, col=col)
    fig.update_yaxes(title_text="mean over sequences, layers and heads (share, 0–1)", row=1, col=1)
    title = f"Selection by ranking against the random control: mean per N over {int(sep['n_rows'].sum())} rows"
    fig.update_layout(title=dict(text=title), template="plotly_white", legend=dict(title=None))
    return full_log_ticks(fig)


def _table(result: Any) -> pd.DataFrame:
    """The sums of the separability rows of every ranking (rows on disk are read in batches)."""
    try:
        return separability_sums(result, "run tlg.analyze(...)", "separability_by_ranking", attention=False)
    except InputError:
        raise InputError("separability_by_ranking() needs the separability table of tlg.analyze(...)") from None
