"""The fast separability engine against the slow per-N reference (definitions §2)."""

from __future__ import annotations

import math

import jaxtyping
import pytest
import torch
from reference import row_precision_recall_at, row_separability

import tl_geometry as tlg

FIELDS = ["precision", "recall", "r_min", "r_max", "f_at_rmax", "f_at_rmin"]


def random_rows(kind: str, n_rows: int, k: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of several shapes the engine must get right."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n_rows, k, d, generator=g, dtype=torch.float64)
    logits = torch.randn(n_rows, k, generator=g, dtype=torch.float64) * 2
    if kind == "ties":  # weights drawn from 3 levels: many exact ties, broken by key index
        weights = torch.randint(1, 4, (n_rows, k), generator=g).double()
        weights = weights / weights.sum(-1, keepdim=True)
    elif kind == "sink":  # dominant sink with a compressed value norm, as in the paper
        logits[:, 0] += 8
        values[:, 0] *= 0.1
        weights = torch.softmax(logits, -1)
    elif kind == "flat":  # all weights equal
        weights = torch.full((n_rows, k), 1.0 / k, dtype=torch.float64)
    elif kind == "duplicates":  # repeated keys: identical weight and value, so identical distances
        weights = torch.softmax(logits, -1)
        if k >= 4:
            values[:, 3] = values[:, 1]
            weights[:, 3] = weights[:, 1]
    else:
        weights = torch.softmax(logits, -1)
    return weights, values


def assert_matches_reference(weights: torch.Tensor, values: torch.Tensor, ns=None) -> None:
    res = tlg.separability(weights, values, ns)
    for r in range(weights.shape[0]):
        for gi, n in enumerate(res.ns.tolist()):
            ref = row_separability(weights[r], values[r], n)
            # counts are exact: precision and recall are ratios of integers
            assert float(res.precision[r, gi]) == ref["precision"], (r, n)
            assert float(res.recall[r, gi]) == ref["recall"], (r, n)
            assert float(res.f_at_rmax[r, gi]) == pytest.approx(ref["f_at_rmax"], abs=1e-15)
            assert float(res.f_at_rmin[r, gi]) == pytest.approx(ref["f_at_rmin"], abs=1e-15)
            assert float(res.r_max[r, gi]) == pytest.approx(ref["r_max"], abs=1e-9, rel=1e-9)
            if math.isinf(ref["r_min"]):
                assert math.isinf(float(res.r_min[r, gi]))
            else:
                assert float(res.r_min[r, gi]) == pytest.approx(ref["r_min"], abs=1e-9, rel=1e-9)


@pytest.mark.parametrize("kind", ["random", "ties", "sink", "flat", "duplicates"])
@pytest.mark.parametrize("k", [1, 2, 3, 17, 40])
def test_engine_equals_reference(kind: str, k: int) -> None:
    weights, values = random_rows(kind, n_rows=3, k=k, d=5, seed=k)
    assert_matches_reference(weights, values)


def test_engine_equals_reference_with_small_blocks() -> None:
    """Blocking over rows and sizes must not change anything (tiny blocks force many of them)."""
    weights, values = random_rows("sink", n_rows=20, k=33, d=4, seed=3)
    big = tlg.separability(weights, values)
    small = tlg.separability(weights, values, block_bytes=1)
    for f in FIELDS:
        assert torch.equal(getattr(big, f), getattr(small, f)), f
    assert_matches_reference(weights[:3], values[:3])


def test_float32_inputs_are_computed_in_float64() -> None:
    weights, values = random_rows("random", n_rows=2, k=12, d=3, seed=5)
    res = tlg.separability(weights.float(), values.float())
    assert res.precision.dtype == torch.float64
    assert_matches_reference(weights.float().double(), values.float().double())


def test_subset_of_ns_in_given_order() -> None:
    weights, values = random_rows("random", n_rows=2, k=20, d=4, seed=7)
    full = tlg.separability(weights, values, "all")
    some = tlg.separability(weights, values, ns=[7, 1, 20])
    assert some.ns.tolist() == [7, 1, 20]
    for f in FIELDS:
        assert torch.equal(getattr(some, f), getattr(full, f)[:, [6, 0, 19]]), f


def test_leading_batch_dims_are_kept() -> None:
    weights, values = random_rows("random", n_rows=6, k=9, d=3, seed=1)
    res = tlg.separability(weights.reshape(2, 3, 9), values.reshape(2, 3, 9, 3), ns=[1, 4, 9])
    flat = tlg.separability(weights, values, ns=[1, 4, 9])
    assert res.precision.shape == (2, 3, 3)
    assert torch.equal(res.recall.reshape(6, 3), flat.recall)


def test_n_equal_one_and_k_give_one_and_radii_edges() -> None:
    weights, values = random_rows("random", n_rows=4, k=15, d=6, seed=11)
    res = tlg.separability(weights, values, ns=[1, 15])
    assert torch.all(res.precision == 1) and torch.all(res.recall == 1)
    assert torch.all(res.r_max[:, 0] == 0)  # s(1) = y_top: its own distance is exactly 0
    assert torch.all(torch.isinf(res.r_min[:, 1]))


def test_known_two_dimensional_example() -> None:
    """A row worked out by hand: precision 1/2 and recall 1/2 at N = 2."""
    # contributions y = alpha * v: selected (alpha 0.4, 0.3) and two others (alpha 0.2, 0.1)
    weights = torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    values = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [2.0, 1.5], [0.0, -10.0]]], dtype=torch.float64)
    # y = (0.4,0), (0,0.3), (0.4,0.3), (0,-1); s(2) = (0.4, 0.3)
    # D = 0.3, 0.4, 0, 1.3 -> r_max = 0.4 (K_out = 1: key 2), r_min = 0 (K_in = 0)
    res = tlg.separability(weights, values, ns=[2])
    assert float(res.precision[0, 0]) == 2 / 3
    assert float(res.recall[0, 0]) == 0.0
    assert float(res.r_max[0, 0]) == pytest.approx(0.4, abs=1e-15)
    assert float(res.r_min[0, 0]) == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("kind", ["random", "sink", "ties"])
