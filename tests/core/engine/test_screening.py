"""The engine's float32 screen decides as direct float64 distances do (definitions §2, §7): near
ties, exact ties, tiny contributions, a coarse screen that leaves most cells to the exact path."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import row_separability
from test_separability import random_rows

import tl_geometry as tlg
from tl_geometry.core.engine import screening
from tl_geometry.core.rankings import COSINE_EPS, ranking_scores, selection_order

DISTANCES = ["euclidean", "cosine"]
#: Relative noise of near_tie_rows: distances apart by about 1e-9 (the cosine: 1e-8 squared / 2)
NOISE = {"euclidean": 1e-9, "cosine": 1e-4}


def near_tie_rows(n_rows: int, k: int, d: int, seed: int, noise: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows whose distances float32 cannot order but float64 can.

    Row 0: equal weights and values ``base + noise``: for every N the keys' distances from
    ``s(N)`` differ by about ``noise`` (relative; the Euclidean distance) or ``noise^2`` (the cosine
    distance of nearly parallel keys), below float32's resolution and above float64's. Row 1: the
    same with weights spread over twenty orders of magnitude (many keys at ``D = ||s||`` to 1e-15,
    as the low-weight keys of real rows). Row 2: row 0 with exact duplicates. Further rows:
    ordinary random rows.
    """
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(d, generator=g, dtype=torch.float64)
    values = base + noise * torch.randn(n_rows, k, d, generator=g, dtype=torch.float64)
    weights = torch.full((n_rows, k), 1.0 / k, dtype=torch.float64)
    weights[1] = torch.softmax(torch.linspace(0, -46, k, dtype=torch.float64)[torch.randperm(k, generator=g)], -1)
    values[2, 1::3] = values[2, 0]
    if n_rows > 3:
        extra_w, extra_v = random_rows("sink", n_rows - 3, k, d, seed)
        weights[3:], values[3:] = extra_w, extra_v
    return weights, values


def assert_equals_reference(res, weights, values, distance: str) -> None:
    for r in range(weights.shape[0]):
        for gi, n in enumerate(res.ns.tolist()):
            ref = row_separability(weights[r], values[r], n, "attention", distance)
            assert float(res.precision[r, gi]) == ref["precision"], (r, n)
            assert float(res.recall[r, gi]) == ref["recall"], (r, n)
            assert float(res.r_max[r, gi]) == pytest.approx(ref["r_max"], abs=1e-9, rel=1e-9), (r, n)
            if math.isinf(ref["r_min"]):
                assert math.isinf(float(res.r_min[r, gi]))
            else:
                assert float(res.r_min[r, gi]) == pytest.approx(ref["r_min"], abs=1e-9, rel=1e-9), (r, n)


def decide(
    weights, values, distance: str, screen: torch.dtype, block_bytes: int = 1 << 20, kernel: str = "torch"
) -> screening.Decided:
    """The screen module on unscaled rows (attention order, every N) with a chosen screen dtype."""
    order = selection_order(ranking_scores(weights, values, "attention"))[:, None, :]
    eps = torch.full((weights.shape[0],), COSINE_EPS, dtype=torch.float64)
    ns = torch.arange(1, weights.shape[-1] + 1)
    return screening.decide(weights[..., None] * values, order, ns, distance, eps, block_bytes, screen, kernel)


@pytest.mark.parametrize("distance", DISTANCES)
def test_near_ties_are_decided_as_the_reference_does(distance):
    weights, values = near_tie_rows(n_rows=5, k=40, d=6, seed=0, noise=NOISE[distance])
    assert_equals_reference(tlg.separability(weights, values, distance=distance), weights, values, distance)


@pytest.mark.parametrize("distance", DISTANCES)
def test_near_ties_leave_the_screen_and_are_decided_directly(distance):
    """The float32 screen cannot order these rows: cells go to direct distances (a count that
    could be 0 if the screen were trusted blindly), and the counts still equal float64's."""
    weights, values = near_tie_rows(n_rows=3, k=40, d=6, seed=1, noise=NOISE[distance])
    fast, exact = decide(weights, values, distance, torch.float32), decide(weights, values, distance, torch.float64)
    assert fast.n_direct > 0
    for name in ("k_out", "k_in", "r_max", "r_min"):
        assert torch.equal(getattr(fast, name), getattr(exact, name)), name


@pytest.mark.parametrize("distance", DISTANCES)
def test_a_coarse_screen_gives_the_same_decisions(distance, monkeypatch):
    """A bfloat16 screen (8 bits) leaves most cells to the exact paths, including the whole-cell
    recomputation; the decisions are those of the float64 screen and of the loop reference."""
    calls = []
    recompute = screening._recompute
    monkeypatch.setattr(screening, "_recompute", lambda *a: calls.append(1) or recompute(*a))
    for kind, seed in (("sink", 0), ("ties", 1), ("duplicates", 2), ("flat", 3)):
        weights, values = random_rows(kind, n_rows=4, k=33, d=3, seed=seed)
        coarse, exact = (
            decide(weights, values, distance, torch.bfloat16),
            decide(weights, values, distance, torch.float64),
        )
        assert coarse.n_direct > 0
        for name in ("k_out", "k_in", "r_max", "r_min"):
            assert torch.equal(getattr(coarse, name), getattr(exact, name)), (kind, name)
        for r in range(weights.shape[0]):
            for n in (1, 2, 5, 17, 33):
                ref = row_separability(weights[r], values[r], n, "attention", distance)
                assert (int(coarse.k_out[r, n - 1]), int(coarse.k_in[r, n - 1])) == (ref["k_out"], ref["k_in"])
    assert calls, "the whole-cell recomputation never ran"


