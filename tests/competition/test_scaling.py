"""Context scaling's paired bootstrap and slope against loops; the per-document sums against the curve."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from tl_geometry.competition import context_scaling
from tl_geometry.competition.scaling import context_bootstrap
from tl_geometry.corpus import from_tokens
from tl_geometry.testing import tiny_llama_bridge

SIZES = (2, 4, 8, 16)


def synthetic_windows(seed=0, n_docs=5, contexts=(32, 64, 128), targets=4):
    """Per-document sums: full loss ~ 2 per target; N = s adds a document-specific excess that shrinks with s."""
    rng = np.random.default_rng(seed)
    rows = []
    base = rng.uniform(1.5, 2.5, n_docs) * targets
    for L in contexts:
        for w in range(n_docs):
            rows.append({"context": L, "rank_by": "full", "renormalize": False, "n": L + targets, "window": w,
                         "total": base[w], "targets": targets})  # fmt: skip
            for n in SIZES:
                excess = rng.uniform(0, 1) * L / (n * 40)
                rows.append({"context": L, "rank_by": "attention", "renormalize": False, "n": n, "window": w,
                             "total": base[w] * (1 + excess), "targets": targets})  # fmt: skip
    return pd.DataFrame(rows)


def loop_star(windows, L, idx, tau, absolute):
    here = windows[windows.context == L]
    full = sum(float(here[(here.rank_by == "full") & (here.window == i)].total.iloc[0]) for i in idx)
    for n in SIZES:
        s = sum(
            float(here[(here.n == n) & (here.rank_by == "attention") & (here.window == i)].total.iloc[0]) for i in idx
        )
        if (s - full) / (len(idx) * 4 if absolute else full) <= tau:
            return float(n)
    return math.inf


def loop_slope(xs, ys):
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


@pytest.mark.parametrize("absolute, tau", [(False, 0.05), (True, 0.1)])
def test_bootstrap_intervals_and_slope_equal_a_loop_over_the_same_draws(absolute, tau) -> None:
    windows = synthetic_windows()
    stars, slopes = context_bootstrap(windows, tau, absolute=absolute, n_boot=40, seed=3)
    rng = np.random.default_rng(3)
    draws = [rng.integers(0, 5, 5) for _ in range(40)]
    per_draw = {L: [loop_star(windows, L, d, tau, absolute) for d in draws] for L in (32, 64, 128)}
    for row in stars.itertuples():
        point = loop_star(windows, row.context, range(5), tau, absolute)
        assert (row.censored and math.isinf(point)) or row.n_star == point
        ordered = sorted(per_draw[row.context])  # inverted-cdf quantile: the ceil(q B)-th smallest draw
        assert row.n_star_low == ordered[math.ceil(0.025 * 40) - 1]
        assert row.n_star_high == ordered[math.ceil(0.975 * 40) - 1]
    point_stars = [loop_star(windows, L, range(5), tau, absolute) for L in (32, 64, 128)]
    expected = loop_slope((32, 64, 128), point_stars) if all(map(math.isfinite, point_stars)) else math.nan
    assert slopes.slope.iloc[0] == pytest.approx(expected, nan_ok=True, abs=1e-12)
    finite = [loop_slope((32, 64, 128), s) for s in zip(*per_draw.values()) if all(map(math.isfinite, s))]
    assert slopes.n_boot_censored.iloc[0] == 40 - len(finite)
    if finite:
        assert slopes.slope_low.iloc[0] == pytest.approx(np.quantile(finite, 0.025), abs=1e-12)


def test_per_document_sums_add_up_to_the_curve_and_the_point_n_star_is_the_tables() -> None:
    docs = from_tokens(torch.randint(3, 259, (3, 40), generator=torch.Generator().manual_seed(0)))
    table, windows = context_scaling(tiny_llama_bridge(), docs, contexts=(8, 16), targets=4, ns=[1, 2, 4], rank_by="attention",
                            renormalize=False, per_document=True, progress=False)  # fmt: skip
    for row in table.itertuples():
        totals = windows[(windows.context == row.context) & (windows.n == row.n) & (windows.rank_by == "attention")]
        assert len(totals) == 3 and totals.total.sum() / row.n_tokens == pytest.approx(row.nll, rel=1e-12)
    stars, _ = context_bootstrap(windows, 0.05, n_boot=0)
    merged = stars.merge(table.drop_duplicates("context"), on="context", suffixes=("", "_table"))
    assert (merged.n_star_text == merged.n_star_text_table).all()


def test_all_token_scoring_is_the_plain_curve_of_the_same_windows() -> None:
    from tl_geometry.competition.context import context_windows
    from tl_geometry.intervention import sparsification_curve

    model = tiny_llama_bridge()
    rows = torch.randint(3, 259, (2, 30), generator=torch.Generator().manual_seed(1))
    table = context_scaling(model, from_tokens(rows), contexts=(8, 16), targets=4, ns=[2], rank_by="attention",
                            renormalize=False, scoring="all", progress=False)  # fmt: skip
    for row in table.itertuples():
        windows = context_windows([r.tolist() for r in rows], row.context, 4, 0)
        plain = sparsification_curve(model, windows, ns=[2], rank_by="attention", renormalize=False, progress=False)
        assert row.n_tokens == 2 * (row.context + 4 - 1) and row.targets == row.context + 4 - 1
        assert row.nll == plain.table.nll.iloc[0] and row.nll_full == plain.nll_full
