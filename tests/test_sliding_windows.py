"""Sliding-window layers are measured over the keys each query sees (``q - W < j <= q``).

A tiny random Gemma 3 with a window of 4 keys on layers 0 and 1 (layer 2 global) and windows of 12
tokens: the queries ``q >= 4`` of layers 0-1 see 4 keys, not ``q + 1``. A window-blind version (rows
cut to ``0..q``) counts the hidden keys, whose weight is 0, as unselected points: its numbers differ.
"""

from __future__ import annotations

import math

import pytest
import torch
from reference import row_metrics

import tl_geometry as tlg
from tl_geometry.intervention.restrict import restrict_pattern, restrict_pattern_per_head
from tl_geometry.io.store import run_identity
from tl_geometry.models import ModelInfo, hook_pattern_name, hook_v_name
from tl_geometry.testing import tiny_gemma3_bridge, tiny_llama_bridge

WINDOW, SEQ_LEN = 4, 12


@pytest.fixture(scope="module")
def gemma():
    return tiny_gemma3_bridge(n_layers=3, sliding_window=WINDOW)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(3, 259, (2, SEQ_LEN), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def cache(gemma, tokens):
    with torch.no_grad():
        _, cache = gemma.run_with_cache(tokens)
    return cache


def test_windows_are_read_from_the_configuration(gemma) -> None:
    info = tlg.describe_model(gemma)
    assert info.sliding_windows == (WINDOW, WINDOW, None)
    assert [info.first_visible_key(0, q) for q in (0, 3, 4, 11)] == [0, 0, 1, 8]
    assert [info.first_visible_key(2, q) for q in (0, 11)] == [0, 0]
    assert tlg.describe_model(tiny_llama_bridge()).sliding_windows == ()


def test_the_pattern_hides_the_keys_before_the_window(cache) -> None:
    """The premise: what the model does (so a window-blind row holds zeros where the keys are hidden)."""
    pattern = cache[hook_pattern_name(0)]
    q = torch.arange(SEQ_LEN)
    hidden = q[None, :] <= q[:, None] - WINDOW  # [q, k]
    assert bool((pattern[..., hidden] == 0).all()) and bool((pattern[..., ~hidden & (q[None] <= q[:, None])] > 0).all())


def test_global_models_keep_their_run_identity() -> None:
    info = ModelInfo("toy", "TransformerBridge", 1, 2, 1, 3, 8, 0, True)
    geometry = run_identity(torch.nn.Linear(1, 1), info, torch.zeros(1, 4, dtype=torch.int64), {})["model geometry"]
    assert "sliding_windows" not in geometry  # runs saved before windows were read still resume
    windowed = ModelInfo("toy", "TransformerBridge", 1, 2, 1, 3, 8, 0, True, (4,))
    assert run_identity(torch.nn.Linear(1, 1), windowed, torch.zeros(1, 4, dtype=torch.int64), {})["model geometry"][
        "sliding_windows"
    ] == [4]


def reference_rows(cache, layer: int, seq: int, head: int, q: int, ns, first: int) -> dict[int, dict]:
    w = cache[hook_pattern_name(layer)][seq, head, q, first : q + 1]
    v = cache[hook_v_name(layer)][seq, first : q + 1, 0]  # one key/value head
    return {n: row_metrics(w, v, n) for n in ns if n <= len(w)}


@pytest.mark.parametrize("queries", ["all", "last"], ids=["every-query engine", "last query"])
def test_separability_counts_only_the_visible_keys(gemma, tokens, cache, queries) -> None:
    result = tlg.analyze(gemma, tokens, query_positions=queries, ns="all", progress=False)
    table = result.separability
    info = tlg.describe_model(gemma)
    checked, blind_differs = 0, 0
    for row in table.itertuples():
        first = info.first_visible_key(row.layer, row.query_pos)
        want = reference_rows(cache, row.layer, row.seq, row.head, row.query_pos, [row.n], first)[row.n]
        for metric in ("precision", "recall", "r_min", "r_max", "retained_mass"):
            got, expected = getattr(row, metric), want[metric]
            assert (math.isinf(got) and math.isinf(expected)) or got == pytest.approx(expected, rel=1e-9, abs=1e-12)
        checked += 1
        if first > 0:
            blind = reference_rows(cache, row.layer, row.seq, row.head, row.query_pos, [row.n], 0)[row.n]
            blind_differs += any(blind[m] != pytest.approx(want[m]) for m in ("precision", "recall", "r_min"))
    # no N above the visible keys: a window of 4 keys has N <= 4 only
    windowed = table[(table.layer < 2) & (table.query_pos >= WINDOW)]
    assert len(windowed) and windowed.n.max() == WINDOW
    assert checked == len(table) and blind_differs > 0


def test_a_size_beyond_the_window_is_refused_before_the_forward_pass(gemma, tokens) -> None:
    with pytest.raises(tlg.InputError, match=r"sliding-window layer sees at most 4 keys \(layers \[0, 1\]\)"):
        tlg.analyze(gemma, tokens, ns=[1, 6], progress=False)
    assert len(tlg.analyze(gemma, tokens, ns=[1, 6], layers=[2], progress=False).separability) == 2 * 4 * 2


def test_attention_profile_is_over_the_visible_keys(gemma, tokens) -> None:
    result = tlg.analyze(gemma, tokens, diagnostics=True, ns=[1], progress=False)
    profile = result.attention_profile.set_index(["layer", "head"])
    assert (profile.loc[[0, 1], "n_keys"] == WINDOW).all() and (profile.loc[2, "n_keys"] == SEQ_LEN).all()
    assert (profile.loc[[0, 1], "n_floored"] == 0).all()  # a window-blind row floors the 8 hidden zeros
    curve = result.attention_profile_curve
    assert sorted(curve[curve.layer == 0].position.unique()) == list(range(SEQ_LEN - WINDOW, SEQ_LEN))


def test_a_row_with_at_most_n_visible_keys_is_unchanged() -> None:
    """Renormalising a row that keeps every visible key must return it as it is (not divided by a sum
    that rounds off 1), and so must each head of the per-head form."""
    torch.manual_seed(0)
    scores = torch.randn(1, 2, SEQ_LEN, SEQ_LEN).masked_fill(torch.ones(SEQ_LEN, SEQ_LEN).triu(1).bool(), -torch.inf)
    scores = scores.masked_fill(torch.ones(SEQ_LEN, SEQ_LEN).tril(-WINDOW).bool(), -torch.inf)
    pattern = torch.softmax(scores * 3, dim=-1)
    for n in (WINDOW, WINDOW + 2):
        assert torch.equal(restrict_pattern(pattern, pattern, n, renormalize=True, window=WINDOW), pattern)
        sizes = torch.tensor([n, n])
        assert torch.equal(restrict_pattern_per_head(pattern, pattern, sizes, True, window=WINDOW), pattern)
    kept = restrict_pattern(pattern, pattern, WINDOW - 1, window=WINDOW)
    assert torch.equal((kept > 0).sum(-1)[0, 0], torch.tensor([1, 2, 3] + [WINDOW - 1] * (SEQ_LEN - 3)))


def test_random_ranking_draws_only_visible_keys(gemma, tokens) -> None:
    """Under the random ranking, a restricted row keeps N keys it sees (a window-blind draw picks
    hidden keys, whose weight is 0, and keeps fewer)."""
    kept_counts = []

    def record(pattern, hook):
        kept_counts.append((pattern[:, :, WINDOW:] > 0).sum(-1))

    with tlg.top_n_attention(gemma, n=2, rank_by="random", layers=[0]):
        gemma.run_with_hooks(tokens, fwd_hooks=[(hook_pattern_name(0), record)])
    assert kept_counts and bool((kept_counts[0] == 2).all())


def test_budgets_count_a_full_head_as_the_keys_its_window_shows(gemma, tokens) -> None:
    """``K_full`` of a layer with a window of 4 keys in windows of 12 tokens is
    ``(1 + 2 + 3 + 4 + 8 * 4) / 12 = 3.5``, not ``(12 + 1) / 2 = 6.5``."""
    from tl_geometry.competition.budgets import full_keys, head_budgets, head_full_keys

    assert full_keys(SEQ_LEN, WINDOW) == 3.5 and full_keys(SEQ_LEN) == 6.5
    k_full = head_full_keys(tlg.describe_model(gemma).sliding_windows, 3, 4, SEQ_LEN)
    assert k_full.tolist() == [3.5] * 8 + [6.5] * 4
    with pytest.raises(tlg.InputError, match=r"outside \[1, 4\.5\]"):  # the mean K_full over heads
        head_budgets(gemma, tokens, mean_budget=5, rule="uniform", progress=False)
    budgets = head_budgets(gemma, tokens, mean_budget=4, rule="uniform", progress=False)
    windowed = budgets.n[:2]
    assert bool(((windowed == 0) | ((windowed >= 1) & (windowed <= 3))).all())  # below K_full, or full
    assert budgets.costs()[:2][windowed == 0].eq(3.5).all()
    assert abs(budgets.realised_mean() - 4) <= 1 / (2 * 12) + 1e-9
