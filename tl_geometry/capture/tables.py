"""Tidy tables from per-head results (definitions §6): one row per (seq, layer, head, query_pos, n)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from tl_geometry.capture.hooks import LayerBatch
from tl_geometry.errors import InputError

#: Key of a per-row table: one row per (sequence, layer, head, query position, selection size).
KEY_COLUMNS = ["seq", "layer", "head", "kv_head", "query_pos", "n"]
#: Key of a per-head table aggregated over sequences (the taxonomy features).
HEAD_KEY_COLUMNS = [c for c in KEY_COLUMNS if c != "seq"]
#: Text columns of the row tables (the ranking and the distance of a separability row, definitions §7).
TEXT_COLUMNS = ("rank_by", "distance")
#: Integer columns after the keys (random draws averaged in a separability row).
COUNT_COLUMNS = ("n_draws",)
#: The ranking of definitions §2, the one every single-ranking table, figure and summary reads.
REFERENCE_RANKING = "attention"


def attention_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a separability table ranked by attention (definitions §2), for the consumers
    that read one ranking (taxonomy, figures, report, summaries, bounds).

    A table without a ``rank_by`` column (one ranking) is returned as it is; a table with that
    column but no attention rows is an :class:`InputError`.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"rank_by": ["attention", "random"], "recall": [0.9, 0.4]})
    >>> attention_rows(t).recall.tolist()
    [0.9]
    """
    if "rank_by" not in table.columns:
        return table
    rows = table[table["rank_by"] == REFERENCE_RANKING]
    if rows.empty and len(table):
        found = sorted(table["rank_by"].unique().tolist())
        raise InputError(
            f"the separability table holds rank_by {found} only; this needs rank_by='attention' rows: "
            "analyse with rank_by including 'attention'"
        )
    return rows


def head_rows_table(
    batch: LayerBatch, query_pos: int, ns: Tensor, kv_head_of: Tensor, metrics: Mapping[str, Tensor | str | int]
) -> pd.DataFrame:
    """Long table of ``[batch, head, n]`` metrics of one layer and query position.

    Rows are ordered by sequence, then head, then ``n``; the key columns are
    :data:`KEY_COLUMNS`, followed by one column per entry of ``metrics`` (a ``[batch, head, n]``
    tensor, or a ``str`` or ``int`` that every row holds).
    """
    first = next(x for x in metrics.values() if isinstance(x, Tensor))
    b, h, n = first.shape
    cols: dict[str, Any] = {
        "seq": np.repeat(batch.seq_ids.cpu().numpy(), h * n),
        "layer": np.full(b * h * n, batch.layer, dtype=np.int64),
        "head": np.tile(np.repeat(np.arange(h), n), b),
        "kv_head": np.tile(np.repeat(kv_head_of.cpu().numpy(), n), b),
        "query_pos": np.full(b * h * n, query_pos, dtype=np.int64),
        "n": np.tile(ns.cpu().numpy(), b * h),
    }
    for name, values in metrics.items():
        cols[name] = values.reshape(-1).cpu().numpy() if isinstance(values, Tensor) else values
    return pd.DataFrame(cols)


def query_rows_table(
    seq_ids: Tensor,
    layer: int,
    query_positions: Iterable[int],
    ns: Tensor,
    valid: Tensor,
    kv_head_of: Tensor,
    metrics: Mapping[str, Tensor | str | int],
) -> pd.DataFrame:
    """Long table of ``[batch, head, query, n]`` metrics of one layer, each query with its own grid.

    The rows of :func:`head_rows_table` for every query position, ordered by sequence, head, query
    and ``n`` (the metrics' own layout, and the key order of the results: their final sort finds
    them in order); ``ns`` and ``valid`` (``[query, n]``) say which sizes each query has
    (:class:`tl_geometry.core.engine.query_engine.QueryRows`); a ``str`` or ``int`` in ``metrics`` is
    held by every row.

    Examples
    --------
    >>> import torch
    >>> m = {"recall": torch.arange(8.0).reshape(1, 2, 2, 2)}
    >>> ns, valid = torch.tensor([[1, 0], [1, 2]]), torch.tensor([[True, False], [True, True]])
    >>> t = query_rows_table(torch.tensor([7]), 3, [0, 1], ns, valid, torch.tensor([0, 0]), m)
    >>> t[["head", "query_pos", "n"]].values.tolist()
    [[0, 0, 1], [0, 1, 1], [0, 1, 2], [1, 0, 1], [1, 1, 1], [1, 1, 2]]
    >>> t.recall.tolist()
    [0.0, 2.0, 3.0, 4.0, 6.0, 7.0]
    """
    first = next(x for x in metrics.values() if isinstance(x, Tensor))
    b, h, q, n = first.shape
    shape = (b, h, q, n)
    keep = np.broadcast_to(valid.cpu().numpy()[None, None], shape).reshape(-1)

    def column(x: np.ndarray, axis: int) -> np.ndarray:
        index: list[slice | None] = [None] * 4
        index[axis] = slice(None)
        return np.broadcast_to(x[tuple(index)], shape).reshape(-1)[keep]

    cols: dict[str, Any] = {
        "seq": column(seq_ids.cpu().numpy().astype(np.int64), 0),
        "layer": np.full(int(keep.sum()), layer, dtype=np.int64),
        "head": column(np.arange(h, dtype=np.int64), 1),
        "kv_head": column(kv_head_of.cpu().numpy().astype(np.int64), 1),
        "query_pos": column(np.asarray(list(query_positions), dtype=np.int64), 2),
        "n": np.broadcast_to(ns.cpu().numpy().astype(np.int64)[None, None], shape).reshape(-1)[keep],
    }
    for name, values in metrics.items():
        cols[name] = values.reshape(-1).cpu().numpy()[keep] if isinstance(values, Tensor) else values
    # every column is a fresh array (selected by ``keep``): the table takes them as they are, without
    # copying them into one block per dtype (about half the time of building the table)
    return pd.DataFrame(cols, copy=False)


