"""Invariants of separability (hypothesis): rotation, uniform scale, N = K, batch composition.

Rows are generated from seeds (continuous random values) with hypothesis choosing the structure:
row length, dimension, sink strength, tied weights. Exact geometric ties between *different*
vectors would make counts depend on the last bit of a rounding, so the strategies avoid them.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tl_geometry as tlg

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def rows(draw, max_rows: int = 4, max_k: int = 30):
    n_rows = draw(st.integers(1, max_rows))
    k = draw(st.integers(1, max_k))
    d = draw(st.integers(1, 8))
    sink = draw(st.floats(0.0, 10.0))
    tied = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n_rows, k, d, generator=g, dtype=torch.float64)
    logits = torch.randn(n_rows, k, generator=g, dtype=torch.float64)
    logits[:, 0] += sink
    weights = torch.softmax(logits, -1)
    if tied:  # equal weights on a block of keys: ties resolved by key index
        weights[:, 1:4] = weights[:, 1:2]
    return weights, values


def random_rotation(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


@SETTINGS
@given(rows(), st.integers(0, 1000))
def test_rotating_all_values_leaves_precision_recall_unchanged(row, seed):
    weights, values = row
    rotated = values @ random_rotation(values.shape[-1], seed)
    a, b = tlg.separability(weights, values), tlg.separability(weights, rotated)
    assert torch.equal(a.precision, b.precision)
    assert torch.equal(a.recall, b.recall)
    torch.testing.assert_close(a.r_max, b.r_max, rtol=1e-9, atol=1e-12)


@SETTINGS
@given(rows(), st.floats(1e-3, 1e3))
def test_uniform_positive_scale_leaves_precision_recall_unchanged(row, scale):
    weights, values = row
    a, b = tlg.separability(weights, values), tlg.separability(weights, values * scale)
    assert torch.equal(a.precision, b.precision)
    assert torch.equal(a.recall, b.recall)
    torch.testing.assert_close(b.r_max, a.r_max * scale, rtol=1e-9, atol=1e-12)


@SETTINGS
@given(rows())
def test_n_equal_k_and_n_equal_one_give_one(row):
    weights, values = row
    k = weights.shape[-1]
    res = tlg.separability(weights, values, ns=sorted({1, k}))
    assert torch.all(res.precision == 1) and torch.all(res.recall == 1)
    assert torch.all(res.f_at_rmax == 1) and torch.all(res.f_at_rmin == 1)


@SETTINGS
@given(rows(max_rows=6), st.randoms(use_true_random=False))
def test_results_do_not_depend_on_batch_composition(row, rnd):
    weights, values = row
    together = tlg.separability(weights, values)
    order = list(range(weights.shape[0]))
    rnd.shuffle(order)
    shuffled = tlg.separability(weights[order], values[order])
    for i, j in enumerate(order):
        alone = tlg.separability(weights[j : j + 1], values[j : j + 1])
        for field in ("precision", "recall", "r_min", "r_max"):
            assert torch.equal(getattr(together, field)[j], getattr(alone, field)[0]), field
            assert torch.equal(getattr(shuffled, field)[i], getattr(alone, field)[0]), field


@SETTINGS
@given(rows())
def test_metrics_are_in_range_and_radii_ordered(row):
    weights, values = row
    res = tlg.separability(weights, values)
    n = res.ns.double()
    assert torch.all((res.precision > 0) & (res.precision <= 1))
    assert torch.all((res.recall >= 0) & (res.recall <= 1))
    # K_in counts are whole numbers: recall * N is an integer
    torch.testing.assert_close(res.recall * n, torch.round(res.recall * n), rtol=0, atol=1e-12)
    assert torch.all(res.r_max >= 0) and torch.all(res.r_min >= 0)
