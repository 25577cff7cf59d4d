"""Sums of a row table per group, streamed from parquet: every mean over rows without the rows in memory.

A *sums table* holds, per group of ``by`` (e.g. ``layer, head, kv_head, query_pos, rank_by, n``),
``n_rows`` and, for every numeric column ``c`` other than the keys and ``seq``, ``c`` (the sum of
its non-missing values) and ``c__count`` (how many there are). The mean of ``c`` over the rows of
any coarser grouping ``G`` is then exact (:func:`means_of_sums`)::

    mean_G(c) = sum_{g in G} c_g / sum_{g in G} c__count_g        rows_G = sum_{g in G} n_rows_g

as :meth:`pandas.DataFrame.groupby` ``.mean()`` gives it over the rows (missing values skipped),
to rounding. :func:`group_sums` reads a parquet file in record batches and merges their sums, so
its memory is that of one batch plus one row per group, whatever the number of windows.

Examples
--------
>>> import pandas as pd
>>> rows = pd.DataFrame({"seq": [0, 0, 1, 1], "n": [1, 2, 1, 2], "recall": [1.0, 0.5, 1.0, float("nan")]})
>>> sums = group_sums(rows, ["n"])
>>> sums[["n", "n_rows", "recall", "recall__count"]].values.tolist()
[[1.0, 2.0, 2.0, 2.0], [2.0, 2.0, 0.5, 1.0]]
>>> means_of_sums(sums, ["n"])[["n", "n_rows", "recall"]].values.tolist()
[[1.0, 2.0, 1.0], [2.0, 2.0, 0.5]]
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pandas as pd

#: Rows read per record batch when the rows are streamed from a parquet file (about 4 MiB of
#: separability rows; larger batches raise the allocators' high-water mark, not the speed).
BATCH_ROWS = 1 << 14
#: Suffix of the count columns of a sums table.
COUNT_SUFFIX = "__count"
#: The column of a sums table that counts its rows (and marks a table as a sums table).
ROWS_COLUMN = "n_rows"


def is_sums_table(table: pd.DataFrame) -> bool:
    """Whether ``table`` is a sums table (it has ``n_rows`` and no ``seq`` column) rather than rows."""
    return ROWS_COLUMN in table.columns and "seq" not in table.columns


def value_columns(table: pd.DataFrame, by: Sequence[str]) -> list[str]:
    """The numeric columns of a row table that are summed: all but ``by`` and ``seq``."""
    return [
        c
        for c in table.columns
        if c not in by
        and c != "seq"
        and pd.api.types.is_numeric_dtype(table[c])
        and not pd.api.types.is_bool_dtype(table[c])
    ]


def _batch_sums(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """The sums table of one batch of rows (groups in order of first appearance)."""
    values = value_columns(frame, by)
    grouped = frame.groupby(by, sort=False, observed=True, dropna=False)
    sums = grouped[values].sum(min_count=0).astype(np.float64)
    counts = grouped[values].count().astype(np.float64).add_suffix(COUNT_SUFFIX)
    sizes = grouped.size().astype(np.int64).rename(ROWS_COLUMN)
    return pd.concat([sizes, sums, counts], axis=1)


def _merge(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Partial sums of the same groups added up (a sum of sums: exact up to rounding)."""
    if len(parts) == 1:
        return parts[0]
    joined = pd.concat(parts)
    return joined.groupby(level=list(range(joined.index.nlevels)), sort=False, dropna=False).sum()


