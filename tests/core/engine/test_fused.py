"""The fused (numba) screen against the torch screen: the same counts and bit-identical radii.

The torch screen is the reference (it is itself checked against the loop reference in
test_query_engine.py, which runs with the default kernel, the fused one). Here hypothesis draws
layers with ties, duplicated keys, zero weights and values at extreme scales, for both distances
and both screening dtypes, and every metric must be equal bit for bit.
"""

from __future__ import annotations

from fractions import Fraction
from functools import partial

import numpy as np
import pytest
import torch
from conftest import assert_bit_identical
from hypothesis import given, settings
from hypothesis import strategies as st
from test_query_engine import kv_heads, layer_rows

from tl_geometry.core.engine import fused, query_engine
from tl_geometry.core.engine.query_engine import GRAM_FLOAT32_EXPONENT, GRAM_MAX_EXPONENT, separability_queries
from tl_geometry.errors import InputError

pytestmark = pytest.mark.skipif(not fused.AVAILABLE, reason="numba is not installed")


@st.composite
def layers(draw):
    kind = draw(st.sampled_from(["softmax", "ties", "duplicates", "flat", "sink"]))
    n_keys = draw(st.integers(1, 12))
    weights, values = layer_rows(kind, n_keys, d=draw(st.integers(1, 6)), seed=draw(st.integers(0, 2**16)))
    zero = draw(st.floats(0.0, 0.5))  # zero weights: keys that carry nothing (rows renormalised)
    if zero > 0:
        keep = torch.rand(weights.shape, generator=torch.Generator().manual_seed(n_keys)) >= zero
        keep[..., 0] = True
        weights = weights * keep
        weights = weights / weights.sum(-1, keepdim=True)
    scale = draw(st.sampled_from([1.0, 2.0**-600, 2.0**500, 1e-300]))
    if draw(st.booleans()):  # one key far louder than the rest: extreme scales within a row
        values[:, n_keys // 2] *= 2.0**40
    if draw(st.booleans()) and n_keys >= 2:  # duplicated values at other weights
        values[:, -1] = values[:, 0]
    return weights, values * scale


def rows_for(layer, ns):
    """The layer's weights, values, query positions and sizes: a list of sizes cut to the keys there
    are, and only the queries that see its largest."""
    weights, values = layer
    n_keys = weights.shape[-1]
    if isinstance(ns, list):
        ns = [n for n in ns if n <= n_keys] or [1]
        positions = [q for q in range(n_keys) if q + 1 >= max(ns)]
    else:
        positions = list(range(n_keys))
    return weights[:, :, positions], values, positions, ns


@settings(max_examples=40, deadline=None)
@given(layers(), st.sampled_from(["euclidean", "cosine"]), st.sampled_from([torch.float64, torch.float32]),
       st.sampled_from(["log", "all", [1, 3, 2]]))  # fmt: skip
def test_fused_screen_equals_the_torch_screen(layer, distance, screen, ns):
    weights, values, positions, ns = rows_for(layer, ns)
    kw = dict(distance=distance, screen=screen, block_cells=300)
    ref = separability_queries(weights, values, positions, kv_heads(4, 2), ns, kernel="torch", **kw)
    got = separability_queries(weights, values, positions, kv_heads(4, 2), ns, kernel="numba", **kw)
    assert_bit_identical(ref, got)


@pytest.mark.parametrize("rank_by", ["contribution", "random"])
def test_fused_screen_equals_the_torch_screen_for_other_rankings(rank_by):
    weights, values = layer_rows("ties", 16, seed=3)
    kw = dict(rank_by=rank_by, n_random=3, block_cells=2000)
    ref = separability_queries(weights, values, list(range(16)), kv_heads(4, 2), "all", kernel="torch", **kw)
    got = separability_queries(weights, values, list(range(16)), kv_heads(4, 2), "all", kernel="numba", **kw)
    assert_bit_identical(ref, got)


@settings(max_examples=40, deadline=None)
@given(layers(), st.sampled_from(["log", "all", [1, 3, 2]]))
def test_the_gram_route_equals_the_value_route(layer, ns):
    """The products formed in the pass from the Gram matrix (float32 or float64 entries, float64
    sums, a band that grows with ``N``) or by the value product (float32 or float64): every metric
    the same, bit for bit, and the torch screen's."""
    weights, values, positions, ns = rows_for(layer, ns)
    run = partial(separability_queries, weights, values, positions, kv_heads(4, 2), ns, block_cells=300)
    calls = []
    ref = run(kernel="torch")
    with spy_on_gram(calls):
        gram = run(products="gram")
    values32 = run(products="values")
    assert_bit_identical(ref, gram)
    assert_bit_identical(ref, values32)
    # the Gram route ran unless the values' scale is beyond its range (then the value route runs),
    # from a float32 Gram matrix where every value exponent (of keys 0..k) lies within its range
    exponent = int(torch.frexp(values.abs().amax()).exponent)
    assert bool(calls) == (abs(exponent) <= GRAM_MAX_EXPONENT)
    exponents = torch.frexp(torch.cummax(values.abs().amax(dim=-1), dim=1).values).exponent
    small = bool((exponents.abs() <= GRAM_FLOAT32_EXPONENT).all())
    assert all(dtype == (np.float32 if small else np.float64) for _, dtype in calls)


def test_auto_takes_the_gram_route_for_short_rows_and_the_product_for_long_ones(monkeypatch):
    """``products="auto"`` per block: the Gram route where ``GRAM_COST K <= G d``; both give the same."""
    weights, values = layer_rows("random", 40, d=6, seed=5)
    positions = list(range(40))
    routes = {}
    for cost, expect in ((1, True), (1000, False)):
        monkeypatch.setattr(query_engine, "GRAM_COST", cost)
        calls = []
        with spy_on_gram(calls):
            routes[cost] = separability_queries(weights, values, positions, kv_heads(4, 2), "all")
        assert bool(calls) == expect
    assert_bit_identical(routes[1], routes[1000])


class spy_on_gram:
    """Records the calls of ``fused.gram_screen_counts`` made inside the ``with`` block."""

    def __init__(self, calls):
        self.calls, self.original = calls, fused.gram_screen_counts

    def __enter__(self):
        def spy(**kw):
            self.calls.append((kw["order"].shape, kw["gram"].dtype))
            return self.original(**kw)

        fused.gram_screen_counts = spy

    def __exit__(self, *exc):
        fused.gram_screen_counts = self.original


def test_the_cells_to_recheck_outgrow_their_first_buffer():
    """Every key tied with every other (a flat row of equal values): every key is near both radii,
    more cells than the first buffer holds (the kernel grows it); the counts must still be those of
    the torch screen."""
    weights, values = layer_rows("flat", 40, d=3)
    values[:] = 1.0
    ref = separability_queries(weights, values, list(range(40)), kv_heads(4, 2), "all", kernel="torch")
    got = separability_queries(weights, values, list(range(40)), kv_heads(4, 2), "all", kernel="numba")
    assert_bit_identical(ref, got)


def kernel_layout(x, *per_key):
    """``x`` [P, K, E, G] and the per-key arrays [P, K, E] in the kernel's layouts [P, E, G, K] and
    [P, E, K]."""
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)), *(np.ascontiguousarray(a.swapaxes(1, 2)) for a in per_key)


