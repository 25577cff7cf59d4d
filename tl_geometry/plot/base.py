"""What every figure function shares: its table looked up with a clear error, one query position, the layout."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tl_geometry.capture.tables import attention_rows, select_query_pos
from tl_geometry.errors import InputError
from tl_geometry.io.row_sums import group_sums, is_sums_table
from tl_geometry.theory.observer import ENVELOPE_INPUTS, envelope_indicators

#: How to obtain each optional table, for the error messages.
DIAGNOSTICS = "run tlg.analyze(..., diagnostics=True)"
BOUNDS = "run tlg.analyze(..., bounds=True)"
TAXONOMY = (
    "run tlg.analyze(..., taxonomy=True) (its result holds `regime_features`), or pass the features table of a "
    "tl_geometry.taxonomy.TaxonomyObserver (observer.features())"
)

#: Axis title used by several figures.
N_AXIS = "selection size N (keys, log scale)"


def get_table(obj: Any, name: str, how: str, figure: str, columns: Iterable[str] = ()) -> pd.DataFrame:
    """``obj`` itself when it is a DataFrame, else ``obj.<name>``; checked for ``columns`` and rows.

    Raises :class:`InputError` naming the figure, the missing table or columns, and ``how`` to
    produce them.
    """
    table = obj if isinstance(obj, pd.DataFrame) else getattr(obj, name, None)
    if not isinstance(table, pd.DataFrame):
        raise InputError(f"{figure}() needs the `{name}` table, which {type(obj).__name__} does not hold: {how}")
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise InputError(f"{figure}() needs the columns {missing} of the `{name}` table, which lacks them: {how}")
    if table.empty:
        raise InputError(f"{figure}(): the `{name}` table has no rows (nothing was analysed)")
    return attention_rows(table) if name == "separability" else table


#: The groups of a separability sums table (every key of a row but the window).
SUM_GROUPS = ["layer", "head", "kv_head", "query_pos", "rank_by", "n"]


def separability_sums(
    obj: Any, how: str, figure: str, columns: Iterable[str] = (), *, attention: bool = True
) -> pd.DataFrame:
    """The separability rows of ``obj`` summed per (layer, head, kv_head, query_pos, rank_by, n).

    ``obj`` is a result (its :meth:`~tl_geometry.pipeline.result.AnalysisResult.separability_sums`:
    rows on disk are read in batches, never whole), a separability table, or a sums table
    (:func:`tl_geometry.io.row_sums.group_sums`). Checked for ``columns`` and rows as
    :func:`get_table`; only the attention rows when ``attention``.
    """
    if isinstance(obj, pd.DataFrame):
        table = obj
        if not is_sums_table(table):
            missing = [c for c in columns if c not in table.columns]
            if missing:
                raise InputError(
                    f"{figure}() needs the columns {missing} of the `separability` table, which lacks them: {how}"
                )
            prepare = envelope_indicators if set(ENVELOPE_INPUTS) <= set(table.columns) else None
            table = group_sums(table, [c for c in SUM_GROUPS if c in table.columns], prepare=prepare)
    elif callable(getattr(obj, "separability_sums", None)):
        table = obj.separability_sums()
    else:
        raise InputError(f"{figure}() needs the `separability` table, which {type(obj).__name__} does not hold: {how}")
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise InputError(f"{figure}() needs the columns {missing} of the `separability` table, which lacks them: {how}")
    if table.empty:
        raise InputError(f"{figure}(): the `separability` table has no rows (nothing was analysed)")
    return attention_rows(table) if attention else table


def select_query(table: pd.DataFrame, query_pos: int | None, figure: str) -> pd.DataFrame:
    """Rows of ``query_pos`` (None: every row). Unknown positions are an :class:`InputError`."""
    return table if query_pos is None else select_query_pos(table, query_pos, f"table of {figure}()")


def one_query(table: pd.DataFrame, query_pos: int | None, figure: str) -> pd.DataFrame:
    """Like :func:`select_query`, but a table with several query positions needs ``query_pos``."""
    hint = " (curves over N of rows with different K are not averaged together)"
    return select_query_pos(table, query_pos, f"table of {figure}()", hint)


def as_array(x: Any) -> np.ndarray:
    """A float64 numpy array (what the traces hold, so tests can compare exactly)."""
    return np.asarray(x, dtype=np.float64)


def base_layout(
    fig: go.Figure, title: str, x_title: str, y_title: str, *, log_x: bool = False, log_y: bool = False
) -> go.Figure:
    """Title, axis titles and axis types of a single-panel figure."""
    fig.update_layout(title=dict(text=title), template="plotly_white", legend=dict(title=None))
    fig.update_xaxes(title_text=x_title, type="log" if log_x else "linear")
    fig.update_yaxes(title_text=y_title, type="log" if log_y else "linear")
    return full_log_ticks(fig) if log_x or log_y else fig


def log_tick_values(low: float, high: float, most: int = 12) -> list[float]:
    """Tick values of a log axis over ``[low, high]`` (both > 0): the 1-2-5 series, or the powers
    of ten where that gives more than ``most`` ticks; at least the two ends' neighbours.

    >>> log_tick_values(1, 64), log_tick_values(0.03, 0.3)
    ([1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0], [0.02, 0.05, 0.1, 0.2, 0.5])
    """
    first, last = int(np.floor(np.log10(low))), int(np.ceil(np.log10(high)))
    for steps in ((1, 2, 5), (1,)):
        values = [float(f"{m}e{e}") for e in range(first, last + 1) for m in steps]
        below = [v for v in values if v <= low][-1:]  # the tick at or below the lowest value
        above = [v for v in values if v >= high][:1]
        values = below + [v for v in values if low < v < high] + above
        if len(values) <= most or steps == (1,):
            return values
    return values  # pragma: no cover - the loop returns


def full_log_ticks(fig: go.Figure) -> go.Figure:
    """Label every log axis of ``fig`` with whole numbers ("20", "0.05"), not plotly's minor digits.

    plotly labels the ticks between decades of a log axis with their first digit only ("2" for
    20); here each log axis gets :func:`log_tick_values` over the data of its traces, written out.
    """
    layout = fig.to_plotly_json()["layout"]
    for name, axis in layout.items():
        if not (name.startswith(("xaxis", "yaxis")) and isinstance(axis, dict) and axis.get("type") == "log"):
            continue
        letter, suffix = name[0], name[5:]
        ref = letter + suffix  # "x", "x2", ...
        values: list[float] = []
        for trace in fig.data:
            if (getattr(trace, f"{letter}axis", None) or letter) != ref:
                continue
            data = getattr(trace, letter, None)
            if data is not None:
                values += [float(v) for v in np.asarray(data, dtype=object).ravel() if _positive(v)]
        span = axis.get("range")  # a range set in log10 units bounds the ticks too
        if span is not None and None not in span:
            values += [10.0 ** span[0] * 1.0001, 10.0 ** span[1] / 1.0001]
        if not values:
            continue
        ticks = log_tick_values(min(values), max(values))
        fig.layout[name].update(tickvals=ticks, ticktext=[f"{v:g}" for v in ticks])
    return fig


def _positive(value: Any) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return bool(np.isfinite(number) and number > 0)
