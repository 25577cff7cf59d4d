"""Mergeable moments: against an exact reference, and merges in any order and grouping agree to 1e-12."""

from __future__ import annotations

import statistics

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tl_geometry.core.moments import ROUNDING_SPREAD, Moments

#: Values of a wide range of scales around a large offset: the case where sums of squares lose the
#: spread (the offset's square rounds away the deviations' squares).
#: No magnitudes below 1e-100: their squared deviations underflow float64 (a limit of any float64 M2).
finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False).filter(lambda x: x == 0 or abs(x) > 1e-100)
offsets = st.sampled_from([0.0, 1.0, -37.5, 1e4, 1e6])
batches = st.lists(st.lists(finite, min_size=0, max_size=6), min_size=1, max_size=6)


def reference(values: list[float]) -> tuple[float, float]:
    """Mean and population std by exact rational arithmetic (``statistics`` rounds once at the end)."""
    return statistics.fmean(values), statistics.pstdev(values)


def state(values: list[float]) -> Moments:
    return Moments.of(torch.tensor(values, dtype=torch.float64))


def close(a: float, b: float, rel: float = 1e-12, tiny: float = 1e-300) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b)) + tiny


def assert_same(a: Moments, b: Moments, rel: float = 1e-12) -> None:
    assert torch.equal(a.count, b.count)
    for x, y in ((a.mean, b.mean), (a.std(), b.std())):
        both_nan = torch.isnan(x) & torch.isnan(y)
        ok = (x - y).abs() <= rel * torch.maximum(x.abs(), y.abs()) + 1e-300
        assert bool((ok | both_nan).all()), (x, y)


@settings(max_examples=200, deadline=None)
@given(groups=batches, offset=offsets)
def test_merged_batches_equal_the_exact_mean_and_std(groups: list[list[float]], offset: float) -> None:
    groups = [[offset + x / 1e3 for x in g] for g in groups]  # spread ~1 next to the offset
    values = [x for g in groups for x in g]
    merged = Moments.zeros(())
    for g in groups:
        merged = merged.merge(state(g))
    assert merged.count.item() == len(values)
    if not values:
        assert torch.isnan(merged.std()) and torch.isnan(merged.mean_or_nan())
        return
    mean, std = reference(values)
    rounding = 1e-15 * len(groups) * abs(mean)  # the batch means' rounding, a few eps |mean| each
    assert close(merged.mean.item(), mean, tiny=rounding)
    # the std from (count, mean, M2) is exact to rounding, whatever the offset: sums of squares
    # would lose eps (mean / std)^2 instead of eps |mean| / std
    # (a spread within ROUNDING_SPREAD of the mean is rounding, reported as exactly 0)
    floor = ROUNDING_SPREAD * abs(mean)
    assert close(merged.std().item(), std, rel=1e-12, tiny=rounding + floor), (merged.std().item(), std)


@settings(max_examples=200, deadline=None)
@given(a=st.lists(finite, max_size=6), b=st.lists(finite, max_size=6), c=st.lists(finite, max_size=6), off=offsets)
def test_merge_is_commutative_and_associative(a: list[float], b: list[float], c: list[float], off: float) -> None:
    sa, sb, sc = (state([off + x for x in v]) for v in (a, b, c))
    merged = sa.merge(sb).merge(sc)
    # the mean is kept to about eps * |mean| (not only the offset: equal values far from 0 too)
    level = max(abs(off), abs(merged.mean.nan_to_num(0).item()))
    rounding = 4e-16 * level / max(merged.std().nan_to_num(0).item(), 1e-300)
    assert_same(sa.merge(sb), sb.merge(sa), rel=1e-12 + rounding)
    assert_same(sa.merge(sb).merge(sc), sa.merge(sb.merge(sc)), rel=1e-12 + rounding)
    assert_same(sa.merge(sb).merge(sc), sc.merge(sa).merge(sb), rel=1e-12 + rounding)