def screen_by_hand(coef: float, absolute: float):
    """One group, one row of three keys, sizes 1 and 2 (Euclidean, E = ||y||^2 - 2 <y, s>)."""
    x = np.array([[[[1.0, 1.0]], [[0.0, 0.5]], [[2.0, 0.0]]]])  # [P=1, K=3, E=1, G=2]
    w = np.ones((1, 3, 1))
    v_norm = np.array([[[1.0], [1.0], [2.0]]])
    rank = np.array([[[0], [1], [2]]])  # selection order: key 0, then 1, then 2
    ns = np.array([[1, 2]])
    s = np.ones((1, 1, 2))
    absolute = np.full((1, 1, 2), absolute)
    x, w, v_norm, rank = kernel_layout(x, w, v_norm, rank)
    return fused.screen_counts(x, w, v_norm, rank, ns, np.array([2]), coef, absolute, s, given=False)


def test_screen_counts_by_hand():
    """E: N=1: key 0 (selected) -1, key 1 1, key 2 0; N=2: key 0 -1, key 1 (selected) 0, key 2 4."""
    counts, cells = screen_by_hand(0.0, 0.25)  # every key's band 0.25
    # N=1: no unselected key within r_max (E -1 +- 0.25), key 0 within r_min (its P -0.75 <= the
    # unselected keys' smallest M -0.25); N=2: none within r_max, both selected within r_min
    assert counts[:, 0, 0].tolist() == [[0, 0], [1, 2]]
    # flat [P, K, E, G] index k * 2 + g: r_max's candidates the largest selected (key 0 for N=1,
    # key 1 for N=2), r_min's the smallest unselected (key 2 for N=1 and N=2)
    assert [c.tolist() for c in cells.lists()] == [[0, 3], [4, 5], [], []]
    # a band per key: ||y|| (||y|| + 2 ||s||) is 3 for keys 0 and 1 and 8 for key 2. With coef 0.1,
    # N=1: key 0 [-1.3, -0.7] selected, keys 1 [0.7, 1.3] and 2 [-0.8, 0.8] unselected: both are
    # r_min's candidates, key 2 is undecided against r_max, key 0 against r_min (-0.7 > -0.8);
    # N=2: keys 0 [-1.3, -0.7] and 1 [-0.3, 0.3] selected, key 2 [3.2, 4.8]: both surely within r_min
    counts, cells = screen_by_hand(0.1, 0.0)
    assert counts[:, 0, 0].tolist() == [[0, 0], [0, 2]]
    assert [sorted(c.tolist()) for c in cells.lists()] == [[0, 3], [2, 4, 5], [4], [0]]


