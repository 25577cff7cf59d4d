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
    return fig