@settings(max_examples=100, deadline=None)
@given(groups=batches, off=offsets)
@example(groups=[[683.5461268177376] * 3], off=0.0)  # equal values: a std of 0 against 1.1e-13
def test_reduce_equals_merging_one_by_one(groups: list[list[float]], off: float) -> None:
    states = [state([off + x for x in g]) for g in groups]
    stacked = Moments(*(torch.stack([getattr(s, k) for s in states]) for k in ("count", "mean", "m2")))
    one_by_one = Moments.zeros(())
    for s in states:
        one_by_one = one_by_one.merge(s)
    # the mean is kept to about eps * |mean| (docs/architecture.md, "Exact merges"): the merge order may move a spread
    # that is small next to the mean by that much, relative to the spread (three equal values of
    # 683.5... merged in two orders gave a std of 0 and of 1.1e-13 = 1.07 eps * 683.5)
    level = max(abs(off), abs(one_by_one.mean.nan_to_num(0).item()))
    rounding = 4e-16 * level / max(one_by_one.std().nan_to_num(0).item(), 1e-300)
    assert_same(stacked.reduce(0), one_by_one, rel=1e-12 + rounding)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.one_of(finite, st.just(float("nan"))), min_size=1, max_size=12))
def test_undefined_observations_are_left_out(values: list[float]) -> None:
    x = torch.tensor(values, dtype=torch.float64)
    m = Moments.of(x, defined=~torch.isnan(x))
    kept = [v for v in values if v == v]
    assert m.count.item() == len(kept)
    if kept:
        mean, std = reference(kept)
        assert close(m.mean.item(), mean, tiny=1e-12) and close(m.std().item(), std, tiny=1e-12)
    else:
        assert m.m2.item() == 0 and torch.isnan(m.std())


def test_sums_of_squares_lose_the_spread_that_moments_keep() -> None:
    """The case of the issue: a spread 1e-7 of the mean. E[x^2] - E[x]^2 is off by far more than
    1e-12; the merged (count, mean, M2) state is exact to rounding in any order."""
    gen = torch.Generator().manual_seed(0)
    x = 2.75e-5 * (1 + 1e-7 * torch.randn(64, dtype=torch.float64, generator=gen))
    exact = statistics.pstdev(x.tolist())
    sums = ((x.square().mean() - x.mean().square()).clamp_min(0).sqrt()).item()
    assert not close(sums, exact, rel=1e-6)
    forward, backward = Moments.zeros(()), Moments.zeros(())
    for i in range(0, 64, 5):
        forward = forward.merge(Moments.of(x[i : i + 5]))
    for i in reversed(range(64)):
        backward = backward.merge(Moments.of(x[i : i + 1]))
    for m in (forward, backward, Moments.of(x)):
        assert m.std().item() == pytest.approx(exact, rel=1e-12)


def test_state_dict_round_trip_and_elementwise_shapes() -> None:
    x = torch.arange(24, dtype=torch.float64).view(4, 2, 3)
    m = Moments.of(x, dim=0)
    assert m.count.shape == (2, 3) and bool((m.count == 4).all())
    back = Moments.from_state_dict(m.state_dict())
    assert torch.equal(back.m2, m.m2) and torch.equal(back.mean, x.mean(0))
    assert torch.allclose(back.std(), x.std(0, correction=0))


@pytest.mark.parametrize("offset", [1.0, 3.7e5, -2.5e-3])
def test_a_spread_of_rounding_is_exactly_zero_in_any_merge_order(offset: float) -> None:
    """Issue 47: values a few units in the last place apart gave stds of 1e-16 that differed by 30 %
    between one process and torchrun; such a spread is now exactly 0 whatever the order of the merges."""
    ulp = abs(offset) * torch.finfo(torch.float64).eps
    gen = torch.Generator().manual_seed(0)
    values = offset + torch.randint(-3, 4, (64,), generator=gen).double() * ulp
    assert values.unique().numel() > 1  # a spread, though of rounding
    one = Moments.of(values)
    halves = Moments.of(values[:32]).merge(Moments.of(values[32:]))
    shards = Moments.of(values[1::2]).merge(Moments.of(values[::2]))
    pieces = Moments.of(values.reshape(8, 8), dim=1).reduce(0)
    for moments in (one, halves, shards, pieces):
        assert moments.std().item() == 0.0
    spread = Moments.of(offset + torch.arange(4.0, dtype=torch.float64) * abs(offset) * 1e-6)
    assert spread.std().item() > 0  # a real spread is kept
