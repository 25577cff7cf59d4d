"""Boundary conventions, separation margin and geometric inversions (definitions §2, §10) against a loop."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tl_geometry as tlg
from tl_geometry.core.margins import separation_margins
from tl_geometry.errors import InputError


def loop_margins(weights, values, n, convention):
    """One row: the stable top-n selection, s, distances, and every count by its definition."""
    k = len(weights)
    order = sorted(range(k), key=lambda i: (-weights[i], i))
    chosen, rest = order[:n], order[n:]
    y = [[weights[i] * v for v in values[i]] for i in range(k)]
    s = [sum(y[i][c] for i in chosen) for c in range(len(values[0]))]
    d = [math.sqrt(sum((y[i][c] - s[c]) ** 2 for c in range(len(s)))) for i in range(k)]
    rho_max = max(d[i] for i in chosen)
    rho_min = min((d[j] for j in rest), default=math.inf)
    k_out = sum(d[j] <= rho_max for j in rest)
    k_in = sum((d[i] <= rho_min) if convention == "paper" else (d[i] < rho_min) for i in chosen)
    ginv = sum(d[j] <= d[i] for i in chosen for j in rest)
    return n / (n + k_out), k_in / n, rho_min - rho_max, ginv


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 9), st.integers(1, 3), st.integers(0, 10_000), st.booleans())
def test_every_count_equals_the_loop(k, dim, seed, ties) -> None:
    g = torch.Generator().manual_seed(seed)
    weights = torch.rand(2, k, generator=g, dtype=torch.float64)
    values = torch.randn(2, k, dim, generator=g, dtype=torch.float64)
    if ties:  # duplicate keys: equal weights and values, where the two conventions can differ
        weights[:, 1], values[:, 1] = weights[:, 0], values[:, 0]
    for convention in ("paper", "followup"):
        got = separation_margins(weights, values, ns="all", convention=convention)
        for row in range(2):
            for j, n in enumerate(got["ns"].tolist()):
                p, r, gamma, ginv = loop_margins(weights[row].tolist(), values[row].tolist(), n, convention)
                assert float(got["precision"][row, j]) == p and float(got["recall"][row, j]) == r
                assert float(got["ginv"][row, j]) == ginv
                assert float(got["gamma"][row, j]) == pytest.approx(gamma, abs=1e-9) or math.isinf(gamma)


def test_the_paper_convention_agrees_with_the_engine_and_the_followup_differs_on_duplicates() -> None:
    g = torch.Generator().manual_seed(0)
    weights = torch.softmax(torch.randn(3, 12, generator=g, dtype=torch.float64), -1)
    values = torch.randn(3, 12, 4, generator=g, dtype=torch.float64)
    ns = [1, 2, 4, 8, 12]
    engine = tlg.separability(weights, values, ns=ns)
    mine = separation_margins(weights, values, ns=ns, convention="paper")
    assert torch.equal(mine["precision"], engine.precision.to(torch.float64))
    assert torch.equal(mine["recall"], engine.recall.to(torch.float64))
    assert torch.allclose(mine["rho_max"], engine.r_max.to(torch.float64), atol=1e-9)
    # two identical keys: N = 1 selects one, its twin is left out at distance 0 = rho_min = D of the selected
    w, v = (
        torch.tensor([[0.4, 0.4, 0.2]], dtype=torch.float64),
        torch.tensor([[[1.0], [1.0], [0.0]]], dtype=torch.float64),
    )
    paper, followup = (separation_margins(w, v, ns=[1], convention=c) for c in ("paper", "followup"))
    assert float(paper["recall"][0, 0]) == 1.0 and float(followup["recall"][0, 0]) == 0.0  # closed vs strict
    assert float(followup["gamma"][0, 0]) == 0.0 and float(followup["ginv"][0, 0]) == 1.0
    with pytest.raises(InputError, match="convention must be"):
        separation_margins(w, v, ns=[1], convention="closed")