def test_a_key_of_wide_band_stays_a_candidate_for_r_max():
    """Two selected keys: A (||y|| 1, E 0, band 0.3) and B (||y|| 2, E -0.5, band 0.8). B's E lies
    below A's lower bound -0.3 but its upper bound 0.3 does not: B may be the farther, both are
    measured."""
    x = np.array([[[[0.5]], [[2.25]]]])  # [P=1, K=2, E=1, G=1]: E = ||y||^2 - 2 x
    v_norm = np.array([[[1.0], [2.0]]])
    s = np.ones((1, 1, 1))
    x, w, v_norm, rank = kernel_layout(x, np.ones((1, 2, 1)), v_norm, np.array([[[0], [1]]]))
    counts, cells = fused.screen_counts(
        x,
        w,
        v_norm,
        rank,
        np.array([[2]]),
        np.array([1]),
        0.1,
        np.zeros((1, 1, 1)),
        s,
        given=False,
    )
    assert [c.tolist() for c in cells.lists()] == [[0, 1], [], [], []]
    assert counts[:, 0, 0].tolist() == [[0], [2]]  # nothing left out: both within r_min = inf


def test_unknown_kernel_is_refused():
    weights, values = layer_rows("softmax", 4)
    with pytest.raises(InputError, match="kernel must be one of"):
        separability_queries(weights, values, list(range(4)), kv_heads(4, 2), kernel="cuda")


def numbers(values):
    """The values that are not NaN: a NaN bound is never an extreme."""
    return [v for v in values if not np.isnan(v)]


def screen_by_loops(x, w, v_norm, rank, ns, q, coef, absolute, s_norm):
    """The documented decisions, one cell at a time (float64 Euclidean screen): counts [2, P, E, G]
    and the four lists of flat [P, K, E, G] cells (``x`` [P, K, G, E])."""
    n_groups, n_keys, n_sizes, n_rows = x.shape
    e_val = (w * v_norm)[:, :, None] ** 2 - 2 * w[:, :, None] * x  # [P, K, G, E]
    y = w * v_norm
    band = coef * (y * y)[:, :, None] + 2 * coef * y[:, :, None] * s_norm.swapaxes(1, 2)[:, None]
    band = band + absolute.swapaxes(1, 2)[:, None]
    lo, hi = e_val - band, e_val + band
    counts = np.zeros((2, n_groups, n_rows, n_sizes), dtype=np.int64)
    cells = [[], [], [], []]
    for p in range(n_groups):
        for r in range(n_rows):
            for g in range(n_sizes):
                real = [k for k in range(q[r] + 1)]
                inside = [k for k in real if rank[p, k, r] < ns[r, g]]
                outside = [k for k in real if rank[p, k, r] >= ns[r, g]]
                m_max = max(numbers(lo[p, k, g, r] for k in inside), default=-np.inf)
                p_max = max(numbers(hi[p, k, g, r] for k in inside), default=-np.inf)
                m_min = min(numbers(lo[p, k, g, r] for k in outside), default=np.inf)
                p_min = min(numbers(hi[p, k, g, r] for k in outside), default=np.inf)
                counts[0, p, r, g] = sum(hi[p, k, g, r] <= m_max for k in outside)
                counts[1, p, r, g] = sum(hi[p, k, g, r] <= m_min for k in inside)
                flat = {k: ((p * n_keys + k) * n_rows + r) * n_sizes + g for k in real}
                cells[0] += [flat[k] for k in inside if hi[p, k, g, r] >= m_max]
                cells[1] += [flat[k] for k in outside if lo[p, k, g, r] <= p_min]
                cells[2] += [flat[k] for k in outside if m_max < hi[p, k, g, r] and lo[p, k, g, r] <= p_max]
                cells[3] += [flat[k] for k in inside if m_min < hi[p, k, g, r] and lo[p, k, g, r] <= p_min]
    return counts, [sorted(c) for c in cells]