@pytest.mark.parametrize("kernel", ["torch", "numba"])
def test_sizes_out_of_order_in_many_blocks_are_decided_in_place(kernel):
    """Sizes given in no order, screened in many small blocks with a coarse screen: the unsure
    cells of every block are re-checked together at the end and land on their own sizes."""
    weights, values = random_rows("ties", n_rows=3, k=33, d=3, seed=4)
    order = selection_order(ranking_scores(weights, values, "attention"))[:, None, :]
    eps = torch.full((weights.shape[0],), COSINE_EPS, dtype=torch.float64)
    shuffled = torch.randperm(33, generator=torch.Generator().manual_seed(0)) + 1
    y = weights[..., None] * values
    fast = screening.decide(y, order, shuffled, "euclidean", eps, 3 * 8 * 33 * 2, torch.bfloat16, kernel)
    exact = screening.decide(y, order, torch.arange(1, 34), "euclidean", eps, 1 << 20, torch.float64, kernel)
    assert fast.n_direct > 0
    for name in ("k_out", "k_in", "r_max", "r_min"):
        assert torch.equal(getattr(fast, name), getattr(exact, name)[:, shuffled - 1]), name


@st.composite
def wide_rows(draw):
    """Rows with weights over many orders of magnitude (as real attention rows) and sizes of blocks."""
    n_rows, k, d = draw(st.integers(1, 3)), draw(st.integers(1, 70)), draw(st.integers(1, 9))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    values = torch.randn(n_rows, k, d, generator=g, dtype=torch.float64) * draw(st.sampled_from([1e-3, 1.0, 40.0]))
    temperature = draw(st.sampled_from([0.5, 3.0, 12.0]))
    weights = torch.softmax(torch.randn(n_rows, k, generator=g, dtype=torch.float64) * temperature, -1)
    return weights, values, draw(st.sampled_from([1, 4096, 1 << 20]))


@given(wide_rows(), st.sampled_from(DISTANCES))
@settings(max_examples=60, deadline=None)
def test_float32_and_float64_screens_decide_alike(row, distance):
    weights, values, block_bytes = row
    fast = decide(weights, values, distance, torch.float32, block_bytes)
    exact = decide(weights, values, distance, torch.float64, block_bytes)
    for name in ("k_out", "k_in", "r_max", "r_min"):
        assert torch.equal(getattr(fast, name), getattr(exact, name)), name


def test_inference_mode_and_inputs_that_require_grad():
    """The work tensors are reused across calls in and out of inference mode and with autograd on."""
    weights, values = random_rows("sink", n_rows=3, k=50, d=4, seed=7)
    plain = tlg.separability(weights, values, "log", rank_by="random", n_random=3)
    with torch.inference_mode():
        inside = tlg.separability(weights, values, "log", rank_by="random", n_random=3)
    tracked = tlg.separability(weights.requires_grad_(), values.requires_grad_(), "log", rank_by="random", n_random=3)
    for res in (inside, tracked):
        assert torch.equal(res.precision, plain.precision) and torch.equal(res.r_max, plain.r_max)


def test_a_screen_too_coarse_for_the_dimension_is_refused():
    weights, values = random_rows("random", n_rows=1, k=4, d=64, seed=0)
    with pytest.raises(ValueError, match="too coarse"):
        decide(weights, values, "euclidean", torch.bfloat16)


@pytest.mark.parametrize("n_draws", [1, 3])
def test_keys_gathered_into_work_tensors_are_those_of_indexing(n_draws):
    """``_Keys.at`` and ``_Keys.rows`` with ``out`` (the re-check's work tensors) give the
    contributions that indexing gives, for every draw of every row."""
    weights, values = random_rows("ties", n_rows=3, k=11, d=4, seed=5)
    y = weights[..., None] * values
    g = torch.Generator().manual_seed(0)
    order = torch.stack([torch.stack([torch.randperm(11, generator=g) for _ in range(n_draws)]) for _ in range(3)])
    keys = screening._Keys.of(y, order, torch.arange(1, 12), "euclidean", torch.float32, fused=False)
    batch = torch.tensor([0, 3 * n_draws - 1, n_draws, 1, 2 * n_draws - 1])
    position = torch.tensor([0, 10, 4, 7, 3])
    expected = torch.stack([y[b // n_draws, order[b // n_draws, b % n_draws, t]] for b, t in zip(batch, position)])
    out = torch.full((5, 4), torch.nan, dtype=torch.float64)
    assert keys.at(batch, position, out=out) is out
    assert torch.equal(out, expected) and torch.equal(keys.at(batch, position), expected)
    rows = torch.full((5, 11, 4), torch.nan, dtype=torch.float64)
    expected = torch.stack([y[b // n_draws, order[b // n_draws, b % n_draws]] for b in batch])
    assert torch.equal(keys.rows(batch, out=rows), expected) and torch.equal(rows, expected)
    assert torch.equal(keys.rows(batch), expected)
