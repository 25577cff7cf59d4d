"""Retrieval under competition (bAbI qa1 style): every measure against a loop over a hand-built
sequence, the answer loss against the restriction written by hand on the transformers model,
censored N* kept, the examples' schema, resume."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from intervention_reference import hf_top_n, llama_pair

from tl_geometry import testing
from tl_geometry.competition import retrieval as module
from tl_geometry.competition.babi import PEOPLE, PLACES, babi_examples, parse_examples, read_examples
from tl_geometry.competition.retrieval import ANSWER_COLUMNS, HEAD_COLUMNS, retrieval_under_competition
from tl_geometry.competition.support import (
    candidate_scores,
    censored_n_star,
    support_measures,
    wilson_interval,
)
from tl_geometry.corpus import encode_text
from tl_geometry.errors import InputError
from tl_geometry.io.store import StoreError
from tl_geometry.models import describe_model

PLACES_BYTES = ("attic", "barn", "cellar", "den", "garden", "hall")  # distinct first bytes
BACKGROUND = "def f(x):\n    return x + 1\n" * 10
AMOUNTS = (0, 7, 30)
NS = (2, 5, 200)


def examples(n=3):
    return babi_examples(
        n, seed=1, people=("Al", "Bo", "Cy"), places=PLACES_BYTES, n_competitors=6, space_in_answer=False
    )


@pytest.fixture(scope="module")
def pair():
    return llama_pair()


@pytest.fixture(scope="module")
def result(pair):
    return retrieval_under_competition(
        pair[1],
        examples(),
        background=BACKGROUND,
        amounts=AMOUNTS,
        ns=NS,
        top=5,
        progress=False,
        rank_by=("attention", "sink_window"),
    )


def hand_sequence(model, example, condition, m):
    """BOS, fact, newline, m background tokens, newline, question; the support positions."""
    fact, question = encode_text(model, example.fact), encode_text(model, example.question)
    if condition == "neutral":
        filler = encode_text(model, BACKGROUND)[:m]
    else:
        filler = encode_text(model, " ".join(example.competitors * 10))[:m]  # bytes: joined text = joined pieces
    newline = encode_text(model, "\n")
    ids = [0] + fact + newline + filler + newline + question
    return torch.tensor([ids]), list(range(1, 1 + len(fact)))


def hand_candidates(logits, example, model):
    firsts = [encode_text(model, c)[0] for c in example.candidates]
    scores = [float(logits[t]) for t in firsts]
    a = example.candidates.index(example.answer)
    log_sum = math.log(sum(math.exp(s - max(scores)) for s in scores)) + max(scores)
    return log_sum - scores[a], all(scores[a] > s for j, s in enumerate(scores) if j != a)


def test_support_measures_equal_a_loop_over_hook_pattern(pair, result) -> None:
    model = pair[1]
    assert list(result.heads.columns) == HEAD_COLUMNS
    assert len(result.heads) == 2 * 3 * 3 * 2 * 4  # conditions x amounts x examples x layers x heads
    for (condition, m, i), rows in result.heads.groupby(["condition", "amount", "example_id"]):
        tokens, support = hand_sequence(model, examples()[i], condition, m)
        q = tokens.shape[1] - 1
        _, cache = model.run_with_cache(tokens)
        for row in rows.itertuples():
            weights = cache[f"blocks.{row.layer}.attn.hook_pattern"][0, row.head, q, : q + 1].tolist()
            order = sorted(range(q + 1), key=lambda j: (-weights[j], j))
            rank = {key: r + 1 for r, key in enumerate(order)}
            others = [j for j in range(q + 1) if j not in support]
            outranked = [sum(weights[j] >= weights[s] for j in others) for s in support]
            assert row.mass == pytest.approx(sum(weights[s] for s in support), abs=1e-6)
            assert row.rank_displacement == min(rank[s] for s in support)
            assert row.recall_at_top == pytest.approx(sum(rank[s] <= 5 for s in support) / len(support), abs=1e-12)
            assert row.pairwise_outrank == pytest.approx(sum(outranked) / (len(support) * len(others)), abs=1e-12)
            assert row.mean_outranked == pytest.approx(sum(outranked) / len(support), abs=1e-12)
            assert row.n_keys == q + 1 and row.n_support == row.n_support_visible == len(support)


def test_support_measures_on_sliding_windows_equal_a_loop_over_the_visible_keys() -> None:
    """A fact pushed out of a sliding window has no mass and no rank on that layer; a window-blind
    version would rank its zero weights among the window's (and count them as outranked)."""
    model = testing.tiny_gemma3_bridge(n_layers=3, sliding_window=6)
    info = describe_model(model)
    got = retrieval_under_competition(
        model, examples(2), background=BACKGROUND, amounts=(0, 12), ns=(2,), top=3, progress=False
    ).heads
    assert list(got.columns) == HEAD_COLUMNS
    hidden = 0
    for (condition, m, i), rows in got.groupby(["condition", "amount", "example_id"]):
        tokens, support = hand_sequence(model, examples(2)[i], condition, m)
        q = tokens.shape[1] - 1
        _, cache = model.run_with_cache(tokens)
        for row in rows.itertuples():
            window = info.sliding_windows[row.layer]
            first = 0 if window is None else max(0, q - window + 1)
            keys = list(range(first, q + 1))
            seen = [s for s in support if s >= first]
            weights = cache[f"blocks.{row.layer}.attn.hook_pattern"][0, row.head, q].tolist()
            assert row.n_keys == len(keys) and row.n_support_visible == len(seen)
            if not seen:
                hidden += 1
                assert row.mass == 0 and math.isnan(row.rank_displacement) and math.isnan(row.pairwise_outrank)
                continue
            order = sorted(keys, key=lambda j: (-weights[j], j))
            rank = {key: r + 1 for r, key in enumerate(order)}
            others = [j for j in keys if j not in seen]
            outranked = [sum(weights[j] >= weights[s] for j in others) for s in seen]
            assert row.mass == pytest.approx(sum(weights[s] for s in seen), abs=1e-6)
            assert row.rank_displacement == min(rank[s] for s in seen)
            assert row.recall_at_top == pytest.approx(sum(rank[s] <= 3 for s in seen) / len(seen), abs=1e-12)
            assert row.mean_outranked == pytest.approx(sum(outranked) / len(seen), abs=1e-12)
    assert hidden > 0  # the windows did hide the fact somewhere


