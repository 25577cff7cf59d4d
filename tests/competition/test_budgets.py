"""Per-head budgets (definitions §9): the mean budget met with the stated rounding, each rule's sizes
from its curve computed by hand, the evaluation equal to a hand loop, bad input refused first."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from intervention_reference import llama_pair, restrict_rows_by_sorting

import tl_geometry as tlg
from tl_geometry.competition import budgets as bm
from tl_geometry.competition.budgets import allocate, duo_sizes, full_keys, head_budgets
from tl_geometry.competition.evaluate import evaluate_budgets
from tl_geometry.corpus import from_tokens
from tl_geometry.errors import InputError
from tl_geometry.intervention.loss import corpus_nll


@pytest.fixture(scope="module")
def bridge():
    return llama_pair()[1]  # sharp attention: the rules disagree


@pytest.fixture(scope="module")
def windows():
    torch.manual_seed(2)
    return torch.randint(3, 259, (2, 3, 16))  # choose, held out


def mean_cost(sizes, seq_len):
    """Written out: a restricted head costs its n, a full one (n = 0) the mean causal keys (L + 1) / 2."""
    return sum(n if n > 0 else (seq_len + 1) / 2 for n in sizes) / len(sizes)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.5, 300.0), min_size=1, max_size=40),
    st.integers(2, 300),
    st.floats(0.0, 1.0),
)
def test_allocation_meets_the_mean_budget_with_the_stated_rounding(want, seq_len, where) -> None:
    k_full = (seq_len + 1) / 2
    budget = 1 + where * (k_full - 1)
    sizes = allocate(np.array(want), budget, seq_len)
    assert all(n == 0 or 1 <= n < k_full for n in sizes)
    assert abs(mean_cost(sizes.tolist(), seq_len) - budget) <= 1 / (2 * len(want)) + 1e-9
    if (sizes > 0).all() and float(budget * len(want)).is_integer():
        # the total, not the mean: the mean of 281 over 6 heads is not the float `budget` to the last bit
        assert sum(sizes.tolist()) == budget * len(want)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=30), st.integers(8, 200), st.integers(1, 40))
def test_duo_sizes_meet_the_budget_and_keep_the_most_important_heads_full(importance, seq_len, budget) -> None:
    budget = min(budget, math.floor(full_keys(seq_len)))
    sizes = duo_sizes(np.array(importance), budget, seq_len, full_share=0.5)
    assert abs(mean_cost(sizes.tolist(), seq_len) - budget) <= 1 / (2 * len(importance)) + 1e-9
    full = [i for i, n in enumerate(sizes) if n == 0]
    ranked = sorted(range(len(importance)), key=lambda i: (-importance[i], i))
    assert full == sorted(ranked[: len(full)])


def test_uniform_and_streaming_give_every_head_b(bridge, windows) -> None:
    uniform = head_budgets(bridge, from_tokens(windows[0]), mean_budget=3, rule="uniform")
    streaming = head_budgets(bridge, from_tokens(windows[0]), mean_budget=3, rule="streaming")
    assert (uniform.n == 3).all() and (streaming.n == 3).all()
    assert set(uniform.rank_by.values()) == {"attention"} and set(streaming.rank_by.values()) == {"sink_window"}
    assert len(streaming.rank_by) == 8 and streaming.realised_mean() == 3.0


def test_geometry_sizes_come_from_the_output_error_computed_by_hand(bridge, windows) -> None:
    tokens, grid = windows[0], (1, 2, 4, 8)
    cache = bridge.run_with_cache(tokens)[1]
    curves = torch.zeros(2, 4, len(grid), dtype=torch.float64)
    for layer in range(2):
        alpha = cache[f"blocks.{layer}.attn.hook_pattern"].double()  # [b, h, q, k]
        v = cache[f"blocks.{layer}.attn.hook_v"].double().repeat_interleave(2, dim=2)  # [b, k, h, d]
        v = v.permute(0, 2, 1, 3)
        z = alpha @ v
        for i, n in enumerate(grid):
            s = restrict_rows_by_sorting(alpha, alpha, n, False) @ v
            curves[layer, :, i] = ((z - s).norm(dim=-1) / z.norm(dim=-1)).mean(dim=(0, 2))
    eps = float(curves[..., 2].median())  # half the heads within it at N = 4: the rule must tell them apart
    want = [[next((n for n, e in zip(grid, row) if e <= eps), 8.5) for row in head] for head in curves.tolist()]
    got = head_budgets(bridge, from_tokens(tokens), mean_budget=4, rule="geometry", grid=grid, error_tolerance=eps)
    assert torch.allclose(bm.output_error_curves(bridge, tokens, grid), curves, rtol=0, atol=1e-9)
    assert got.want.tolist() == want
    assert len(set(got.n.flatten().tolist())) > 1  # the heads differ, so the rule is not uniform in disguise
    assert got.realised_mean() == 4.0


def test_loss_and_duo_sizes_come_from_the_localised_loss(bridge, windows) -> None:
    corpus, grid = from_tokens(windows[0]), (2, 4)
    local = {n: tlg.localized_loss(bridge, corpus, n=n, unit="head", progress=False) for n in grid}
    tol = float(np.median(local[2].delta_nll_rel))
    want = [
        next((n for n in grid if local[n].query(f"layer == {layer} and head == {h}").delta_nll_rel.iloc[0] <= tol), 8.5)
        for layer in range(2)
        for h in range(4)
    ]
    loss = head_budgets(bridge, corpus, mean_budget=3, rule="loss", grid=grid, tolerance=tol, progress=False)
    assert loss.want.flatten().tolist() == want
    assert loss.realised_mean() == 3.0
    streaming = tlg.localized_loss(bridge, corpus, n=2, unit="head", rank_by="sink_window", progress=False)
    duo = head_budgets(bridge, corpus, mean_budget=4, rule="duo", grid=grid, progress=False)
    assert duo.want.flatten().tolist() == streaming.delta_nll_rel.tolist()
    full = torch.nonzero(duo.n.flatten() == 0).flatten().tolist()
    assert full == [int(streaming.delta_nll_rel.idxmax())]  # floor(0.5 * 4 * 8 / 8.5) = 1 full head
    assert abs(duo.realised_mean() - 4) <= 1 / 16


def test_evaluation_equals_a_hand_loop(bridge, windows, tmp_path) -> None:
    choose, held_out = windows
    chosen = [
        *head_budgets(bridge, from_tokens(choose), mean_budget=[2, 5], rule="geometry", grid=(1, 4)),
        head_budgets(bridge, from_tokens(choose), mean_budget=2, rule="streaming"),
    ]
    table = evaluate_budgets(bridge, from_tokens(held_out), chosen, out_dir=tmp_path, progress=False)
    full = corpus_nll(bridge, held_out, progress=False).nll
    for budget, row in zip(chosen, table.itertuples()):
        with tlg.top_n_attention(bridge, n=budget.mapping(), rank_by=budget.rank_by):
            nll = corpus_nll(bridge, held_out, progress=False).nll
        assert (row.rule, row.mean_budget, row.nll_full) == (budget.rule, budget.mean_budget, full)
        assert row.delta_nll_rel == pytest.approx((nll - full) / full, abs=1e-12)
    assert table.delta_nll_rel.nunique() == 3
    again = evaluate_budgets(bridge, from_tokens(held_out), chosen, out_dir=tmp_path, progress=False)
    assert again.equals(table)  # resumed from budgets.json


def test_a_resumed_evaluation_runs_no_pass(bridge, windows, tmp_path, monkeypatch) -> None:
    chosen = head_budgets(bridge, from_tokens(windows[0]), mean_budget=2, rule="uniform")
    first = evaluate_budgets(bridge, from_tokens(windows[1]), [chosen], out_dir=tmp_path, progress=False)

    def no_pass(*args, **kwargs):
        raise AssertionError("a saved point was measured again")

    monkeypatch.setattr("tl_geometry.competition.evaluate.corpus_nll", no_pass)
    assert evaluate_budgets(bridge, from_tokens(windows[1]), [chosen], out_dir=tmp_path, progress=False).equals(first)


def test_other_budgets_of_one_rule_and_mean_are_measured_not_read(bridge, windows, tmp_path) -> None:
    """Issue 47: the loss saved for one allocation was read back for another of the same rule and B."""
    import dataclasses

    uniform = head_budgets(bridge, from_tokens(windows[0]), mean_budget=2, rule="uniform")
    n = uniform.n.clone()
    n[0, 0], n[0, 1] = 1, 3  # the same mean budget, other heads' sizes
    other = dataclasses.replace(uniform, n=n)
    first = evaluate_budgets(bridge, from_tokens(windows[1]), [uniform], out_dir=tmp_path, progress=False)
    second = evaluate_budgets(bridge, from_tokens(windows[1]), [other], out_dir=tmp_path, progress=False)
    fresh = evaluate_budgets(bridge, from_tokens(windows[1]), [other], progress=False)
    assert second.equals(fresh) and second.nll.iloc[0] != first.nll.iloc[0]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mean_budget=0.5), r"outside \[1, 8.5\]"),
        (dict(mean_budget=9), r"outside \[1, 8.5\]"),
        (dict(mean_budget="8"), "must be a number"),
        (dict(mean_budget=[]), "mean_budget is empty"),
        (dict(mean_budget=2, rule="greedy"), "is not a budget rule"),
        (dict(mean_budget=2, grid=[0, 4]), "n must be an integer >= 1"),
        (dict(mean_budget=2, grid=[32]), "no size below the window length"),
        (dict(mean_budget=2, full_share=1.0), "full_share must be"),
    ],
)
def test_head_budgets_refuses_bad_input_before_any_pass(bridge, windows, kwargs, match, monkeypatch) -> None:
    monkeypatch.setattr("tl_geometry.competition.budgets.run_streaming", lambda *a, **k: pytest.fail("a pass ran"))
    with pytest.raises(InputError, match=match):
        head_budgets(bridge, from_tokens(windows[0]), **{"rule": "geometry", **kwargs})


def test_evaluation_refuses_budgets_that_do_not_fit_before_any_pass(bridge, windows, monkeypatch) -> None:
    good = head_budgets(bridge, from_tokens(windows[0]), mean_budget=2, rule="uniform")
    short = head_budgets(bridge, from_tokens(windows[0][:, :10]), mean_budget=2, rule="uniform")
    off = bm.HeadBudgets("uniform", 2.0, good.n + torch.eye(2, 4, dtype=torch.int64), good.rank_by, 16, good.want)
    monkeypatch.setattr("tl_geometry.competition.evaluate.corpus_nll", lambda *a, **k: pytest.fail("a pass ran"))
    held_out = from_tokens(windows[1])
    with pytest.raises(InputError, match="chosen for windows of 10 tokens"):
        evaluate_budgets(bridge, held_out, [good, short])
    with pytest.raises(InputError, match=r"have mean 2.2500, not B=2.0"):
        evaluate_budgets(bridge, held_out, [off])
    with pytest.raises(InputError, match="share a \\(rule, mean_budget\\)"):
        evaluate_budgets(bridge, held_out, [good, good])
    with pytest.raises(InputError, match="expected HeadBudgets"):
        evaluate_budgets(bridge, held_out, [{(0, 0): 2}])


def test_allocation_total_is_exact_where_the_mean_budget_is_not_a_float_exactly() -> None:
    """Six heads, L = 276, a third of the way: 281 keys in all, though 281 / 6 is no float."""
    seq_len = 276
    budget = 1 + (1 / 3) * ((seq_len + 1) / 2 - 1)
    sizes = allocate(np.ones(6), budget, seq_len)
    assert sum(sizes.tolist()) == 281 == budget * 6
