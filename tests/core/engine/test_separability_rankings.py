"""Separability under every ranking and distance, the random control and the local errors
(definitions §7), against the loop reference; overflow (issue 10, item 3)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import METRICS, mix, row_metrics
from test_separability import random_rows

import tl_geometry as tlg
from tl_geometry.core.rankings import row_keys
from tl_geometry.errors import InputError

RANKINGS = ["attention", "contribution", "sink_window", "random"]
DISTANCES = ["euclidean", "cosine"]
COUNT_FIELDS = ["precision", "recall", "f_at_rmax", "f_at_rmin"]


def assert_close(got: float, want: float, what) -> None:
    if math.isnan(want) or math.isinf(want):
        assert (math.isnan(got) and math.isnan(want)) or got == want, what
    else:
        assert got == pytest.approx(want, abs=1e-9, rel=1e-9), what


def assert_matches(res, weights, values, rank_by, distance, seed=0, keys=None, n_random=3) -> None:
    for r in range(weights.shape[0]):
        key = mix(r, 0, 0, 0) if keys is None else int(keys[r])
        for gi, n in enumerate(res.ns.tolist()):
            ref = row_metrics(weights[r], values[r], n, rank_by, distance, seed, key, n_random)
            for m in METRICS:
                got = float(getattr(res, m)[r, gi])
                if m in COUNT_FIELDS and rank_by != "random":
                    # one draw: ratios of the same integers, so equal to the last bit
                    assert got == pytest.approx(ref[m], abs=1e-15), (m, r, n)
                else:
                    assert_close(got, ref[m], (m, r, n))


@pytest.mark.parametrize("rank_by", RANKINGS)
@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("kind", ["random", "ties", "sink", "duplicates"])
def test_every_ranking_and_distance_equals_the_loop_reference(rank_by, distance, kind):
    for k in (1, 2, 13):
        weights, values = random_rows(kind, n_rows=3, k=k, d=4, seed=k)
        res = tlg.separability(weights, values, rank_by=rank_by, distance=distance, n_random=3, seed=5)
        assert (res.rank_by, res.distance, res.n_draws) == (rank_by, distance, 3 if rank_by == "random" else 1)
        assert_matches(res, weights, values, rank_by, distance, seed=5)


@pytest.mark.parametrize("distance", DISTANCES)
def test_random_control_with_row_keys_and_small_blocks_equals_the_reference(distance):
    weights, values = random_rows("sink", n_rows=5, k=30, d=3, seed=1)
    keys = row_keys(seq=torch.arange(5) + 10, layer=4, head=2, query_pos=29)
    res = tlg.separability(
        weights, values, "log", rank_by="random", distance=distance, n_random=4, seed=9, row_keys=keys, block_bytes=1
    )
    assert_matches(res, weights, values, "random", distance, seed=9, keys=keys, n_random=4)


def test_random_control_does_not_depend_on_the_batch():
    weights, values = random_rows("random", n_rows=6, k=20, d=4, seed=3)
    keys = row_keys(seq=torch.arange(6), layer=1, head=0, query_pos=19)
    whole = tlg.separability(weights, values, rank_by="random", row_keys=keys)
    parts = [
        tlg.separability(weights[i : i + 2], values[i : i + 2], rank_by="random", row_keys=keys[i : i + 2])
        for i in (4, 0, 2)
    ]
    assert torch.equal(whole.precision, torch.cat([parts[1].precision, parts[2].precision, parts[0].precision]))
    assert torch.equal(whole.r_min, torch.cat([parts[1].r_min, parts[2].r_min, parts[0].r_min]))
    other = tlg.separability(weights, values, rank_by="random", row_keys=keys, seed=1)
    assert not torch.equal(whole.precision, other.precision)


def test_random_control_is_the_mean_of_its_draws():
    """n_random draws = the mean of the draws taken one at a time (draw r of n is draw r of n + m)."""
    weights, values = random_rows("random", n_rows=2, k=25, d=4, seed=4)
    four = tlg.separability(weights, values, "all", rank_by="random", n_random=4)
    one = tlg.separability(weights, values, "all", rank_by="random", n_random=1)
    assert not torch.equal(four.precision, one.precision)
    ref = [
        row_metrics(weights[0], values[0], n, "random", "euclidean", 0, mix(0, 0, 0, 0), 1)["precision"]
        for n in range(1, 26)
    ]
    assert one.precision[0].tolist() == pytest.approx(ref, abs=1e-15)


def test_local_errors_at_the_edges():
    weights, values = random_rows("random", n_rows=3, k=12, d=5, seed=2)
    for rank_by in RANKINGS:
        res = tlg.separability(weights, values, rank_by=rank_by)
        # N = K: nothing is deleted, the mass is the row's (1 for softmax rows)
        assert torch.allclose(res.retained_mass[:, -1], torch.ones(3, dtype=torch.float64), atol=1e-12)
        assert torch.allclose(res.local_error_del[:, -1], torch.zeros(3, dtype=torch.float64), atol=1e-12)
        assert torch.allclose(res.local_error_ren[:, -1], torch.zeros(3, dtype=torch.float64), atol=1e-12)
        assert bool((res.retained_mass[:, 1:] >= res.retained_mass[:, :-1]).all())


@pytest.mark.parametrize("rank_by", RANKINGS)
def test_overflowing_weights_give_the_metrics_of_the_unscaled_rows(rank_by):
    """Issue 10, item 3: weights * 1e200 gave precision inf and recall 0."""
    weights, values = random_rows("random", n_rows=3, k=16, d=4, seed=6)
    plain = tlg.separability(weights, values, rank_by=rank_by)
    huge = tlg.separability(weights * 1e200, values, rank_by=rank_by)
    assert torch.equal(huge.precision, plain.precision)
    assert torch.equal(huge.recall, plain.recall)
    assert torch.allclose(huge.r_max, plain.r_max * 1e200, rtol=1e-12)
    assert torch.allclose(huge.local_error_del, plain.local_error_del, rtol=1e-12)
    tiny = tlg.separability(weights * 1e-300, values * 1e-10, rank_by=rank_by)
    assert torch.equal(tiny.precision, plain.precision)
    assert torch.equal(tiny.recall, plain.recall)


def test_float16_values_of_scale_40_give_metrics_in_range_and_one_at_n_1():
    """Issue 10, item 3: float16 rows with values of scale 40 gave P(1) = 0.0156, R(1) = 0."""
    g = torch.Generator().manual_seed(0)
    values = (torch.randn(4, 64, 64, generator=g) * 40).half()
    weights = torch.softmax(torch.randn(4, 64, generator=g) * 2, -1).half()
    res = tlg.separability(weights, values)
    assert bool(((res.precision >= 0) & (res.precision <= 1)).all())
    assert bool(((res.recall >= 0) & (res.recall <= 1)).all())
    assert res.precision[:, 0].tolist() == [1.0] * 4
    assert res.recall[:, 0].tolist() == [1.0] * 4
    exact = tlg.separability(weights.double(), values.double())
    agree = (res.precision == exact.precision).double().mean()
    assert float(agree) > 0.9  # float16 distances: near-ties may be counted differently, nothing impossible


@st.composite
def rows(draw):
    n_rows, k, d = draw(st.integers(1, 3)), draw(st.integers(1, 20)), draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    values = torch.randn(n_rows, k, d, generator=g, dtype=torch.float64)
    weights = torch.softmax(torch.randn(n_rows, k, generator=g, dtype=torch.float64) * 2, -1)
    return weights, values


@given(rows(), st.sampled_from(RANKINGS), st.sampled_from(DISTANCES), st.integers(-1000, 1000))
@settings(max_examples=40, deadline=None)
def test_metrics_in_range_and_invariant_under_rotation_and_euclidean_scale(row, rank_by, distance, exponent):
    weights, values = row
    res = tlg.separability(weights, values, rank_by=rank_by, distance=distance, n_random=2)
    assert bool(((res.precision > 0) & (res.precision <= 1)).all())
    assert bool(((res.recall >= 0) & (res.recall <= 1)).all())
    assert bool((res.retained_mass <= 1 + 1e-12).all())
    d = values.shape[-1]
    q, _ = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64, generator=torch.Generator().manual_seed(d)))
    rotated = tlg.separability(weights, values @ q, rank_by=rank_by, distance=distance, n_random=2)
    assert torch.equal(rotated.precision, res.precision) and torch.equal(rotated.recall, res.recall)
    if distance == "euclidean":  # the cosine distance's 1e-12 is not scale-free, nor is P(1) = 1 for parallel keys
        assert res.precision[:, 0].tolist() == [1.0] * weights.shape[0]
        scaled = tlg.separability(weights, values * 2.0**exponent, rank_by=rank_by, distance=distance, n_random=2)
        assert torch.equal(scaled.precision, res.precision) and torch.equal(scaled.recall, res.recall)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rank_by="alpha"), "rank_by='alpha' is not a ranking"),
        (dict(distance="l1"), "distance='l1' is not a distance"),
        (dict(n_random=0), "n_random must be an integer >= 1"),
        (dict(rank_by="random", row_keys=torch.zeros(3, dtype=torch.int64)), "row_keys of shape"),
        (dict(rank_by="random", row_keys=torch.zeros(2)), "row_keys must be an integer tensor"),
    ],
)
def test_bad_arguments_raise_one_clear_error(kwargs, match):
    weights, values = random_rows("random", n_rows=2, k=4, d=2, seed=0)
    with pytest.raises(InputError, match=match):
        tlg.separability(weights, values, **kwargs)
