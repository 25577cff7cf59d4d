"""The largest cosine across the top-N boundary (tl_geometry.theory.boundary_cosines) against a loop.

``ref_rho_out`` transcribes definitions §4 for one row and one N: the maximum of
``<v_j, v_k> / (||v_j|| ||v_k||)`` over ``j`` outside ``I_N`` and ``k`` in ``I_N`` without the sink
(``-inf`` when there is no such pair), with Python loops over the pairs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from reference import top_n

from tl_geometry.core.rankings import selection_order
from tl_geometry.theory import boundary_cosines
from tl_geometry.theory.boundary_cosines import (
    bucket_max_matrix,
    bucket_max_measured,
    rho_out_from_buckets,
    rho_out_measured,
)


def ref_rho_out(weights: torch.Tensor, values: torch.Tensor, n: int) -> float:
    sel = top_n(weights, n)
    prime = [k for k in sel if k != 0]
    out = [j for j in range(len(weights)) if j not in sel]
    best = -math.inf
    for j in out:
        for k in prime:
            nj, nk = float(values[j].norm()), float(values[k].norm())
            cos = 0.0 if nj == 0 or nk == 0 else float(values[j] @ values[k]) / (nj * nk)
            best = max(best, cos)
    return best


def engine_rho_out(weights, values, ns, dtype=torch.float64, model_rho=None):
    order = selection_order(weights)
    v = values.gather(-2, order[..., None].expand_as(values))
    norms = v.norm(dim=-1, keepdim=True)
    units = v / torch.where(norms > 0, norms, 1.0)
    sink_rank = (order == 0).to(torch.int64).argmax(dim=-1)
    grid = torch.tensor(ns)
    if model_rho is not None:
        return rho_out_from_buckets(bucket_max_matrix(units @ units.transpose(1, 2), grid, sink_rank), grid)
    return rho_out_measured(units, grid, sink_rank, dtype)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("grid", ["all", "sparse"])
@pytest.mark.parametrize("product_elements", [None, 1], ids=["whole-buckets", "one-row-per-product"])
def test_matches_loop(seed, grid, product_elements, monkeypatch):
    if product_elements is not None:  # each bucket's products formed one row at a time
        monkeypatch.setattr(boundary_cosines, "PRODUCT_ELEMENTS", product_elements)
    g = torch.Generator().manual_seed(seed)
    k_keys = 23
    weights = torch.softmax(2 * torch.randn(3, k_keys, generator=g, dtype=torch.float64), dim=-1)
    values = torch.randn(3, k_keys, 5, generator=g, dtype=torch.float64)
    values[1, 4] = 0.0  # a zero vector: cosine 0
    values[2, 7] = values[2, 3]  # a duplicate: cosine 1
    ns = list(range(1, k_keys + 1)) if grid == "all" else [1, 2, 5, 11, 22, 23]
    got = engine_rho_out(weights, values, ns)
    also = engine_rho_out(weights, values, ns, model_rho=True)  # the same cosines given as a matrix
    for r in range(3):
        for gi, n in enumerate(ns):
            expected = ref_rho_out(weights[r], values[r], n)
            for value in (float(got[r, gi]), float(also[r, gi])):
                if math.isinf(expected):
                    assert value == -math.inf, (r, n)
                else:
                    assert value == pytest.approx(expected, abs=1e-14), (r, n)


def test_float32_screen_is_rechecked_in_float64():
    # cosines 1 - 1e-10 and 1 - 3e-10 across the boundary of N = 2: float32 cannot tell them apart
    # (both read 1.0), the float64 answer is the first
    d = 6
    base = torch.zeros(d, dtype=torch.float64)
    base[0] = 1.0

    def tilted(eps):
        v = base.clone()
        v[1] = math.sqrt(2 * eps)  # cos(base, v) = 1 / sqrt(1 + 2 eps) ~ 1 - eps
        return v

    values = torch.stack([torch.randn(d, dtype=torch.float64), base, tilted(3e-10), tilted(1e-10), -base])
    weights = torch.tensor([0.1, 0.5, 0.2, 0.15, 0.05], dtype=torch.float64)  # ranks: 1, 2, 3, 0, 4
    ns = [1, 2, 3, 4, 5]
    got = engine_rho_out(weights[None], values[None], ns)[0]
    screen = engine_rho_out(weights[None], values[None], ns, dtype=torch.float32)[0]
    expected = ref_rho_out(weights, values, 1)  # I_1 = {1}: its best partner is key 3
    assert expected == pytest.approx(1 / math.sqrt(1 + 2e-10), abs=1e-15)
    assert float(got[0]) == pytest.approx(expected, abs=1e-15)
    assert abs(float(screen[0]) - expected) > 1e-11  # what the float32 screen alone would report
    for gi, n in enumerate(ns):
        exp_n = ref_rho_out(weights, values, n)
        assert float(got[gi]) == (exp_n if math.isinf(exp_n) else pytest.approx(exp_n, abs=1e-14)), n


@pytest.mark.parametrize("seed", range(4))
def test_compiled_bookkeeping_equals_the_torch_screen(seed):
    # rho_out_measured (compiled bookkeeping, only the re-checked columns) against
    # rho_out_from_buckets(bucket_max_measured(...)) (every column, [r, G, K] tensors): equal bit for bit
    g = torch.Generator().manual_seed(seed)
    n_rows, k_keys, d = 6, 97, 7
    values = torch.randn(n_rows, k_keys, d, generator=g, dtype=torch.float64)
    values[1] = values[1, :1] + 1e-7 * values[1]  # near-ties: many columns within the screen's slack
    values[2, 5] = 0.0  # a zero vector: cosine 0
    values[3, 9] = values[3, 2]  # a duplicate: cosine 1
    weights = torch.softmax(3 * torch.randn(n_rows, k_keys, generator=g, dtype=torch.float64), dim=-1)
    order = selection_order(weights)
    v = values.gather(-2, order[..., None].expand_as(values))
    norms = v.norm(dim=-1, keepdim=True)
    units = v / torch.where(norms > 0, norms, 1.0)
    sink_rank = (order == 0).to(torch.int64).argmax(dim=-1)
    for ns in ([1, 2, 3, 5, 8, 13, 96, 97], list(range(1, k_keys + 1)), [40], [1, 97]):
        grid = torch.tensor(ns)
        expected = rho_out_from_buckets(bucket_max_measured(units, grid, sink_rank, torch.float64), grid)
        assert torch.equal(rho_out_measured(units, grid, sink_rank, torch.float64), expected), ns


@pytest.mark.parametrize("min_columns", [None, 2], ids=["default", "every-row"])
@pytest.mark.parametrize("seed", range(3))
def test_repeated_vectors_are_rechecked_once(seed, min_columns, monkeypatch):
    # a first layer's values: a few vectors, each repeated at many keys (the same token), so that
    # most columns tie at cosine 1 and pass the screen; the re-check keeps one column per vector
    if min_columns is not None:
        monkeypatch.setattr(boundary_cosines, "DISTINCT_MIN_COLUMNS", min_columns)
    g = torch.Generator().manual_seed(seed)
    n_rows, k_keys, d, vocabulary = 4, 120, 6, 9
    tokens = torch.randint(0, vocabulary, (n_rows, k_keys), generator=g)
    values = torch.randn(vocabulary, d, generator=g, dtype=torch.float64)[tokens]
    values[0, 3:6] = -values[0, 3:6]  # opposite vectors, not equal ones
    weights = torch.softmax(3 * torch.randn(n_rows, k_keys, generator=g, dtype=torch.float64), dim=-1)
    order = selection_order(weights)
    v = values.gather(-2, order[..., None].expand_as(values))
    units = v / v.norm(dim=-1, keepdim=True)
    sink_rank = (order == 0).to(torch.int64).argmax(dim=-1)
    seen = []
    distinct = boundary_cosines.distinct_columns
    monkeypatch.setattr(
        boundary_cosines, "distinct_columns", lambda u, c: seen.append((c, distinct(u, c))) or seen[-1][1]
    )
    for ns in ([1, 2, 3, 5, 8, 13, 30, 64, 119, 120], list(range(1, k_keys + 1))):
        grid = torch.tensor(ns)
        expected = rho_out_from_buckets(bucket_max_measured(units, grid, sink_rank, torch.float64), grid)
        assert torch.equal(rho_out_measured(units, grid, sink_rank, torch.float64), expected), ns
        for r in range(n_rows):
            for gi, n in enumerate(ns[:4]):
                assert float(expected[r, gi]) == pytest.approx(ref_rho_out(weights[r], values[r], n), abs=1e-14)
    assert any(len(kept) < len(cols) for cols, kept in seen)  # repeated columns were left out


def test_distinct_columns_keeps_the_lowest_rank_of_equal_vectors(monkeypatch):
    monkeypatch.setattr(boundary_cosines, "DISTINCT_MIN_COLUMNS", 2)
    u = np.array([[0.6, 0.8], [1.0, 0.0], [0.6, 0.8], [1.0, -0.0], [1.0, 0.0], [0.8, 0.6]])
    assert boundary_cosines.distinct_columns(u, np.arange(6)).tolist() == [0, 1, 3, 5]  # -0.0 differs in its bits
    assert boundary_cosines.distinct_columns(u, np.array([2, 4, 5])).tolist() == [2, 4, 5]
    monkeypatch.setattr(boundary_cosines, "DISTINCT_MIN_COLUMNS", 4)
    assert boundary_cosines.distinct_columns(u, np.array([0, 2, 5])).tolist() == [0, 2, 5]  # too few to look
