"""Rows in key order: a stable sort of a table by integer key columns and a ranking column.

What ``rows.sort_values(key, kind="stable")`` gives with ``rank_by`` read in the settings' order
(rankings not among them last), without its costs on millions of rows (every query position):
a table already in order is returned as it is, and otherwise the keys, shifted to start at 0, are
packed into one int64 where their ranges fit in 62 bits, so one stable integer sort orders the
rows (``numpy.lexsort`` of the keys where they do not). Tuples compare as their packed integers
do, so the permutation is the same.

Example
-------
>>> import pandas as pd
>>> rows = pd.DataFrame({"seq": [1, 0, 0], "rank_by": ["attention", "random", "attention"], "x": [1.0, 2.0, 3.0]})
>>> in_key_order(rows, ["seq", "rank_by"], ["attention", "random"])["x"].tolist()
[3.0, 2.0, 1.0]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

#: The most bits the packed key may take (one int64, non-negative, with room to spare).
PACKED_BITS = 62


def in_key_order(rows: pd.DataFrame, key: Sequence[str], rank_order: Sequence[str]) -> pd.DataFrame:
    """``rows`` stably sorted by the columns ``key``, with a fresh index.

    Parameters
    ----------
    rows : DataFrame
        The table; every column of ``key`` but ``rank_by`` holds integers.
    key : sequence of str
        The columns to sort by, most significant first.
    rank_order : sequence of str
        The order of the values of ``rank_by`` (a value not listed sorts after them all, as a
        missing one does in ``sort_values``).

    Returns
    -------
    DataFrame
        The rows in key order, ties in their given order (``rows`` itself, re-indexed, when it is
        in order already).
    """
    if len(rows) < 2:
        return rows.reset_index(drop=True)
    codes = [_rank_codes(rows[name], rank_order) if name == "rank_by" else _integers(rows[name]) for name in key]
    if _is_sorted(codes):
        return rows.reset_index(drop=True)
    packed = _packed(codes)
    order = np.argsort(packed, kind="stable") if packed is not None else np.lexsort(codes[::-1])
    return rows.take(order).reset_index(drop=True)


def _rank_codes(column: pd.Series, rank_order: Sequence[str]) -> np.ndarray:
    """Each ranking's place in ``rank_order`` (``len(rank_order)`` for the others), int64."""
    codes, uniques = pd.factorize(column)  # a missing value: code -1, the place appended last
    places = {name: i for i, name in enumerate(rank_order)}
    place = [places.get(name, len(rank_order)) for name in uniques] + [len(rank_order)]
    return np.asarray(place, dtype=np.int64)[codes]


def _integers(column: pd.Series) -> np.ndarray:
    values = column.to_numpy()
    if not np.issubdtype(values.dtype, np.integer):
        raise TypeError(f"key column {column.name!r} must hold integers, not {values.dtype}")
    return values.astype(np.int64, copy=False)


def _is_sorted(codes: list[np.ndarray]) -> bool:
    """Whether consecutive rows never step back in the lexicographic order of ``codes``."""
    decided = np.zeros(codes[0].shape[0] - 1, dtype=np.bool_)  # an earlier key already rose
    for values in codes:
        earlier, later = values[:-1], values[1:]
        if bool(((later < earlier) & ~decided).any()):
            return False
        decided |= later > earlier
    return True


def _packed(codes: list[np.ndarray]) -> np.ndarray | None:
    """The keys as one int64 per row, most significant first, or None where they need more bits."""
    lowest = [int(values.min()) for values in codes]
    widths = [(int(values.max()) - low).bit_length() for values, low in zip(codes, lowest)]
    if sum(widths) > PACKED_BITS:
        return None
    packed = np.zeros(codes[0].shape[0], dtype=np.int64)
    for values, low, width in zip(codes, lowest, widths):
        packed = (packed << width) | (values - low)
    return packed


__all__ = ["PACKED_BITS", "in_key_order"]