def assert_listed_once_centre_by_centre(cells: fused.ListedCells, shape: tuple[int, int, int, int]) -> None:
    """Each listed key once, for at least one kind, ordered by group, row, size, then key (the keys of
    one centre together); ``shape`` is ``[P, K, E, G]``."""
    group, key, row, size = np.unravel_index(cells.flat, shape)
    n_groups, n_keys, n_rows, n_sizes = shape
    by_centre = ((group * n_rows + row) * n_sizes + size) * n_keys + key
    assert np.all(np.diff(by_centre) > 0)
    assert np.all(cells.kinds != 0) and np.all(cells.kinds < 16)
    where = np.ravel_multi_index((group, row, size), (n_groups, n_rows, n_sizes))
    assert [c.tolist() for c in cells.coordinates] == [group.tolist(), key.tolist(), row.tolist(), where.tolist()]


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 2), st.integers(1, 9), st.integers(1, 11), st.integers(0, 2**16))
def test_screen_counts_equal_the_loops_over_every_row(n_groups, n_keys, n_rows, seed):
    """Several engine rows of different lengths (padding keys) and sizes in any order, a wide band:
    the kernel's counts and cells equal the decisions made one cell at a time."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, n_keys, n_rows)
    ns = rng.integers(1, q[:, None] + 2, (n_rows, 3))  # in any order
    x = np.round(rng.normal(size=(n_groups, n_keys, 3, n_rows)), 1)  # ties
    w, v_norm = rng.uniform(0, 1, (n_groups, n_keys, n_rows)), rng.uniform(0, 2, (n_groups, n_keys, n_rows))
    rank = np.argsort(rng.uniform(size=(n_groups, n_rows, n_keys)), axis=-1).argsort(axis=-1).swapaxes(1, 2)
    absolute, s_norm = rng.uniform(0, 0.3, (n_groups, n_rows, 3)), rng.uniform(0, 2, (n_groups, n_rows, 3))
    in_layout = kernel_layout(x.swapaxes(2, 3), w, v_norm, rank)
    counts, cells = fused.screen_counts(*in_layout, ns, q, 0.05, absolute, s_norm, given=False)
    ref_counts, ref_cells = screen_by_loops(x, w, v_norm, rank, ns, q, 0.05, absolute, s_norm)
    assert np.array_equal(counts, ref_counts)
    assert [sorted(c.tolist()) for c in cells.lists()] == ref_cells  # the kernel lists them row by row
    assert_listed_once_centre_by_centre(cells, x.shape[:2] + x.shape[2:][::-1])


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 9), st.integers(1, 11), st.integers(0, 2**16))
def test_screen_counts_with_infinite_zero_and_nan_bounds_equal_the_loops(n_keys, n_rows, seed):
    """Bounds of -inf and +inf (a row left unscreened: ``absolute = +inf``; an infinite product),
    of -0.0 and +0.0 (zero weights and products) and NaN (never an extreme): the kernel's integer
    extremes decide as the cell-by-cell loops do."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, n_keys, n_rows)
    ns = rng.integers(1, q[:, None] + 2, (n_rows, 3))
    x = rng.choice([0.0, -0.0, 0.5, -0.5, 1.0, np.inf, -np.inf, np.nan], size=(1, n_keys, 3, n_rows))
    w = rng.choice([0.0, 0.25, 1.0], size=(1, n_keys, n_rows))
    v_norm = rng.choice([0.0, 1.0, 2.0], size=(1, n_keys, n_rows))
    rank = np.argsort(rng.uniform(size=(1, n_rows, n_keys)), axis=-1).argsort(axis=-1).swapaxes(1, 2)
    absolute = rng.choice([0.0, 0.125, np.inf], size=(1, n_rows, 3))
    s_norm = rng.choice([0.0, 1.0], size=(1, n_rows, 3))
    in_layout = kernel_layout(x.swapaxes(2, 3), w, v_norm, rank)
    with np.errstate(invalid="ignore"):
        counts, cells = fused.screen_counts(*in_layout, ns, q, 0.05, absolute, s_norm, given=False)
        ref_counts, ref_cells = screen_by_loops(x, w, v_norm, rank, ns, q, 0.05, absolute, s_norm)
    assert np.array_equal(counts, ref_counts)
    assert [sorted(c.tolist()) for c in cells.lists()] == ref_cells  # the kernel lists them row by row
    assert_listed_once_centre_by_centre(cells, x.shape[:2] + x.shape[2:][::-1])


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 40),
    st.integers(1, 9),
    st.integers(1, 12),
    st.integers(0, 2**31 - 1),
    st.booleans(),
)
def test_cell_coordinates_unravel_the_flat_cells(n_groups, n_keys, n_rows, n_sizes, seed, compiled):
    # both ways (the numba pass, the torch operations of any device) against numpy's unravel_index
    shape = (n_groups, n_keys, n_rows, n_sizes)
    flat = np.random.default_rng(seed).integers(0, np.prod(shape), size=50)
    group, key, row, size = np.unravel_index(flat, shape)
    where = np.ravel_multi_index((group, row, size), (n_groups, n_rows, n_sizes))
    got = fused.cell_coordinates(torch.from_numpy(flat), n_keys, n_rows, n_sizes, compiled=compiled)
    for name, expected, actual in zip(("group", "key", "row", "where"), (group, key, row, where), got, strict=True):
        assert actual.tolist() == expected.tolist(), name


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 9),
    st.integers(1, 5),
    st.integers(1, 17),
    st.integers(0, 30),
    st.integers(1, 32),
    st.integers(0, 2**31 - 1),
)
def test_distances_by_chunks_equal_one_norm_of_the_tensor_code(n_groups, n_keys, n_rows, dim, n_cells, chunk, seed):
    """Cells in any order, repeated or not, values at scales far apart, chunks of one cell up to
    more than all: every distance is that of the tensor code's one norm of every cell, bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    n_sizes = 3
    v = torch.randn(n_groups, n_keys, dim, generator=gen, dtype=torch.float64)
    magnitudes = torch.tensor([2.0**-30, 1.0, 2.0**40], dtype=torch.float64)
    v = v * magnitudes[torch.randint(0, 3, (n_groups, n_keys, 1), generator=gen)]
    # powers of two down to 2^-1000 (the least the engine passes): some of y subnormal, some huge
    exponents = torch.tensor([-1000, -995, -40, 0, 30, 1000])[torch.randint(0, 6, (n_groups, n_rows), generator=gen)]
    scale = torch.ldexp(torch.ones(n_groups, n_rows, dtype=torch.float64), exponents)
    w = torch.rand(n_groups, n_rows, n_keys, generator=gen, dtype=torch.float64)
    centers = torch.randn(n_groups, n_rows, n_sizes, dim, generator=gen, dtype=torch.float64)  # at the rows' scales
    centers = (centers * scale[:, :, None, None] * 2.0 ** -torch.randint(0, 40, (1,), generator=gen)).reshape(-1, dim)
    group = torch.randint(0, n_groups, (n_cells,), generator=gen)
    key = torch.randint(0, n_keys, (n_cells,), generator=gen)
    row = torch.randint(0, n_rows, (n_cells,), generator=gen)
    where = (group * n_rows + row) * n_sizes + torch.randint(0, n_sizes, (n_cells,), generator=gen)
    got = fused.distances(v, scale, w, centers, (group, key, row, where), chunk=chunk)
    y = w[group, row, key][:, None] * (v[group, key] * scale[group, row][:, None])
    expected = torch.linalg.vector_norm(y - centers[where], dim=-1)
    assert got.shape == (n_cells,) and torch.equal(got, expected)
    assert torch.equal(fused.distances(v, scale, w, centers, (group, key, row, where)), expected)


def test_distances_refuse_an_empty_chunk():
    cells = tuple(torch.zeros(1, dtype=torch.int64) for _ in range(4))
    with pytest.raises(ValueError, match="chunk >= 1"):
        fused.distances(torch.ones(1, 1, 2), torch.ones(1, 1), torch.ones(1, 1, 1), torch.ones(1, 2), cells, chunk=0)


def radii_by_loops(dist, where, kinds, k_out, k_in):
    """The radii and counts of :func:`fused.measured_radii`, one cell at a time."""
    r_max, r_min = np.full(k_out.size, -np.inf), np.full(k_out.size, np.inf)
    k_out, k_in = k_out.reshape(-1).copy(), k_in.reshape(-1).copy()
    for d, w, kind in zip(dist, where, kinds):
        if kind & fused.KIND_R_MAX:
            r_max[w] = max(r_max[w], d)
        if kind & fused.KIND_R_MIN:
            r_min[w] = min(r_min[w], d)
    for d, w, kind in zip(dist, where, kinds):
        k_out[w] += bool(kind & fused.KIND_WITHIN_R_MAX) and d <= r_max[w]
        k_in[w] += bool(kind & fused.KIND_WITHIN_R_MIN) and d <= r_min[w]
    return k_out, k_in, r_max, r_min


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(0, 40), st.integers(0, 2**31 - 1), st.booleans())
def test_measured_radii_equal_the_loops(n_cells_of_rows, n_listed, seed, compiled):
    """Listed cells of any kinds (two at once, none of some rows and sizes), distances with ties:
    both ways give the radii and counts of the cell-by-cell loops."""
    rng = np.random.default_rng(seed)
    shape = (1, n_cells_of_rows, 2)
    dist = rng.choice([0.0, 0.5, 1.0, 1.5, 2.0], size=n_listed)
    where = rng.integers(0, np.prod(shape), n_listed)
    kinds = rng.choice([1, 2, 4, 8, 1 | 8, 2 | 4], size=n_listed).astype(np.uint8)
    k_out, k_in = rng.integers(0, 3, shape), rng.integers(0, 3, shape)
    got = fused.measured_radii(*(torch.from_numpy(a) for a in (dist, where, kinds, k_out, k_in)), compiled=compiled)
    for name, expected, actual in zip(
        ("k_out", "k_in", "r_max", "r_min"), radii_by_loops(dist, where, kinds, k_out, k_in), got, strict=True
    ):
        assert actual.shape == shape and actual.reshape(-1).tolist() == expected.tolist(), name


def test_cell_coordinates_compiled_needs_the_cpu():
    with pytest.raises(InputError, match="compiled=True needs numba and a CPU tensor"):
        fused.cell_coordinates(torch.zeros(3, dtype=torch.int64, device="meta"), 2, 2, 2, compiled=True)


@settings(max_examples=40, deadline=None)
@given(
    n_rows=st.integers(1, 4),
    n_keys=st.integers(1, 30),
    dim=st.integers(1, 5),
    sizes=st.lists(st.integers(0, 10**6), min_size=1, max_size=6),
    by_order=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_grid_sums_equal_a_loop_and_cumsum(n_rows, n_keys, dim, sizes, by_order, seed):
    """The running sums at each size (unordered, repeated) against a loop in selection order, and
    the compiled pass against torch.cumsum of the sorted contributions, bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(n_rows, n_keys, dim, generator=gen, dtype=torch.float64)
    factor = torch.rand(n_rows, n_keys, generator=gen, dtype=torch.float64)
    order = torch.argsort(torch.rand(n_rows, n_keys, generator=gen), dim=-1) if by_order else None
    ns = torch.tensor([1 + s % n_keys for s in sizes])
    got = fused.grid_sums(values, factor, ns, order)
    assert torch.equal(got, fused.grid_sums(values, factor, ns, order, compiled=False))
    for r in range(n_rows):
        for g, n in enumerate(ns.tolist()):
            total = torch.zeros(dim, dtype=torch.float64)
            for t in range(n):
                key = t if order is None else int(order[r, t])
                total = total + values[r, key] * factor[r, t]
            assert torch.equal(got[r, g], total)


