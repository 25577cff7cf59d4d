"""The supporting fact (definitions §9): rank and mass against a direct reading of hook_pattern,
the answer's loss against the intervention on one unpadded sequence, bad input refused."""

from __future__ import annotations

import statistics

import pytest
import torch
import torch.nn.functional as F

import tl_geometry as tlg
from tl_geometry.competition.fact import HEAD_COLUMNS, LOSS_COLUMNS, Fact, supporting_fact, template_facts
from tl_geometry.corpus import encode_text
from tl_geometry.errors import InputError

FACTS = [
    Fact("The code of the red box is kiwi.", "Q: code of the red box? A: it is", " kiwi"),
    Fact("Bob lives in Oslo.", "Where does Bob live? In", " Oslo"),
]
BACKGROUND = "def f(x):\n    return x + 1\n" * 10


@pytest.fixture(scope="module")
def model():
    return tlg.testing.tiny_llama_bridge(n_heads=4, n_kv_heads=2)


@pytest.fixture(scope="module")
def result(model):
    return supporting_fact(model, FACTS, background=BACKGROUND, amounts=(0, 5, 40), ns=(1, 3), progress=False)


def hand_sequence(model, fact, m):
    """BOS, fact, newline, the first m background tokens, newline, question, answer; and the spans."""
    f, q, a = (encode_text(model, s) for s in (fact.fact, fact.question, fact.answer))
    bg = encode_text(model, BACKGROUND)[:m]
    ids = [0] + f + [encode_text(model, "\n")[0]] + bg + encode_text(model, "\n") + q + a
    return torch.tensor([ids]), list(range(1, 1 + len(f))), len(ids) - len(a) - 1, a


def test_rank_and_mass_equal_a_direct_reading_of_hook_pattern(model, result) -> None:
    assert list(result.heads.columns) == HEAD_COLUMNS
    assert len(result.heads) == 3 * 2 * 2 * 4  # amounts x facts x layers x heads
    for (m, fact_id), rows in result.heads.groupby(["amount", "fact_id"]):
        tokens, fact_pos, q, _ = hand_sequence(model, FACTS[fact_id], m)
        _, cache = model.run_with_cache(tokens)
        for row in rows.itertuples():
            weights = cache[f"blocks.{row.layer}.attn.hook_pattern"][0, row.head, q, : q + 1].tolist()
            order = sorted(range(q + 1), key=lambda i: (-weights[i], i))  # 1 = highest, ties to the lower index
            ranks = {key: r + 1 for r, key in enumerate(order)}
            assert row.best_rank == min(ranks[i] for i in fact_pos)
            assert row.median_rank == statistics.median(ranks[i] for i in fact_pos)
            assert row.mass == pytest.approx(sum(weights[i] for i in fact_pos), abs=1e-6)
            assert row.n_keys == q + 1 and row.n_fact_tokens == len(fact_pos)
    # the background grows between the fact and the question: more keys compete
    assert result.heads.groupby("amount").n_keys.min().is_monotonic_increasing


def test_answer_loss_equals_the_intervention_on_one_unpadded_sequence(model, result) -> None:
    assert list(result.loss.columns) == LOSS_COLUMNS
    for row in result.loss.itertuples():
        tokens, _, q, answer = hand_sequence(model, FACTS[row.fact_id], row.amount)

        def nll(logits, q=q, answer=answer):
            return float(F.cross_entropy(logits[0, q : q + len(answer)].double(), torch.tensor(answer)))

        with torch.inference_mode():
            full = nll(model(tokens))
            with tlg.top_n_attention(model, n=row.n):
                restricted = nll(model(tokens))
        assert row.nll_full == pytest.approx(full, abs=1e-5)
        assert row.nll == pytest.approx(restricted, abs=1e-5)


def test_template_facts_and_their_single_token_check(model) -> None:
    facts = template_facts()
    assert len(facts) == 8 and len({f.answer for f in facts}) == 8
    for f in facts:  # the answer is the code word of the fact, asked about by its colour
        colour = f.question.split("the code of the ")[1].split(" box")[0]
        assert f.fact == f"The code of the {colour} box is {f.answer.strip()}."
    with pytest.raises(InputError, match="is 6 tokens under this model's tokenizer"):
        supporting_fact(model, None, background=BACKGROUND, amounts=(0,), progress=False)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"amounts": (0, 120)}, "more than the model's context of 128"),
        ({"amounts": (0, 50), "background": "short"}, "the background has 5 tokens"),
        ({"amounts": (-1,)}, "integer >= 0"),
        ({"amounts": ()}, "amounts is empty"),
        ({"facts": []}, "facts is empty"),
        ({"facts": [Fact("", "q", "a")]}, "non-empty strings"),
        ({"ns": (0,)}, "n must be an integer >= 1"),
        ({"rank_by": "best"}, "rank"),
    ],
)
def test_bad_input_is_refused_before_any_pass(model, monkeypatch, kwargs, message) -> None:
    from tl_geometry.competition import fact as module

    def no_pass(*args, **kwargs):
        raise AssertionError("a forward pass ran before the input was checked")

    monkeypatch.setattr(module, "top_n_attention", no_pass)
    args = {"facts": FACTS, "background": BACKGROUND, "amounts": (0, 8), "progress": False, **kwargs}
    with pytest.raises(InputError, match=message):
        supporting_fact(model, **args)
