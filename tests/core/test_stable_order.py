"""The selection order from numpy's vectorised sort: the stable descending order, ties included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_geometry.core import stable_order
from tl_geometry.core.rankings import selection_order

pytestmark = pytest.mark.skipif(not stable_order.AVAILABLE, reason="numba is not installed")

# few distinct values, so that most rows have ties, runs of ties and signed zeros
TIE_PRONE = [0.0, -0.0, 0.25, 0.5, 1.0, -1.0, 1e-300, np.inf, -np.inf]


def order_by_hand(row: list[float]) -> list[int]:
    """Keys by score, highest first, ties to the lower index (Python compares -0.0 == 0.0)."""
    return sorted(range(len(row)), key=lambda i: (-row[i], i))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=0, max_size=2),
    st.integers(1, 70),
    st.sampled_from([torch.float32, torch.float64]),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_selection_order_equals_the_order_by_hand(batch, n_keys, dtype, tie_prone, seed):
    rng = np.random.default_rng(seed)
    shape = (*batch, n_keys)
    if tie_prone:
        array = rng.choice(TIE_PRONE, size=shape)
    else:
        array = rng.normal(size=shape) * rng.choice([1e-30, 1.0, 1e30], size=shape)
    scores = torch.from_numpy(array).to(dtype)
    order = selection_order(scores)
    rows = scores.double().reshape(-1, n_keys).tolist()
    assert order.dtype == torch.int64 and order.shape == scores.shape
    assert order.reshape(-1, n_keys).tolist() == [order_by_hand(row) for row in rows]
    assert torch.equal(order, torch.argsort(scores, dim=-1, descending=True, stable=True))


def test_long_runs_of_ties_and_padding_keep_key_order():
    # a row of the query engine: real keys with underflowed (zero) weights, then -inf padding
    scores = torch.cat([torch.tensor([0.5, 0.0, 0.25]), torch.zeros(200), torch.full((300,), -torch.inf)])
    order = selection_order(torch.stack([scores, scores.flip(0)]))
    assert order[0].tolist() == [0, 2, 1, *range(3, 503)]
    assert order[1].tolist() == [502, 500, *range(300, 500), 501, *range(300)]


def test_nan_scores_and_other_dtypes_go_to_torch_sort():
    with_nan = torch.tensor([[1.0, float("nan"), 2.0, 1.0]])
    assert torch.equal(selection_order(with_nan), torch.argsort(with_nan, dim=-1, descending=True, stable=True))
    half = torch.tensor([[0.5, 0.5, 1.0]], dtype=torch.bfloat16)
    assert selection_order(half).tolist() == [[2, 0, 1]]
    assert selection_order(torch.empty(3, 0)).shape == (3, 0)
    assert selection_order(torch.empty(0, 4)).shape == (0, 4)


def test_strided_scores_are_sorted_as_their_values():
    scores = torch.tensor([[0.1, 0.4], [0.4, 0.1], [0.4, 0.4]]).t()  # not contiguous
    assert selection_order(scores).tolist() == [[1, 2, 0], [0, 2, 1]]
    assert selection_order(torch.tensor([0.5, 0.5]).expand(3, 2)).tolist() == [[0, 1]] * 3


# float32 numbers only: signed zeros, infinities, subnormals, negatives and many ties
FLOAT32_TIE_PRONE = [0.0, -0.0, 0.25, 0.5, -0.5, 1.0, 2.0**-149, 2.0**-126, np.inf, -np.inf, 3.4e38]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 70), st.booleans(), st.integers(0, 2**32 - 1))
def test_float32_keys_give_the_order_by_hand(n_rows, n_keys, tie_prone, seed):
    """One sort of the 64-bit keys: scores descending, ties (``-0.0`` and ``0.0`` too) to the lower key."""
    rng = np.random.default_rng(seed)
    if tie_prone:
        array = rng.choice(np.array(FLOAT32_TIE_PRONE, dtype=np.float32), size=(n_rows, n_keys)).astype(np.float64)
    else:  # float64 scores that are float32 numbers, as a float32 model's weights
        array = rng.normal(size=(n_rows, n_keys)).astype(np.float32).astype(np.float64)
    order = stable_order.float32_key_order(array)
    assert order is not None and order.dtype == np.int64
    assert order.tolist() == [order_by_hand(row) for row in array.tolist()]


@pytest.mark.parametrize("odd", [0.1, 1e-300, 2.0**-150, np.nan, 1e39])
def test_scores_that_are_no_float32_go_to_the_argsort(odd):
    """A float64 score that float32 cannot hold (rounded, underflowed, NaN, overflowed) makes the keys
    decline; ``stable_descending`` then sorts the scores themselves, to the same order."""
    row = np.array([[0.5, odd, 0.5, 0.25]])
    assert stable_order.float32_key_order(row) is None
    if np.isnan(odd):  # no order here: selection_order leaves it to torch
        assert stable_order.stable_descending(row) is None
    else:
        assert stable_order.stable_descending(row).tolist() == [order_by_hand(row[0].tolist())]