def add_product(acc: np.ndarray, factor: float, row: np.ndarray) -> np.ndarray:
    """``acc + factor * row`` elementwise as the compiled sums add a term: rounded once (the exact value,
    by fractions) where they are fused multiply-adds (``fused.gram_sums_fused()``), else twice."""
    if not fused.gram_sums_fused():
        return acc + factor * row
    return np.array([float(Fraction(a) + Fraction(factor) * Fraction(g)) for a, g in zip(acc.tolist(), row.tolist())])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 37), st.sampled_from([np.float64, np.float32]), st.integers(0, 2**16))
def test_gram_running_sums_round_each_term_as_documented(n, last, gram_dtype, seed):
    """The compiled sums (four terms per pass, vectorised along the keys, and their remainders) against
    the terms added one at a time, rounded once where ``gram_sums_fused()`` says so, else twice."""
    rng = np.random.default_rng(seed)
    size = max(n, last)
    gram = rng.normal(size=(size, size)).astype(gram_dtype)
    order, factor = rng.permutation(size)[:n], rng.uniform(size=n)
    want = np.zeros(last)
    for t in range(n):
        want = add_product(want, factor[t], gram[order[t], :last].astype(np.float64))
    assert np.array_equal(fused.gram_running_sums(gram, order, factor, n, last), want)