def empty_frame(columns: list[str], int_columns: Iterable[str] = ()) -> pd.DataFrame:
    """A table with no rows and ``columns`` in that order: int64 for ``int_columns`` (and ``n_draws``),
    text for ``rank_by`` and ``distance``, float64 for the rest.

    Examples
    --------
    >>> empty_frame(["layer", "beta"], int_columns=["layer"]).dtypes.astype(str).to_dict()
    {'layer': 'int64', 'beta': 'float64'}
    """
    ints = set(int_columns) | set(COUNT_COLUMNS)
    dtype = {c: "object" if c in TEXT_COLUMNS else "int64" if c in ints else "float64" for c in columns}
    return pd.DataFrame({c: pd.Series(dtype=dtype[c]) for c in columns})


def empty_table(float_columns: list[str]) -> pd.DataFrame:
    """An empty per-row table: the key columns (int64), then ``float_columns`` (float64)."""
    return empty_frame(KEY_COLUMNS + list(float_columns), int_columns=KEY_COLUMNS)


def check_heads(heads: Any, caller: str) -> pd.DataFrame:
    """``heads`` if it is a :func:`~tl_geometry.taxonomy.classify_heads` table with one row per (layer, head).

    Raises :class:`InputError` naming ``caller`` (a function name) otherwise.
    """
    if not isinstance(heads, pd.DataFrame) or {"layer", "head", "regime"} - set(heads.columns):
        raise InputError(
            f"{caller}() needs the table of tl_geometry.taxonomy.classify_heads(...) (layer, head, regime)"
        )
    if heads.duplicated(["layer", "head"]).any():
        raise InputError(f"{caller}(): the heads table has several rows per (layer, head); classify one query position")
    return heads


def select_query_pos(table: pd.DataFrame, query_pos: int | None, what: str = "table", hint: str = "") -> pd.DataFrame:
    """The rows of one query position: ``query_pos``, or the only one the table holds.

    Raises :class:`InputError` when ``query_pos`` is None but the table holds several positions
    (``hint`` is appended to that message), or when ``query_pos`` is not among them. A table
    without a ``query_pos`` column is returned as it is.
    """
    if "query_pos" not in table.columns:
        return table
    positions = sorted(table["query_pos"].unique().tolist())
    if query_pos is None:
        if len(positions) > 1:
            raise InputError(f"the {what} holds query positions {positions[:8]}; pass query_pos= one of them{hint}")
        return table
    if query_pos not in positions:
        raise InputError(f"query_pos={query_pos} is not in the {what} (it holds {positions[:8]})")
    return table[table["query_pos"] == query_pos]


def effect_frame(effects: Tensor, column: str) -> pd.DataFrame:
    """A ``[n_layers, n_heads]`` tensor as the tidy frame ``layer, head, <column>``."""
    if not isinstance(effects, Tensor) or effects.ndim != 2:
        raise InputError(f"per-head effects must be a [n_layers, n_heads] tensor, got {type(effects).__name__}")
    n_layers, n_heads = effects.shape
    values = effects.detach().double().cpu()
    return pd.DataFrame(
        {
            "layer": torch.arange(n_layers).repeat_interleave(n_heads).numpy(),
            "head": torch.arange(n_heads).repeat(n_layers).numpy(),
            column: values.reshape(-1).numpy(),
        }
    )
