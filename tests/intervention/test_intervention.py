"""The top-N attention intervention (definitions §8): exact against a hand-built transformers
reference, restored on exit, refusing models that ignore pattern edits, and bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from intervention_reference import hf_nll, hf_top_n, ignoring_pattern_edits, intervened_nll, restrict_rows_by_sorting

import tl_geometry as tlg
from tl_geometry.core.rankings import top_n_mask
from tl_geometry.errors import InputError, ModelError
from tl_geometry.intervention import restrict_pattern
from tl_geometry.intervention.loss import corpus_nll


@pytest.mark.parametrize("rank_by", ["attention", "contribution"])
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("n", [1, 3, 7])
def test_matches_hand_built_transformers_reference(pair, tokens, rank_by, renormalize, n) -> None:
    plain, bridge = pair
    full = hf_nll(plain, tokens)
    with hf_top_n(n, rank_by, renormalize):
        expected = hf_nll(plain, tokens)
    got = intervened_nll(bridge, tokens, n=n, rank_by=rank_by, renormalize=renormalize)
    assert abs(expected - full) > 1e-3  # the restriction changes the loss, so agreeing means something
    assert got == pytest.approx(expected, abs=2e-6)


def test_plain_model_agrees_with_bridge_without_intervention(pair, tokens) -> None:
    plain, bridge = pair
    assert corpus_nll(bridge, tokens, progress=False).nll == pytest.approx(hf_nll(plain, tokens), abs=2e-6)


def test_size_at_least_the_window_changes_nothing(pair, tokens) -> None:
    _, bridge = pair
    full = corpus_nll(bridge, tokens, progress=False).total
    with tlg.top_n_attention(bridge, n=tokens.shape[1], rank_by="random", renormalize=True):
        assert corpus_nll(bridge, tokens, progress=False).total == full


def test_model_restored_exactly_also_when_the_body_raises(pair, tokens) -> None:
    _, bridge = pair
    with torch.inference_mode():
        before = bridge(tokens)
    counts = {name: len(point.fwd_hooks) for name, point in bridge.hook_dict.items()}
    with pytest.raises(RuntimeError, match="boom"):
        with tlg.top_n_attention(bridge, n=2, rank_by="contribution"):
            with torch.inference_mode():
                during = bridge(tokens)
            raise RuntimeError("boom")
    with torch.inference_mode():
        after = bridge(tokens)
    assert not torch.equal(before, during)
    assert torch.equal(before, after)
    assert {name: len(point.fwd_hooks) for name, point in bridge.hook_dict.items()} == counts


def test_a_users_own_hook_survives(pair, tokens) -> None:
    _, bridge = pair
    seen = []
    point = bridge.hook_dict["blocks.0.attn.hook_pattern"]
    point.add_hook(lambda x, hook: seen.append(1))
    try:
        with tlg.top_n_attention(bridge, n=2):
            pass
        with torch.inference_mode():
            bridge(tokens)
        assert len(point.fwd_hooks) == 1 and seen
    finally:
        point.remove_hooks()


def test_only_the_chosen_heads_change(pair, tokens) -> None:
    _, bridge = pair
    patterns = {}

    def keep(act, hook):
        patterns[hook.name] = act.detach().clone()

    name = "blocks.1.attn.hook_pattern"
    with torch.inference_mode():
        bridge.run_with_hooks(tokens, fwd_hooks=[(name, keep)])
        full = patterns[name]
        with tlg.top_n_attention(bridge, n=2, layers=[1], heads=[0, 3]):
            bridge.run_with_hooks(tokens, fwd_hooks=[(name, keep)])
    edited = patterns[name]  # run_with_hooks' hook runs after the intervention's: it sees the edited pattern
    assert torch.equal(edited[:, [1, 2]], full[:, [1, 2]])
    assert torch.equal(edited[:, [0, 3]], restrict_rows_by_sorting(full[:, [0, 3]], full[:, [0, 3]], 2, False))
    assert not torch.equal(edited[:, [0, 3]], full[:, [0, 3]])


def test_random_is_seeded_and_independent_of_batching(pair, tokens) -> None:
    _, bridge = pair

    def nll(batch_size, seed):
        with tlg.top_n_attention(bridge, n=3, rank_by="random", seed=seed) as state:
            return corpus_nll(bridge, tokens, batch_size=batch_size, progress=False,
                              before_batch=lambda ids: setattr(state, "seq_ids", ids)).total  # fmt: skip

    a = nll(1, 0)
    assert nll(3, 0) == pytest.approx(a, abs=1e-9)
    assert nll(1, 1) != pytest.approx(a, abs=1e-6)


def test_sink_window_keeps_the_sink_and_the_recent_keys() -> None:
    pattern = torch.softmax(torch.randn(1, 1, 6, 6).masked_fill(torch.ones(6, 6).triu(1).bool(), -torch.inf), -1)
    scores = torch.arange(6, dtype=torch.float64).expand(6, 6).clone()
    scores[:, 0] = torch.inf
    scores = scores.masked_fill(torch.ones(6, 6).triu(1).bool(), -torch.inf)
    out = restrict_pattern(pattern, scores[None, None], n=3)
    assert (out[0, 0, 5] > 0).tolist() == [True, False, False, False, True, True]
    assert (out[0, 0, 3] > 0).tolist() == [True, False, True, True, False, False]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=12),  # few values: many ties
    st.integers(1, 14),
)
def test_fast_top_n_equals_the_stable_sort(values, n) -> None:
    scores = torch.tensor(values, dtype=torch.float64)
    expected = set(sorted(range(len(values)), key=lambda i: (-values[i], i))[:n])
    assert set(torch.nonzero(top_n_mask(scores, n)).flatten().tolist()) == expected


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 8), st.booleans(), st.integers(0, 10_000))
def test_restrict_pattern_equals_the_sorting_reference(n, renormalize, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 3, 9, 9, generator=gen).masked_fill(torch.ones(9, 9).triu(1).bool(), -torch.inf)
    pattern = torch.softmax(logits, -1)
    got = restrict_pattern(pattern, pattern, n, renormalize)
    expected = restrict_rows_by_sorting(pattern, pattern, n, renormalize)
    assert torch.equal(got, expected)


# ----------------------------------------------------------------------------- refusing


def test_refuses_a_model_that_ignores_pattern_edits(pair, tokens) -> None:
    model = ignoring_pattern_edits(pair[1])
    with pytest.raises(ModelError, match='attn_implementation="eager"'):
        with tlg.top_n_attention(model, n=2):
            pytest.fail("the body must not run")
    assert all(len(p.fwd_hooks) == 0 for p in model.hook_dict.values())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n=0), "n must be an integer >= 1"),
        (dict(n=2.5), "n must be an integer >= 1"),
        (dict(rank_by="value"), "is not a ranking"),
        (dict(renormalize="yes"), "renormalize must be"),
        (dict(layers=[5]), "layer 5 is not an index"),
        (dict(heads=[]), "head is empty"),
        (dict(seed=1.5), "seed must be an integer"),
    ],
)
def test_bad_arguments_one_clear_error(pair, kwargs, match) -> None:
    with pytest.raises(InputError, match=match):
        with tlg.top_n_attention(pair[1], **kwargs):
            pytest.fail("the body must not run")


def test_not_a_model() -> None:
    with pytest.raises(ModelError, match="expected a TransformerLens"):
        with tlg.top_n_attention(torch.nn.Linear(2, 2), n=2):
            pass


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.booleans(), st.integers(0, 10_000))
def test_restrict_pattern_with_ties_equals_the_sorting_reference(n, renormalize, seed) -> None:
    """Few distinct weights (ties at the cut in many rows; zeros among the visible keys under deletion,
    where a row may keep only zeros): the fast path and its fallback both equal the stable sort."""
    gen = torch.Generator().manual_seed(seed)
    causal = torch.ones(9, 9).tril().bool()
    low = 1 if renormalize else 0  # the reference divides a kept sum of 0 by 0; restrict_pattern keeps 0
    pattern = torch.randint(low, 3, (2, 3, 9, 9), generator=gen).float().masked_fill(~causal, 0) / 4
    got = restrict_pattern(pattern, pattern, n, renormalize)
    assert torch.equal(got, restrict_rows_by_sorting(pattern, pattern, n, renormalize))