def test_precision_recall_at_radius_equals_reference(kind: str) -> None:
    weights, values = random_rows(kind, n_rows=2, k=11, d=3, seed=2)
    radii = torch.tensor([0.0, 0.05, 0.2, 0.5, 1.0, 3.0], dtype=torch.float64)
    pr = tlg.precision_recall_at_radius(weights, values, radii, ns=[1, 3, 6, 11])
    for r in range(2):
        for gi, n in enumerate([1, 3, 6, 11]):
            for ri, rad in enumerate(radii.tolist()):
                p, rec = row_precision_recall_at(weights[r], values[r], n, rad)
                got_p = float(pr.precision[r, gi, ri])
                assert (math.isnan(p) and math.isnan(got_p)) or got_p == p
                assert float(pr.recall[r, gi, ri]) == rec


def test_radius_sweep_at_the_extremal_radii_gives_the_metrics() -> None:
    """P(r_max, N) = precision, R(r_min, N) = recall, R(r_max, N) = 1 (Corollary 1)."""
    weights, values = random_rows("sink", n_rows=3, k=25, d=8, seed=4)
    res = tlg.separability(weights, values)
    radii = torch.stack([res.r_max, res.r_min.clamp(max=1e300)], dim=-1)
    pr = tlg.precision_recall_at_radius(weights, values, radii)
    assert torch.equal(pr.precision[..., 0], res.precision)
    assert torch.equal(pr.recall[..., 0], torch.ones_like(res.recall))
    assert torch.equal(pr.recall[..., 1], res.recall)


def test_wrong_shapes_raise_a_readable_error() -> None:
    weights = torch.rand(2, 5)
    with pytest.raises(jaxtyping.TypeCheckError, match="values"):
        tlg.separability(weights, torch.rand(2, 6, 3))  # K differs between weights and values
    with pytest.raises(jaxtyping.TypeCheckError):
        tlg.separability(weights, torch.rand(2, 5))  # values without a feature dimension