@pytest.mark.parametrize("n, last, order", [(3, 2, [0, 1]), (1, 3, [0]), (1, 2, [2]), (1, 2, [-1])])
def test_gram_running_sums_refuse_what_they_cannot_read(n, last, order):
    """More terms than the order holds, more products than the Gram's columns, keys beyond its rows."""
    with pytest.raises(ValueError, match="gram_running_sums"):
        fused.gram_running_sums(np.eye(2), np.array(order), np.ones(len(order)), n, last)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 2),
    st.integers(1, 9),
    st.integers(1, 7),
    st.integers(1, 4),
    st.integers(0, 2**16),
    st.sampled_from([np.float64, np.float32]),
    st.booleans(),
)
def test_gram_screen_counts_equal_the_loops_over_every_row(n_groups, n_keys, n_rows, dim, seed, gram_dtype, tiny):
    """The Gram route's kernel against the documented decisions one cell at a time: the products
    ``x_scale sum_{t<N} factor_t G[i, order_t]`` summed in ``t`` order (in float64 from the stored
    entries; one rounding per term where the sums are fused multiply-adds, else two), the band's
    added term ``4 ((d + 2 N + 8) u + u_G) A(N) ||y_i||`` (as ``s + (2 (d + 2 N + 8) u + 2 u_G) A /
    coef``; ``u_G = 2^-24`` for a float32 Gram, else 0) and its floors. ``tiny``:
    values of ``2^-70`` whose float32 Gram entries are subnormals (the floor ``4 x_scale N 2^-150``
    decides), and a key ``2^-23`` from another (the term ``u_G`` decides)."""
    rng = np.random.default_rng(seed)
    v = np.round(rng.normal(size=(n_groups, n_keys, dim)), 1)  # ties
    if n_keys >= 2:
        v[:, -1] = v[:, 0] * (1 + 2.0**-23)
    if tiny:
        v = v * 2.0**-70
    gram = (v @ v.swapaxes(1, 2)).astype(gram_dtype)
    unit, floor = (2.0**-24, 2.0**-150) if gram_dtype == np.float32 else (0.0, 0.0)
    q = rng.integers(0, n_keys, n_rows)
    ns = np.sort(rng.integers(1, q[:, None] + 2, (n_rows, 3)), axis=1)
    w = rng.choice([0.0, 0.125, 0.5, rng.uniform()], size=(n_groups, n_rows, n_keys))
    exponent = rng.integers(-1, 3, (n_groups, n_rows)) - (70 if tiny else 0)
    x_scale, row_scale = np.ldexp(1.0, -2 * exponent), np.ldexp(1.0, -exponent)
    v_norm = np.linalg.norm(v, axis=-1)[:, None, :] * row_scale[..., None]
    padding = np.arange(n_keys) > q[:, None]  # [E, K]: after the real keys, as the engine orders them
    order = np.stack([[np.lexsort((-w[p, r], padding[r])) for r in range(n_rows)] for p in range(n_groups)])
    rank = np.argsort(order, axis=-1)
    factor = np.take_along_axis(w, order, axis=-1)
    absolute, s_norm = rng.uniform(0, 0.3, (n_groups, n_rows, 3)), rng.uniform(0, 2, (n_groups, n_rows, 3))
    if seed % 3 == 0:  # a row left unscreened: its bounds -inf and +inf, every key measured
        absolute[:, 0] = np.inf
    coef = 0.05
    counts, cells = fused.gram_screen_counts(
        gram, order, factor, w, v_norm, rank, ns, q, x_scale, dim, coef, absolute, s_norm
    )
    x = np.zeros((n_groups, n_keys, 3, n_rows))
    s_band, absolute_band = s_norm.copy(), absolute.copy()
    for p in range(n_groups):
        for r in range(n_rows):
            for g, n in enumerate(ns[r]):
                acc, lengths = np.zeros(n_keys), 0.0
                for t in range(n):
                    acc = add_product(acc, factor[p, r, t], gram[p, order[p, r, t]].astype(np.float64))
                    lengths += factor[p, r, t] * v_norm[p, r, order[p, r, t]]
                x[p, :, g, r] = acc * x_scale[p, r]
                s_band[p, r, g] += (2 * (dim + 2 * n + 8) * 2.0**-53 + 2 * unit) * lengths / coef
                absolute_band[p, r, g] += 8.0 * (x_scale[p, r] * (dim + n) + 2.0) * 5e-324
                absolute_band[p, r, g] += 4.0 * x_scale[p, r] * n * floor
    ref_counts, ref_cells = screen_by_loops(
        x, w.swapaxes(1, 2), v_norm.swapaxes(1, 2), rank.swapaxes(1, 2), ns, q, coef, absolute_band, s_band
    )
    assert np.array_equal(counts, ref_counts)
    assert [sorted(c.tolist()) for c in cells.lists()] == ref_cells  # the kernel lists them row by row
    assert_listed_once_centre_by_centre(cells, (n_groups, n_keys, n_rows, 3))