@given(st.lists(st.integers(0, 4), min_size=2, max_size=12), st.data())
def test_support_measures_with_ties_equal_the_pairwise_loop(values, data) -> None:
    n_support = data.draw(st.integers(1, len(values)))
    support = sorted(data.draw(st.permutations(range(len(values))))[:n_support])
    row = torch.tensor(values, dtype=torch.float64)
    got = support_measures(row, torch.tensor(support), top=3)
    others = [j for j in range(len(values)) if j not in support]
    outranked = [sum(values[j] >= values[s] for j in others) for s in support]  # ties count as outranking
    rank = {k: r + 1 for r, k in enumerate(sorted(range(len(values)), key=lambda j: (-values[j], j)))}
    assert float(got["rank_displacement"]) == min(rank[s] for s in support)
    assert float(got["recall_at_top"]) == pytest.approx(sum(rank[s] <= 3 for s in support) / n_support, abs=1e-12)
    assert float(got["mean_outranked"]) == pytest.approx(np.mean(outranked), abs=1e-12)
    if others:
        assert float(got["pairwise_outrank"]) == pytest.approx(sum(outranked) / (n_support * len(others)), abs=1e-12)
    else:
        assert math.isnan(float(got["pairwise_outrank"]))


def test_answer_loss_equals_the_restriction_written_by_hand_on_transformers(pair, result) -> None:
    plain, model = pair
    assert list(result.answers.columns) == ANSWER_COLUMNS
    for row in result.answers.itertuples():
        example = examples()[row.example_id]
        tokens, _ = hand_sequence(model, example, row.condition, row.amount)
        with torch.inference_mode():
            full = hand_candidates(plain(tokens).logits[0, -1].double(), example, model)
            with hf_top_n(row.n, rank_by=row.rank_by):
                restricted = hand_candidates(plain(tokens).logits[0, -1].double(), example, model)
        assert row.answer_loss_full == pytest.approx(full[0], abs=1e-4) and row.correct_full == full[1]
        assert row.answer_loss == pytest.approx(restricted[0], abs=1e-4) and row.correct == restricted[1]
        assert row.delta_loss == pytest.approx(row.answer_loss - row.answer_loss_full, abs=1e-12)
    big = result.answers[result.answers.n == 200]  # at least the sequence: full attention
    assert (big.answer_loss == big.answer_loss_full).all()


def test_candidate_scores_equal_a_loop() -> None:
    logits = torch.tensor([0.5, 2.0, -1.0, 2.0, 0.0], dtype=torch.float64)
    loss, correct = candidate_scores(logits, torch.tensor([4, 1, 3]), answer=1)
    assert loss == pytest.approx(-(2.0 - math.log(math.exp(0.0) + math.exp(2.0) + math.exp(2.0))), abs=1e-12)
    assert correct is False  # a tie with another candidate is not a correct answer
    assert candidate_scores(logits, torch.tensor([4, 1, 2]), answer=1)[1] is True


@pytest.mark.parametrize("k, n", [(0, 10), (3, 10), (10, 10), (43, 86)])
def test_wilson_interval_equals_the_formula(k, n) -> None:
    z, p = 1.959963984540054, k / n
    centre, half = (
        (p + z * z / (2 * n)) / (1 + z * z / n),
        z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)),
    )
    assert wilson_interval(k, n) == pytest.approx((centre - half, centre + half), abs=1e-12)


