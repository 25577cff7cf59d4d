"""Rows in key order (io/row_order.py): the permutation of pandas' stable ``sort_values``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_geometry.io.row_order import PACKED_BITS, in_key_order

RANKINGS = ["attention", "random", "contribution"]


def by_pandas(rows: pd.DataFrame, key: list[str], rank_order: list[str]) -> pd.DataFrame:
    """The reference: ``sort_values`` with ``rank_by`` mapped to its place (unknown: NaN, last)."""
    order = {name: i for i, name in enumerate(rank_order)}
    return rows.sort_values(key, key=lambda c: c.map(order) if c.name == "rank_by" else c, kind="stable").reset_index(
        drop=True
    )


@st.composite
def tables(draw):
    n = draw(st.integers(0, 60))
    wide = draw(st.booleans())  # keys too wide to pack into one int64: numpy's lexsort instead
    high = 2**40 if wide else 4
    ints = st.integers(-high, high)
    rows = pd.DataFrame(
        {
            "seq": draw(st.lists(ints, min_size=n, max_size=n)),
            "layer": draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)),
            "rank_by": pd.array(draw(st.lists(st.sampled_from(RANKINGS), min_size=n, max_size=n)), dtype="string"),
            "n": draw(st.lists(ints, min_size=n, max_size=n)),
            "value": np.arange(n, dtype=np.float64),  # tells tied rows apart
        }
    )
    if draw(st.booleans()):  # already in order: returned as it is
        rows = by_pandas(rows, ["seq", "layer", "rank_by", "n"], RANKINGS)
    rank_order = draw(st.sampled_from([RANKINGS, RANKINGS[:2], RANKINGS[::-1]]))
    return rows, rank_order


@settings(max_examples=200, deadline=None)
@given(tables())
def test_in_key_order_is_pandas_stable_sort(table) -> None:
    """Duplicated keys, negative and 2^40-wide values, rankings missing from the order: the same rows
    in the same order as ``sort_values(kind="stable")``."""
    rows, rank_order = table
    key = ["seq", "layer", "rank_by", "n"]
    pd.testing.assert_frame_equal(in_key_order(rows, key, rank_order), by_pandas(rows, key, rank_order))


def test_keys_too_wide_to_pack_are_sorted_by_lexsort() -> None:
    """Three keys of 2^21 values each need 63 bits: more than one packed int64 holds."""
    rng = np.random.default_rng(0)
    values = [rng.integers(0, 2**21, size=500) for _ in range(3)]
    values[0][0], values[1][0], values[2][0] = 2**21 - 1, 2**21 - 1, 2**21 - 1
    assert sum(int(v.max() - v.min()).bit_length() for v in values) > PACKED_BITS
    rows = pd.DataFrame({"a": values[0], "b": values[1], "c": values[2], "rank_by": "attention"})
    key = ["a", "b", "c", "rank_by"]
    pd.testing.assert_frame_equal(in_key_order(rows, key, ["attention"]), by_pandas(rows, key, ["attention"]))


def test_a_key_of_floats_is_refused() -> None:
    rows = pd.DataFrame({"seq": [1.0, 0.0], "rank_by": ["attention", "attention"]})
    with pytest.raises(TypeError, match="must hold integers"):
        in_key_order(rows, ["seq", "rank_by"], ["attention"])
