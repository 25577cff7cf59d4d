"""The per-row engine's compiled decisions against its torch decisions: the same counts and
bit-identical radii (the torch path is itself checked against the loop reference in
test_separability.py and test_screening.py, which run with the default, compiled kernel)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_bit_identical
from hypothesis import given, settings
from hypothesis import strategies as st
from test_screening import NOISE, decide, near_tie_rows
from test_separability import random_rows

import tl_geometry as tlg
from tl_geometry.core.engine import fused_rows
from tl_geometry.errors import InputError

pytestmark = pytest.mark.skipif(not fused_rows.AVAILABLE, reason="numba is not installed")


@st.composite
def adversarial_rows(draw):
    """Rows the screen finds hard: ties, duplicates, near ties below float32's resolution, weights
    down to 1e-30 and zero, a key 2^40 louder than the rest, rows at extreme scales."""
    kind = draw(st.sampled_from(["ties", "duplicates", "flat", "sink", "random", "near_ties"]))
    n_rows, n_keys, dim = draw(st.integers(1, 3)), draw(st.integers(1, 40)), draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**16))
    if kind == "near_ties":
        weights, values = near_tie_rows(3, n_keys, dim, seed, NOISE[draw(st.sampled_from(["euclidean", "cosine"]))])
        weights, values = weights[:n_rows], values[:n_rows]
    else:
        weights, values = random_rows(kind, n_rows, n_keys, dim, seed)
    if draw(st.booleans()):  # tiny weights: many keys with contributions near nothing
        weights = weights * torch.logspace(0, -30, n_keys, dtype=torch.float64)
        weights[..., : draw(st.integers(0, n_keys // 2))] = 0.0 if n_keys > 1 else weights[..., :0]
    if draw(st.booleans()):
        values[:, n_keys // 2] *= 2.0**40
    scale = draw(st.sampled_from([1.0, 2.0**-600, 2.0**500]))
    return weights, values * scale


@settings(max_examples=60, deadline=None)
@given(adversarial_rows(), st.sampled_from(["euclidean", "cosine"]),
       st.sampled_from(["attention", "contribution", "random"]), st.sampled_from(["all", "log", [3, 1, 2]]),
       st.sampled_from([1 << 10, 1 << 20]))  # fmt: skip
def test_compiled_decisions_equal_the_torch_decisions(row, distance, rank_by, ns, block_bytes):
    weights, values = row
    if isinstance(ns, list):
        ns = [n for n in ns if n <= weights.shape[-1]] or [1]
    kw = dict(distance=distance, rank_by=rank_by, n_random=3, block_bytes=block_bytes)
    assert_bit_identical(
        tlg.separability(weights, values, ns, kernel="torch", **kw),
        tlg.separability(weights, values, ns, kernel="numba", **kw),
    )


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("screen", [torch.float32, torch.float64])
def test_near_ties_go_to_the_exact_path_and_decide_as_float64(distance, screen):
    """Rows float32 cannot order: the compiled passes must leave cells to the re-check (counting
    them as decided would give wrong counts) and then agree with the float64 torch decisions."""
    weights, values = near_tie_rows(n_rows=4, k=40, d=6, seed=2, noise=NOISE[distance])
    exact = decide(weights, values, distance, torch.float64, kernel="torch")
    fast = decide(weights, values, distance, screen, kernel="numba")
    assert fast.n_direct > 0 or screen == torch.float64
    for name in ("k_out", "k_in", "r_max", "r_min"):
        assert torch.equal(getattr(fast, name), getattr(exact, name)), name


def test_extremes_and_counts_by_hand():
    """One batch of four positions, sizes 1, 2 and 4, Euclidean: P given, M = P - 2 ||s|| band - band2."""
    upper = np.array([[[1.0, 5.0, 0.5, 3.0], [1.0, 5.0, 0.5, 3.0], [1.0, 5.0, 0.5, 3.0]]])  # [B=1, g=3, K=4]
    band_key, band_sq = np.full((1, 4), 0.25), np.array([[0.0, 0.5, 0.0, 0.0]])
    sigma, ns = np.ones((1, 3)), np.array([1, 2, 4])
    # M = P - 0.5 - band_sq: [0.5, 4.0, 0.0, 2.5] for every size
    i_star, j_star = fused_rows.extremes(upper, band_key, band_sq, sigma, ns, cosine=False)
    assert i_star.tolist() == [[0, 1, 1]]  # largest M among t < N
    assert j_star.tolist() == [[2, 2, 3]]  # smallest P among t >= N (K - 1 where N = K)
    # [lo, hi] around r_max, then around r_min, per size
    thresholds = np.array([[[0.9, 4.0, 3.5]], [[1.1, 6.0, 4.5]], [[0.4, 1.2, np.inf]], [[0.6, 2.6, np.inf]]])
    k_out, k_in, unsure = fused_rows.counts(upper, band_key, band_sq, sigma, ns, thresholds, cosine=False)
    # N=1: P < 0.9 {2}, M < 1.1 {0, 2}: one key between, K_out = 2 - 1; P < 0.4 none, M < 0.6
    # {0, 2}: two between, unsure. N=2: P < 4 {0, 2, 3}, M < 6 all: K_out = 4 - 2; P < 1.2 {0, 2},
    # M < 2.6 {0, 2, 3}: K_in = 2. N=4: P < 3.5 {0, 2, 3}, M < 4.5 all: K_out = 0; K_in = N.
    assert k_out.tolist() == [[1, 2, 0]] and k_in.tolist() == [[0, 2, 4]]
    assert unsure.tolist() == [[True, False, False]]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 2), st.integers(1, 40), st.sampled_from([np.float32, np.float64]),
       st.booleans(), st.integers(0, 2**32 - 1))  # fmt: skip
def test_counts_equal_the_comparisons_counted_one_by_one(n_rows, n_draws, n_keys, dtype, cosine, seed):
    """The four counts of every cell (sums of ones that the kernel lets LLVM reorder) equal numpy's
    counts of the same comparisons, with ``M`` formed as torch forms it: tie-prone bounds (signed
    zeros, infinities, NaNs, values equal to a threshold) in both screen dtypes."""
    rng = np.random.default_rng(seed)
    n_batch, n_sizes = n_rows * n_draws, 3
    values = [0.0, -0.0, 0.5, -0.5, 1.0, 3.0, np.inf, -np.inf, np.nan]
    p = [0.15, 0.1, 0.15, 0.1, 0.15, 0.15, 0.08, 0.08, 0.04]
    upper = rng.choice(values, size=(n_batch, n_sizes, n_keys), p=p).astype(dtype)
    band_key = rng.choice([0.0, 0.25, 0.5], size=(n_rows, n_keys)).astype(dtype)
    band_sq = rng.choice([0.0, 0.5], size=(n_rows, n_keys)).astype(dtype)
    sigma = rng.choice([0.0, 1.0, 2.0], size=(n_batch, n_sizes)).astype(dtype)
    thresholds = rng.choice([0.0, 0.5, 1.0, 2.5, np.inf], size=(4, n_batch, n_sizes)).astype(dtype)
    ns = np.sort(rng.choice(np.arange(1, n_keys + 1), size=n_sizes))
    row = np.arange(n_batch) // n_draws
    with np.errstate(invalid="ignore"):
        lower = upper if cosine else upper + (dtype(-2) * sigma)[..., None] * band_key[row, None] - band_sq[row, None]
        k_out, k_in, unsure = fused_rows.counts(upper, band_key, band_sq, sigma, ns, thresholds, cosine=cosine)
        below = [(x < t[..., None]).sum(-1) for x, t in zip((upper, lower, upper, lower), thresholds)]
    full = ns == n_keys
    assert k_out.tolist() == (below[1] - ns).tolist()
    assert k_in.tolist() == np.where(full, ns, below[2]).tolist()
    doubt = (below[1] - below[0] != 1) | (~full & (below[3] - below[2] != 1))
    assert unsure.tolist() == doubt.tolist()


@pytest.mark.parametrize("zero", [np.float32(0.0), np.float64(0.0)])
def test_tallies_count_in_either_dtype(zero):
    """The tallies' float64 form, which ``counts`` takes from 2^24 keys (float32 sums of ones are
    exact only below), counts as the float32 one."""
    rng = np.random.default_rng(0)
    upper, lower = rng.normal(size=(2, 1000)).astype(np.float32)
    got = fused_rows._tally(upper, lower, np.float32(-0.5), np.float32(0.0), np.float32(0.5), np.float32(1.0), zero)
    assert got == tuple(
        int(n) for n in ((upper < -0.5).sum(), (lower < 0).sum(), (upper < 0.5).sum(), (lower < 1).sum())
    )


def extremes_by_loops(upper, band_key, band_sq, sigma, ns, cosine):
    """``i*`` and ``j*`` one cell at a time, keys in selection order: the first position of the
    largest ``M`` among ``t < N`` and of the smallest ``P`` among ``t >= N`` (``K - 1`` where
    ``N = K``), starting from the first key and moving only to a strictly larger (smaller) value."""
    n_batch, n_sizes, n_keys = upper.shape
    i_star, j_star = np.zeros((n_batch, n_sizes), dtype=np.int64), np.zeros((n_batch, n_sizes), dtype=np.int64)
    for b in range(n_batch):
        for g, n in enumerate(ns):
            two_sigma = upper.dtype.type(-2) * sigma[b, g]
            lower = upper[b, g] if cosine else upper[b, g] + two_sigma * band_key[b] - band_sq[b]
            at = 0
            for t in range(1, n):
                at = t if lower[t] > lower[at] else at
            i_star[b, g] = at
            at = min(n, n_keys - 1)
            for t in range(at + 1, n_keys):
                at = t if upper[b, g, t] < upper[b, g, at] else at
            j_star[b, g] = at
    return i_star, j_star


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 23), st.sampled_from([np.float32, np.float64]), st.booleans(),
       st.integers(0, 2**32 - 1))  # fmt: skip
def test_extremes_in_selection_order_equal_the_loops(n_batch, n_keys, dtype, cosine, seed):
    """Tie-prone bounds (signed zeros, infinities, NaNs, repeated values) and every size, both
    screen dtypes: the compiled extremes, four lanes merged, equal the one-chain loops."""
    rng = np.random.default_rng(seed)
    values = [0.0, -0.0, 0.5, -0.5, 1.0, 3.0, np.inf, -np.inf, np.nan]
    upper = rng.choice(values, size=(n_batch, n_keys, n_keys), p=[0.15, 0.1, 0.15, 0.1, 0.15, 0.15, 0.08, 0.08, 0.04])
    upper = upper.astype(dtype)
    band_key = rng.choice([0.0, 0.25, 0.5], size=(n_batch, n_keys)).astype(dtype)
    band_sq = rng.choice([0.0, 0.5], size=(n_batch, n_keys)).astype(dtype)
    sigma = rng.choice([0.0, 1.0, 2.0], size=(n_batch, n_keys)).astype(dtype)
    ns = np.arange(1, n_keys + 1)
    with np.errstate(invalid="ignore"):
        got = fused_rows.extremes(upper, band_key, band_sq, sigma, ns, cosine=cosine)
        expected = extremes_by_loops(upper, band_key, band_sq, sigma, ns, cosine)
    assert got[0].tolist() == expected[0].tolist()
    assert got[1].tolist() == expected[1].tolist()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 23), st.sampled_from([np.float32, np.float64]),
       st.booleans(), st.integers(0, 2**32 - 1))  # fmt: skip
def test_extremes_by_rank_equal_the_extremes_in_selection_order(n_rows, n_draws, n_keys, dtype, cosine, seed):
    """The random control's layout (keys in key order, each key's selection position in ``rank``,
    a row's bands shared by its draws) gives the positions of the same cells gathered into
    selection order, tie-prone bounds included."""
    rng = np.random.default_rng(seed)
    n_batch = n_rows * n_draws
    values = [0.0, -0.0, 0.5, -0.5, 1.0, 3.0, np.inf, -np.inf, np.nan]
    ns = np.sort(rng.choice(np.arange(1, n_keys + 1), size=min(n_keys, 5), replace=False))
    upper = rng.choice(
        values, size=(n_batch, ns.shape[0], n_keys), p=[0.15, 0.1, 0.15, 0.1, 0.15, 0.15, 0.08, 0.08, 0.04]
    )
    upper = upper.astype(dtype)
    band_key = rng.choice([0.0, 0.25, 0.5], size=(n_rows, n_keys)).astype(dtype)
    band_sq = rng.choice([0.0, 0.5], size=(n_rows, n_keys)).astype(dtype)
    sigma = rng.choice([0.0, 1.0, 2.0], size=(n_batch, ns.shape[0])).astype(dtype)
    rank = np.stack([rng.permutation(n_keys) for _ in range(n_batch)]).astype(np.int64)
    order = np.argsort(rank, axis=-1)  # the key at each selection position
    row = np.arange(n_batch) // n_draws
    with np.errstate(invalid="ignore"):
        got = fused_rows.extremes(upper, band_key, band_sq, sigma, ns, cosine=cosine, rank=rank)
        expected = fused_rows.extremes(
            np.ascontiguousarray(np.take_along_axis(upper, order[:, None, :], axis=-1)),
            np.take_along_axis(band_key[row], order, axis=-1),
            np.take_along_axis(band_sq[row], order, axis=-1),
            sigma,
            ns,
            cosine=cosine,
        )
    assert got[0].tolist() == expected[0].tolist()
    assert got[1].tolist() == expected[1].tolist()


def test_unknown_kernel_is_refused():
    weights, values = random_rows("random", n_rows=1, k=4, d=2, seed=0)
    with pytest.raises(InputError, match="kernel must be one of"):
        tlg.separability(weights, values, kernel="cuda")


@pytest.mark.parametrize("screen", [torch.float32, torch.float64])
def test_ordered_rows_are_the_gathered_running_sums(screen):
    """The operand and centres of one walk per draw equal ``gather`` then ``torch.cumsum``, bit for
    bit (sizes out of order, a size of 1 and of K, values that cancel)."""
    weights, values = random_rows("duplicates", n_rows=2, k=9, d=3, seed=4)
    y = weights[..., None] * values * torch.tensor([1.0, 1e16, -1e-16], dtype=torch.float64)
    order = torch.stack([torch.randperm(9, generator=torch.Generator().manual_seed(s)) for s in range(6)]).view(2, 3, 9)
    ns = torch.tensor([9, 1, 4])
    operand = np.empty((6, 9, 4), dtype=torch.empty(0, dtype=screen).numpy().dtype)
    centers, rank = np.empty((6, 3, 3)), np.empty((6, 9), dtype=np.int64)
    fused_rows.ordered_rows(y.numpy(), order.numpy(), ns.numpy(), centers, operand=operand, rank=rank)
    ordered = torch.gather(y[:, None].expand(2, 3, 9, 3), 2, order[..., None].expand(2, 3, 9, 3)).reshape(6, 9, 3)
    assert torch.equal(torch.from_numpy(operand[..., :3]), ordered.to(screen))
    assert torch.equal(torch.from_numpy(centers), torch.cumsum(ordered, dim=1)[:, ns - 1])
    assert torch.equal(torch.from_numpy(rank), torch.argsort(order.view(6, 9), dim=-1))  # the inverse permutation


def test_contributions_at_are_the_keys_at_those_selection_positions():
    """``y[r, order[r, draw, position]]`` for each stacked position (two rows, three draws each)."""
    y = torch.randn(2, 7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    order = torch.stack([torch.randperm(7, generator=torch.Generator().manual_seed(s)) for s in range(6)]).view(2, 3, 7)
    position = torch.randint(0, 7, (2, 6, 4), generator=torch.Generator().manual_seed(1))
    got = fused_rows.contributions_at(y.numpy(), order.numpy(), position.numpy())
    expected = torch.empty(2, 6, 4, 3, dtype=torch.float64)
    for h in range(2):
        for b in range(6):
            for g in range(4):
                expected[h, b, g] = y[b // 3, order[b // 3, b % 3, position[h, b, g]]]
    assert torch.equal(torch.from_numpy(got), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_scaling_equals_torch(dtype):
    """The per-row engine's rows times 2^-e in one numba walk, against times_pow2 in torch, bit for
    bit (zero rows, tiny and huge rows, subnormal products); exponents beyond float64's range refused."""
    from tl_geometry.core.numerics import times_pow2

    gen = torch.Generator().manual_seed(4)
    values = torch.randn(6, 9, 5, generator=gen, dtype=torch.float64)
    values[1] = 0.0
    values[2] *= 1e-30
    values[3] *= 1e30
    values[4, 3, 2] = -7.5
    values = values.to(dtype)
    exponents = torch.frexp(values.abs().amax(dim=(-2, -1)).double()).exponent.long()
    exponents[5] = 1000 if dtype == torch.float64 else 140  # products below float64's normal range
    expected = times_pow2(values.double(), -exponents[:, None, None])
    assert torch.equal(torch.from_numpy(fused_rows.scaled_values(values.numpy(), exponents.numpy())), expected)
    with pytest.raises(ValueError, match="1000"):
        fused_rows.scaled_values(values.numpy(), exponents.numpy() * 0 + 1001)