def test_n_star_is_the_smallest_passing_size_and_a_censored_one_stays(result) -> None:
    summary = result.summary()
    assert summary.groupby(["condition", "amount", "rank_by"]).size().eq(len(NS)).all()
    stars = result.n_star(tolerance=0.10)
    assert len(stars) == 2 * len(AMOUNTS) * 2  # every (condition, amount, ranking), censored or not
    for row in stars.itertuples():
        here = (summary.condition == row.condition) & (summary.amount == row.amount) & (summary.rank_by == row.rank_by)
        points = summary[here].sort_values("n")
        passing = points[points.delta_loss <= 0.10].n
        if len(passing):
            assert row.n_star == passing.min() and not row.censored and row.n_star_text == str(row.n_star)
        else:
            assert row.censored and pd.isna(row.n_star) and row.n_star_text == "> 200"
    assert censored_n_star([4, 8, 16], [False, False, False]) == {
        "n_star": pd.NA, "censored": True, "n_max": 16, "n_star_text": "> 16"
    }  # fmt: skip
    assert censored_n_star([4, 8, 16], [False, True, True])["n_star"] == 8


def test_generated_examples_are_seeded_and_competitors_never_answer() -> None:
    a, b = babi_examples(20, seed=3), babi_examples(20, seed=3)
    assert a == b and a != babi_examples(20, seed=4)
    for e in a:
        person = e.fact.split(" moved")[0]
        assert e.fact == f"{person} moved to the{e.answer}." and person in PEOPLE
        assert e.question == f"Question: Where is {person}? Answer: {person} is in the"
        assert e.candidates == tuple(f" {p}" for p in PLACES)
        assert len(e.competitors) == 640 and not any(c.startswith(person + " ") for c in e.competitors)


def test_the_examples_schema_refuses_what_it_does_not_understand(tmp_path) -> None:
    ok = parse_examples([
        {"fact": "Bo moved to the den.", "question": "Where is Bo? In the", "answer": " den"},
        {"fact": "Al moved to the hall.", "question": "Where is Al? In the", "answer": " hall"},
    ])  # fmt: skip
    assert ok[0].candidates == (" den", " hall") and ok[0].competitors == ("Al moved to the hall.",)
    for data, message in [
        (["abc"], 'item 0 is "abc", not an object'),
        ([["f", "q", "a"]], "not an object"),
        ([{"fact": "f", "question": "q", "answer": "a", "extra": 1}], "unknown keys \\['extra'\\]"),
        ([{"fact": "f", "question": "q"}], "needs 'answer'"),
        ([{"fact": "f", "question": "q", "answer": "a"}], "at least two distinct candidates"),
        ([{"fact": "f", "question": "q", "answer": "a", "candidates": ["b", "c"]}], "at least two distinct"),
        ({"fact": "f"}, "non-empty JSON list"),
        ([], "non-empty JSON list"),
    ]:
        with pytest.raises(InputError, match=message):
            parse_examples(data)
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    with pytest.raises(InputError, match="cannot read a JSON list"):
        read_examples(bad)


def test_bad_input_is_refused_before_any_pass(pair, monkeypatch) -> None:
    monkeypatch.setattr(module, "top_n_attention", lambda *a, **k: pytest.fail("a pass ran before the check"))
    model = pair[1]
    spaced = babi_examples(1, places=PLACES_BYTES, n_competitors=2)  # " attic", " barn": first byte " " for all
    for kwargs, message in [
        ({"examples": spaced}, "share their first token"),
        ({"amounts": (0, 100)}, "more than the model's context of 128"),
        ({"conditions": ("noise",)}, "conditions must be"),
        ({"top": 0}, "top"),
        ({"tolerance": -1}, "tolerance"),
    ]:
        args = {"examples": examples(), "background": BACKGROUND, "amounts": (0, 8), "progress": False, **kwargs}
        with pytest.raises(InputError, match=message):
            retrieval_under_competition(model, **args)


def test_an_interrupted_run_resumes_to_the_same_tables_and_other_settings_are_refused(pair, tmp_path, monkeypatch):
    model = pair[1]
    args = {"background": BACKGROUND, "amounts": (0, 9), "ns": (3,), "progress": False, "out_dir": tmp_path}
    calls = {"n": 0}
    original = module.candidate_scores

    def stop_after_five(*a, **k):
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt
        return original(*a, **k)

    monkeypatch.setattr(module, "candidate_scores", stop_after_five)
    with pytest.raises(KeyboardInterrupt):
        retrieval_under_competition(model, examples(2), **args)
    saved = json.loads((tmp_path / "retrieval.json").read_text())["done"]
    assert saved == ["neutral/0/0", "neutral/0/1"]  # two scores per unit: the third unit was cut
    monkeypatch.setattr(module, "candidate_scores", original)
    resumed = retrieval_under_competition(model, examples(2), **args)
    whole = retrieval_under_competition(model, examples(2), **{**args, "out_dir": None})
    pd.testing.assert_frame_equal(resumed.heads, whole.heads)
    pd.testing.assert_frame_equal(resumed.answers, whole.answers)
    with pytest.raises(StoreError, match=r"ns \(\[4\] vs \[3\]\)"):
        retrieval_under_competition(model, examples(2), **{**args, "ns": (4,)})
    with pytest.raises(StoreError, match="examples"):
        retrieval_under_competition(model, examples(3), **args)
