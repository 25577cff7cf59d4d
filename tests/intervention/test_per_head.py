"""Per-head budgets in top_n_attention: each (layer, head) its own n and ranking, equal to the same
restriction built by hand head by head on the transformers model; every budget checked first."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from intervention_reference import hf_nll, hf_top_n, intervened_nll, restrict_heads_by_sorting

import tl_geometry as tlg
from tl_geometry.errors import InputError
from tl_geometry.intervention.restrict import restrict_pattern_per_head

BUDGET = torch.tensor([[3, 0, 1, 7], [0, 2, 5, -1]])  # 0 and -1: full
RANKINGS = {(0, 0): "sink_window", (0, 3): "contribution", (1, 1): "sink_window", (1, 2): "contribution"}


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("rank_by", ["attention", RANKINGS], ids=["attention", "mixed"])
def test_per_head_budget_matches_the_hand_built_reference(pair, tokens, renormalize, rank_by) -> None:
    plain, bridge = pair
    full = hf_nll(plain, tokens)
    with hf_top_n(BUDGET, rank_by, renormalize):
        expected = hf_nll(plain, tokens)
    got = intervened_nll(bridge, tokens, n=BUDGET, rank_by=rank_by, renormalize=renormalize)
    assert abs(expected - full) > 1e-3
    assert got == pytest.approx(expected, abs=2e-6)


def test_mapping_tensor_and_array_are_one_budget(pair, tokens) -> None:
    _, bridge = pair
    mapping = {(0, 0): 3, (0, 2): 1, (0, 3): 7, (1, 1): 2, (1, 2): 5}
    a = intervened_nll(bridge, tokens, n=mapping, rank_by=RANKINGS)
    assert intervened_nll(bridge, tokens, n=BUDGET, rank_by=RANKINGS) == a
    assert intervened_nll(bridge, tokens, n=BUDGET.numpy().astype(np.int32), rank_by=RANKINGS) == a


def test_uniform_mapping_equals_int_n_with_layers_and_heads(pair, tokens) -> None:
    _, bridge = pair
    mapping = {(1, 0): 2, (1, 3): 2}
    assert intervened_nll(bridge, tokens, n=mapping) == intervened_nll(bridge, tokens, n=2, layers=1, heads=[0, 3])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-1, 10), min_size=3, max_size=3), st.booleans(), st.integers(0, 10_000))
def test_restrict_pattern_per_head_equals_the_sorting_reference(sizes, renormalize, seed) -> None:
    """Few distinct weights: ties at the cut in many rows, so the fast path and the fallback both run."""
    gen = torch.Generator().manual_seed(seed)
    causal = torch.ones(9, 9).tril().bool()
    pattern = torch.randint(1, 4, (2, 3, 9, 9), generator=gen).float().masked_fill(~causal, 0)
    pattern = pattern / pattern.sum(-1, keepdim=True)
    got = restrict_pattern_per_head(pattern, pattern, torch.tensor(sizes), renormalize)
    assert torch.equal(got, restrict_heads_by_sorting(pattern, pattern, sizes, renormalize))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n={(2, 0): 3}), r"key \(2, 0\)"),
        (dict(n={(0, 4): 3}), r"key \(0, 4\)"),
        (dict(n={0: 3}), "keys must be \\(layer, head\\)"),
        (dict(n={(0, 1): 2.5}), "is not an integer"),
        (dict(n=torch.ones(2, 3, dtype=torch.int64)), r"shape \[n_layers, n_heads\] = \[2, 4\]"),
        (dict(n=torch.ones(2, 4)), "must hold integers"),
        (dict(n={(0, 1): 2}, layers=[0]), "a per-head n names its heads"),
        (dict(n=2, rank_by={(0, 1): "value"}), "is not a ranking"),
        (dict(n=2, rank_by={(5, 1): "attention"}), r"rank_by has the key \(5, 1\)"),
    ],
)
def test_bad_budgets_one_clear_error_before_any_pass(pair, kwargs, match) -> None:
    _, bridge = pair
    with pytest.raises(InputError, match=match):
        with tlg.top_n_attention(bridge, **kwargs):
            pytest.fail("the body must not run")
    assert all(len(p.fwd_hooks) == 0 for p in bridge.hook_dict.values())