def group_sums(
    rows: pd.DataFrame | str | Path,
    by: Sequence[str],
    *,
    prepare: Callable[[pd.DataFrame], pd.DataFrame] | None = None,
    columns: Sequence[str] | None = None,
    batch_rows: int = BATCH_ROWS,
) -> pd.DataFrame:
    """The sums table of ``rows`` per group of ``by`` (see the module docstring).

    Parameters
    ----------
    rows : DataFrame, or the path of a parquet file
        The row table. A file is read ``batch_rows`` rows at a time and never whole: only the
        ``by`` columns, ``seq`` and the numeric columns, text read as dictionaries.
    by : sequence of str
        The group columns, present in ``rows``.
    prepare : callable, optional
        Applied to every batch of rows before it is summed (to add per-row columns, e.g. the
        indicators of :func:`tl_geometry.theory.observer.envelope_indicators`).
    columns : sequence of str, optional
        Read only these columns of a file (default: all).
    batch_rows : int, default 16384
        Rows per record batch of a file.

    Returns
    -------
    DataFrame
        One row per group of ``by`` (in order of first appearance): the ``by`` columns,
        ``n_rows`` (int64), then ``c`` and ``c__count`` for every summed column ``c`` (float64).
        ``attrs["n_seqs"]`` is the number of distinct ``seq`` values when ``rows`` has that column.
    """
    by = list(by)
    parts: list[pd.DataFrame] = []
    seqs: set[int] = set()
    for frame in _batches(rows, by, columns, batch_rows):
        if prepare is not None:
            frame = prepare(frame)
        if "seq" in frame.columns:
            seqs.update(frame["seq"].unique().tolist())
        if len(frame):
            parts.append(_batch_sums(frame, by))
        if len(parts) > 1:  # one running total: a batch's sums are as large as a window's rows
            parts = [_merge(parts)]
    if parts:
        out = _merge(parts).reset_index()
    else:
        out = pd.DataFrame(columns=[*by, ROWS_COLUMN])
    out.attrs["n_seqs"] = len(seqs)
    return out


def _batches(
    rows: pd.DataFrame | str | Path, by: list[str], columns: Sequence[str] | None, batch_rows: int
) -> Iterator[pd.DataFrame]:
    """The rows in record batches: a DataFrame as one batch, a parquet file ``batch_rows`` at a time."""
    if isinstance(rows, pd.DataFrame):
        yield rows if columns is None else rows[list(columns)]
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(rows)
    text = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    if columns is None:  # what is summed or grouped: text columns other than the groups are not
        columns = [f.name for f in schema if f.name in by or f.name == "seq" or f.name not in text]
    with pq.ParquetFile(rows, pre_buffer=False, read_dictionary=[c for c in text if c in columns]) as file:
        for batch in file.iter_batches(batch_size=batch_rows, columns=list(columns)):
            frame = batch.to_pandas()
            for name in text:  # dictionaries arrive as categoricals; the groups keep the file's text
                if name in frame.columns:
                    frame[name] = frame[name].astype(object)
            yield frame


def means_of_sums(sums: pd.DataFrame, by: Sequence[str], *, sort: bool = True) -> pd.DataFrame:
    """Per group of ``by`` (a subset of the sums table's groups): ``n_rows`` and the mean of every
    summed column over the rows of the group (missing values skipped; NaN where it has none).

    Parameters
    ----------
    sums : DataFrame
        A sums table (:func:`group_sums`).
    by : sequence of str
        Group columns of ``sums``; an empty sequence gives one row over everything.
    sort : bool, default True
        Sort the groups by ``by`` (as ``groupby``); False keeps their order of first appearance.
    """
    by = list(by)
    totals = [c for c in sums.columns if c.endswith(COUNT_SUFFIX)]
    values = [c[: -len(COUNT_SUFFIX)] for c in totals]
    if by:
        added = sums.groupby(by, sort=sort, observed=True, dropna=False)[[ROWS_COLUMN, *values, *totals]].sum()
    else:
        added = sums[[ROWS_COLUMN, *values, *totals]].sum().to_frame().T
    out = pd.DataFrame({ROWS_COLUMN: added[ROWS_COLUMN].astype(np.int64)})
    for value, total in zip(values, totals):
        count = added[total]
        out[value] = (added[value] / count.where(count > 0)).astype(np.float64)
    return out.reset_index() if by else out.reset_index(drop=True)


__all__ = [
    "BATCH_ROWS",
    "COUNT_SUFFIX",
    "ROWS_COLUMN",
    "group_sums",
    "is_sums_table",
    "means_of_sums",
    "value_columns",
]