@pytest.mark.parametrize("ns, coef, match", [([[2, 1]], 0.05, "non-decreasing"), ([[1, 2]], 0.0, "coef > 0")])
def test_gram_screen_counts_refuses_what_its_band_cannot_cover(ns, coef, match):
    """Sizes out of order (the sums run forward) and ``coef = 0`` (the cosine's: the band's term is
    formed through ``1 / coef``) are refused."""
    one = np.ones((1, 1, 2))
    with pytest.raises(ValueError, match=match):
        fused.gram_screen_counts(
            np.ones((1, 2, 2)), np.array([[[0, 1]]]), one, one, one, np.array([[[0, 1]]]), np.array(ns),
            np.array([1]), np.ones((1, 1)), 1, coef, one, one,
        )  # fmt: skip


def test_gram_screen_counts_refuses_a_gram_of_another_dtype():
    """Only a float64 or float32 Gram matrix has a band (``GRAM_ROUNDING``)."""
    one = np.ones((1, 1, 2))
    with pytest.raises(ValueError, match="float64 or float32"):
        fused.gram_screen_counts(
            np.ones((1, 2, 2), dtype=np.float16), np.array([[[0, 1]]]), one, one, one, np.array([[[0, 1]]]),
            np.array([[1, 2]]), np.array([1]), np.ones((1, 1)), 1, 0.05, one, one,
        )  # fmt: skip