def test_bad_inputs_have_clear_messages() -> None:
    weights, values = random_rows("random", n_rows=1, k=5, d=2, seed=0)
    with pytest.raises(tlg.InputError, match=r"N out of range.*1 <= N <= 5"):
        tlg.separability(weights, values, ns=[0, 3])
    with pytest.raises(tlg.InputError, match=r"N out of range"):
        tlg.separability(weights, values, ns=[6])
    nan_weights = weights.clone()
    nan_weights[0, 2] = float("nan")
    with pytest.raises(tlg.InputError, match="NaN"):
        tlg.separability(nan_weights, values)
    with pytest.raises(tlg.InputError, match="non-negative"):
        tlg.separability(-weights, values)
    with pytest.raises(tlg.InputError, match="at least one key"):
        tlg.separability(torch.zeros(1, 0), torch.zeros(1, 0, 2))
    with pytest.raises(tlg.InputError, match="integers"):
        tlg.separability(weights, values, ns=[1.5])


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_several_rankings_at_once_equal_one_call_per_ranking(distance: str) -> None:
    """``separability_rankings`` checks and scales the rows once for every ranking (what the
    observer runs for the attention ranking and the random control): each result equals, bit for
    bit, the call for that ranking alone; a name given twice is measured once, in the order given."""
    from conftest import assert_bit_identical

    from tl_geometry.core.engine.rows import separability_rankings

    weights, values = random_rows("sink", n_rows=3, k=40, d=5, seed=4)
    weights, values = weights.view(3, 1, 40), values.view(3, 1, 40, 5)  # a batch dimension kept
    given = ("random", "attention", "contribution", "random")
    kw = dict(distance=distance, n_random=5, seed=7, row_keys=torch.tensor([[11], [12], [13]]))
    both = separability_rankings(weights, values, "log", given, **kw)
    assert list(both) == ["random", "attention", "contribution"]
    for name, res in both.items():
        assert res.rank_by == name and res.precision.shape == (3, 1, res.ns.shape[0])
        assert_bit_identical(res, tlg.separability(weights, values, "log", rank_by=name, **kw))
    assert list(separability_rankings(weights, values, [1, 2], "attention")) == ["attention"]
    with pytest.raises(tlg.InputError, match="rank_by"):
        separability_rankings(weights, values, [1, 2], ["attention", "nearest"])


def test_log_spaced_grid() -> None:
    grid = tlg.log_spaced_ns(1024)
    assert grid[:8] == list(range(1, 9)) and grid[-1] == 1024
    assert grid == sorted(set(grid)) and len(grid) < 60
    assert tlg.log_spaced_ns(5) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_value_scale_found_in_the_values_dtype_is_that_of_the_widened_values(dtype):
    """The rows' value exponent (largest ``|v|`` in ``[1/2, 1)`` after scaling) is found in the
    values' own dtype: the one the widened float64 values give, on rows whose largest magnitude
    is negative, and the scaled values are the widened ones times that power of two."""
    from tl_geometry.core.engine.rows import _ScaledRows

    g = torch.Generator().manual_seed(3)
    values = torch.randn(3, 9, 4, generator=g, dtype=torch.float64) * torch.tensor([300.0, 1.0, 1e-3])[:, None, None]
    values[:, 2, 1] = -2 * values.abs().amax(dim=(-2, -1))  # the largest magnitude is a negative component
    values = values.to(dtype)
    weights = torch.softmax(torch.randn(3, 9, generator=g, dtype=torch.float64), -1)
    rows = _ScaledRows.of(weights, values)
    wide = values.double()
    assert torch.equal(rows.value_exp, torch.frexp(wide.abs().amax(dim=(-2, -1))).exponent)
    assert torch.equal(
        rows.values, wide * torch.ldexp(torch.ones(3, dtype=torch.float64), -rows.value_exp)[:, None, None]
    )
