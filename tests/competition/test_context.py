"""Context scaling (definitions §9): the same last T tokens from longer contexts, against a hand-built
restriction on the transformers model underneath; bad input refused before any pass; resume."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import byte_tokenizer
from intervention_reference import hf_top_n

from tl_geometry.competition import context_scaling
from tl_geometry.competition.context import CONTEXT_COLUMNS
from tl_geometry.corpus import from_texts, from_tokens
from tl_geometry.errors import InputError

TARGETS = 4


@pytest.fixture(scope="module")
def pair():
    """A sharp random LLaMA (BOS = 0) as a plain transformers model and, with the same weights, a bridge."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    torch.manual_seed(0)
    tok = byte_tokenizer()
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager",
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(12.0)
        hf.lm_head.weight.mul_(30.0)
    plain = copy.deepcopy(hf)
    return plain, TransformerBridge.boot_transformers("tiny-llama", hf_model=hf, tokenizer=tok)


@pytest.fixture(scope="module")
def docs():
    torch.manual_seed(3)
    return [torch.randint(3, 259, (length,)).tolist() for length in (30, 41)]  # ragged: whole documents


def hand_nll(plain, docs, context, targets, n=None, renormalize=False):
    """Mean NLL of each document's last ``targets`` tokens from ``BOS`` + the ``context - 1`` tokens before them."""
    windows = torch.tensor([[0] + d[-(context - 1 + targets) :] for d in docs])
    assert windows.shape[1] == context + targets
    with hf_top_n(n, "attention", renormalize) if n is not None else torch.inference_mode():
        with torch.inference_mode():
            logits = plain(windows).logits
    return float(F.cross_entropy(logits[:, -targets - 1 : -1].double().flatten(0, 1), windows[:, -targets:].flatten()))


def test_each_context_equals_the_curve_computed_by_hand(pair, docs) -> None:
    plain, bridge = pair
    texts_as_tokens = from_tokens(torch.tensor([d[-30:] for d in docs]))  # equal lengths for from_tokens
    docs30 = [d[-30:] for d in docs]
    ns = [1, 2, 4, 8]
    table = context_scaling(bridge, texts_as_tokens, contexts=(8, 16, 26), targets=TARGETS, ns=ns,
                            rank_by="attention", renormalize=(False, True), tolerance=0.05, progress=False)  # fmt: skip
    assert list(table.columns) == CONTEXT_COLUMNS
    assert len(table) == 3 * 2 * len(ns)
    for context, group in table.groupby("context"):
        full = hand_nll(plain, docs30, context, TARGETS)
        assert group.nll_full.tolist() == pytest.approx([full] * len(group), abs=2e-6)
        for renorm, curve in group.groupby("renormalize"):
            expected = [hand_nll(plain, docs30, context, TARGETS, n, bool(renorm)) for n in curve.n]
            assert curve.nll.tolist() == pytest.approx(expected, abs=2e-6)
            deltas = [(e - full) / full for e in expected]
            passing = [n for n, d in zip(curve.n, deltas) if d <= 0.05]
            star = min(passing) if passing else None
            assert set(curve.n_star.astype(object).where(curve.n_star.notna(), None)) == {star}
            if star is not None:
                assert set(curve.n_star_over_context) == {star / context}
        assert set(group.n_tokens) == {len(docs30) * TARGETS} and set(group.n_docs) == {2}
    # the loss of the full model differs between contexts (the targets are the same, their context is not)
    assert table.nll_full.nunique() == 3


def test_text_documents_short_ones_refused_by_index_or_skipped(pair) -> None:
    _, bridge = pair
    texts = ["short text", "x" * 60, "y" * 70, "z" * 80]
    with pytest.raises(InputError, match="document 0 has 10 tokens"):
        context_scaling(bridge, from_texts(texts), contexts=(16,), targets=4, ns=[2], progress=False)
    table = context_scaling(bridge, from_texts(texts), contexts=(16,), targets=4, ns=[2], rank_by="attention",
                            renormalize=False, n_docs=2, skip_short=True, progress=False)  # fmt: skip
    assert table.attrs["skipped_docs"] == 1 and set(table.n_docs) == {2}
    with pytest.raises(InputError, match="3 documents of at least 19 tokens"):
        context_scaling(bridge, from_texts(texts), contexts=(16,), targets=4, n_docs=5, skip_short=True)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"contexts": (8, 16), "targets": 8}, "targets=8 is not below the shortest context 8"),
        ({"contexts": (8, 64), "targets": 4}, "more than the model's context of 64"),
        ({"contexts": (), "targets": 4}, "contexts is empty"),
        ({"contexts": (8, 1), "targets": 4}, "integer >= 2"),
        ({"contexts": (8,), "targets": 0}, "targets must be an integer >= 1"),
        ({"contexts": (8,), "targets": 4, "ns": [0]}, "integer >= 1"),
        ({"contexts": (8,), "targets": 4, "n_docs": 0}, "n_docs must be a positive integer"),
        ({"contexts": (30,), "targets": 4}, "document 0 has 20 tokens"),
    ],
)
def test_bad_input_is_refused_before_any_pass(pair, monkeypatch, kwargs, message) -> None:
    _, bridge = pair
    from tl_geometry.competition import context as module

    def no_pass(*args, **kwargs):
        raise AssertionError("a forward pass ran before the input was checked")

    monkeypatch.setattr(module, "sparsification_curve", no_pass)
    with pytest.raises(InputError, match=message):
        context_scaling(bridge, from_tokens(torch.randint(3, 259, (2, 20))), progress=False, **kwargs)


def test_resume_equals_an_uninterrupted_run(pair, docs, tmp_path) -> None:
    _, bridge = pair
    corpus = from_tokens(torch.tensor([d[-30:] for d in docs]))
    kwargs = dict(contexts=(8, 16), targets=TARGETS, ns=[1, 4], rank_by="attention", renormalize=(False, True),
                  progress=False)  # fmt: skip
    whole = context_scaling(bridge, corpus, **kwargs)
    context_scaling(bridge, corpus, out_dir=tmp_path, **kwargs)
    store = tmp_path / "context_16" / "curve.json"
    data = json.loads(store.read_text())
    data["rows"] = data["rows"][:1]  # as if interrupted after the first point of the second context
    store.write_text(json.dumps(data))
    resumed = context_scaling(bridge, corpus, out_dir=tmp_path, **kwargs)
    assert resumed.equals(whole)
    data = json.loads(store.read_text())
    data["rows"][0]["nll"] = 123.0  # a saved point is read back, not measured again
    store.write_text(json.dumps(data))
    again = context_scaling(bridge, corpus, out_dir=tmp_path, **kwargs)
    assert 123.0 in again.nll.tolist()