@pytest.mark.parametrize(
    "epsilon, gram_dtype, undecided",
    [(3e-8, np.float64, True), (1e-6, np.float64, False), (2.0**-12, np.float32, True), (2.0**-12, np.float64, False),
     (2.0**-8, np.float32, False)],
)  # fmt: skip
def test_the_gram_routes_band_covers_its_running_sums(epsilon, gram_dtype, undecided):
    """One row of two keys (d = 1), ``N = 1``: key 1's value ``1 + epsilon`` against the selected
    key 0's ``1``, so ``E_1 - E_0 = epsilon^2``. The band of the running sums, ``4 ((d + 2 N + 8) u +
    u_G) A ||y||`` with ``A = 1`` (about 4.9e-15 per key from a float64 Gram, 2.4e-7 from a float32
    one: ``u_G = 2^-24``), leaves ``E_1 - E_0 = 9e-16`` undecided against both radii and decides
    ``1e-12``; from a float32 Gram it leaves ``2^-24`` undecided (whose entries here are exact: the
    band is the bound, not the rounding) and decides ``2^-16``; the rest of the band is made
    negligible (``coef = 2^-70``)."""
    gram = np.array([[[1.0, 1.0 + epsilon], [1.0 + epsilon, (1.0 + epsilon) ** 2]]]).astype(gram_dtype)
    w = np.ones((1, 1, 2))
    v_norm = np.array([[[1.0, 1.0 + epsilon]]])
    order, rank = np.array([[[0, 1]]]), np.array([[[0, 1]]])
    zero = np.zeros((1, 1, 1))
    counts, cells = fused.gram_screen_counts(
        gram, order, w, w, v_norm, rank, np.array([[1]]), np.array([1]), np.ones((1, 1)), 1, 2.0**-70, zero, zero
    )
    # decided: key 1 surely beyond r_max, key 0 surely within r_min; else both measured
    assert counts[:, 0, 0, 0].tolist() == ([0, 0] if undecided else [0, 1])
    assert [c.tolist() for c in cells.lists()] == ([[0], [1], [1], [0]] if undecided else [[0], [1], [], []])
