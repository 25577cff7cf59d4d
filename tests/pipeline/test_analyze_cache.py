"""analyze_cache(): analyze's tables from the ActivationCache of run_with_cache (issue 20)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import build, model_kinds

import tl_geometry as tlg
from tl_geometry.errors import InputError

TEXT = ["The quick brown fox jumps over the lazy dog. " * 12, "Attention is a weighting of values. " * 10]
KEYS = ["seq", "layer", "head", "kv_head", "query_pos", "rank_by", "n"]


def assert_same_rows(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Same keys in the same order; counts equal, every float column to 1e-9."""
    assert len(got) == len(expected) > 0
    assert list(got.columns) == list(expected.columns)
    pd.testing.assert_frame_equal(got[KEYS], expected[KEYS])
    assert (got.precision == expected.precision).all() and (got.recall == expected.recall).all()
    floats = [c for c in got.columns if c not in KEYS and got[c].dtype.kind == "f"]
    for column in floats:
        a, b = got[column].to_numpy(), expected[column].to_numpy()
        assert np.array_equal(np.isinf(a), np.isinf(b)), column
        finite = np.isfinite(b)
        assert np.allclose(a[finite], b[finite], rtol=0, atol=1e-9), column


@pytest.mark.parametrize("kind", model_kinds())
def test_analyze_cache_equals_analyze(kind: str) -> None:
    model = build(kind)
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=3, seq_len=24)
    settings = dict(ns="log", query_positions=[0, 5, 17, -1], rank_by=["attention", "random"], n_random=2)
    result = tlg.analyze(model, corpus, **settings, diagnostics=True, bounds=True, batch_size=2, progress=False)
    _, cache = model.run_with_cache(result.tokens)
    cached = tlg.analyze_cache(cache, result.tokens, **settings, diagnostics=True, bounds=True)
    assert_same_rows(cached.separability, result.separability)
    for name in ("regime_features", "value_norms", "similarity", "attention_profile"):
        got, expected = getattr(cached, name), getattr(result, name)
        pd.testing.assert_frame_equal(got, expected, check_exact=False, rtol=0, atol=1e-9, obj=name)
    assert torch.equal(cached.tokens, result.tokens)
    assert cached.config["source"] == "ActivationCache"
    assert {k: v for k, v in cached.config.items() if k not in ("source", "tokens", "corpus")} == {
        k: v for k, v in result.config.items() if k != "corpus"
    }


def test_cache_of_some_layers(llama_bridge) -> None:
    tokens = torch.randint(3, 200, (2, 16))
    _, cache = llama_bridge.run_with_cache(
        tokens, names_filter=lambda name: name in ("blocks.1.attn.hook_v", "blocks.1.attn.hook_pattern")
    )
    with pytest.raises(
        InputError, match=r"lacks \['blocks.0.attn.hook_v', 'blocks.0.attn.hook_pattern'\].*layers=\[1\]"
    ):
        tlg.analyze_cache(cache)
    some = tlg.analyze_cache(cache, layers=[1], ns=[1, 2])
    whole = tlg.analyze(llama_bridge, tokens, layers=[1], ns=[1, 2], progress=False)
    assert_same_rows(some.separability, whole.separability)
    assert some.tokens is None and some.config["tokens"] is False


def test_a_cache_of_patterns_only_is_told_to_cache_hook_v(llama_bridge) -> None:
    """Every layer's pattern but no values: analysing "those layers" would fail again, so the
    message names hook_v, and layers= only for layers the cache holds both hooks of."""
    tokens = torch.randint(3, 200, (2, 16))
    _, cache = llama_bridge.run_with_cache(tokens, names_filter=lambda name: name.endswith("attn.hook_pattern"))
    with pytest.raises(InputError, match=r"cache hook_v too") as caught:
        tlg.analyze_cache(cache)
    assert "layers=[" not in str(caught.value) and "hook_pattern too" not in str(caught.value)
    _, cache = llama_bridge.run_with_cache(
        tokens, names_filter=lambda name: name.endswith("attn.hook_pattern") or name == "blocks.1.attn.hook_v"
    )
    with pytest.raises(InputError, match=r"analyse those layers only \(layers=\[1\]\), or cache hook_v too"):
        tlg.analyze_cache(cache)


def test_cache_without_its_batch_dimension(llama_bridge) -> None:
    tokens = torch.randint(3, 200, (1, 16))
    _, cache = llama_bridge.run_with_cache(tokens, remove_batch_dim=True)
    got = tlg.analyze_cache(cache, tokens[0], ns=[1, 3], query_positions=range(2, 16))
    expected = tlg.analyze(llama_bridge, tokens, ns=[1, 3], query_positions=range(2, 16), progress=False)
    assert_same_rows(got.separability, expected.separability)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(out_dir="runs/x"), "out_dir=: a cache is analysed in memory"),
        (dict(device="cpu"), "device=: the analysis computes where"),
        (dict(layers=[7]), r"layers \[7\] do not exist"),
        (dict(query_positions=40), "outside windows of 16 tokens"),
        (dict(tokens=torch.zeros(2, 15, dtype=torch.int64)), "do not match the cache's 2 sequences of 16"),
        (dict(nss=[1]), r"unknown analysis setting\(s\) \['nss'\]"),
    ],
)
def test_bad_input_is_refused_before_any_work(llama_bridge, kwargs, match) -> None:
    _, cache = llama_bridge.run_with_cache(torch.randint(3, 200, (2, 16)))
    with pytest.raises(InputError, match=match):
        tlg.analyze_cache(cache, **kwargs)


def test_only_a_cache_that_knows_its_model(llama_bridge) -> None:
    _, cache = llama_bridge.run_with_cache(torch.randint(3, 200, (1, 8)))
    with pytest.raises(InputError, match="cache.model"):
        tlg.analyze_cache(dict(cache.items()))


def test_a_result_without_tokens_saves_and_loads(llama_bridge, tmp_path) -> None:
    _, cache = llama_bridge.run_with_cache(torch.randint(3, 200, (2, 8)))
    result = tlg.analyze_cache(cache, ns=[1, 2])
    assert "seqs=2, seq_len=8" in repr(result)
    loaded = tlg.load_result(result.save(tmp_path / "r"))
    assert loaded.tokens is None
    pd.testing.assert_frame_equal(loaded.separability, result.separability)


# ----------------------------------------------------------------------------- padded batches (issue 47)

PADDED_TEXTS = ["Hello world.", "The quick brown fox jumps over the lazy dog here."]


def padded_cache(model, side: str, with_mask: bool = True):
    """``model.to_tokens(PADDED_TEXTS)`` padded on ``side``, its mask and its cache (made with the mask or not)."""
    from transformer_lens.utilities import get_attention_mask  # the function MASK_ADVICE names

    tokens = model.to_tokens(PADDED_TEXTS, padding_side=side)
    mask = get_attention_mask(model.tokenizer, tokens, prepend_bos=True, padding_side=side)
    assert (mask == 0).any()  # the short text is padded
    _, cache = model.run_with_cache(tokens, attention_mask=mask) if with_mask else model.run_with_cache(tokens)
    return tokens, mask, cache


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("queries", ["last", slice(1, None)])
def test_padded_batch_rows_equal_unpadded_rows(llama_bridge, side: str, queries) -> None:
    settings = dict(ns=[1, 2], query_positions=queries, bounds=True)  # the random draws depend on `seq`
    tokens, mask, cache = padded_cache(llama_bridge, side)
    padded = tlg.analyze_cache(cache, tokens, attention_mask=mask, **settings, taxonomy=True)
    assert padded.config["real_tokens"] == mask.sum(1).tolist()
    for row, text in enumerate(PADDED_TEXTS):
        alone_tokens = llama_bridge.to_tokens(text)
        _, alone_cache = llama_bridge.run_with_cache(alone_tokens)
        alone = tlg.analyze_cache(alone_cache, alone_tokens, **settings)
        got = padded.separability[padded.separability.seq == row].reset_index(drop=True)
        expected = alone.separability.assign(seq=row)
        assert got.query_pos.max() == alone_tokens.shape[1] - 1  # the last real token, not a pad
        pd.testing.assert_frame_equal(got, expected, check_exact=False, rtol=0, atol=1e-5)  # float32 forwards


def test_padded_tokens_without_a_mask_are_refused(llama_bridge) -> None:
    for side in ("right", "left"):
        tokens, _, cache = padded_cache(llama_bridge, side)
        with pytest.raises(InputError, match=rf"rows \[0\] of tokens are padded on the {side}.*attention_mask="):
            tlg.analyze_cache(cache, tokens, ns=[1])
        with pytest.raises(InputError, match=rf"rows \[0\] of the token windows are padded on the {side}"):
            tlg.analyze(llama_bridge, tokens, ns=[1], progress=False)
    unpadded = torch.randint(3, 200, (2, 8))
    assert len(tlg.analyze_cache(llama_bridge.run_with_cache(unpadded)[1], unpadded, ns=[1]).separability) > 0


def test_a_cache_made_without_the_mask_is_refused(llama_bridge) -> None:
    tokens, mask, cache = padded_cache(llama_bridge, "left", with_mask=False)
    with pytest.raises(InputError, match=r"made without this attention mask.*attention to pads"):
        tlg.analyze_cache(cache, tokens, attention_mask=mask, ns=[1])


def test_padded_batch_refusals(llama_bridge) -> None:
    tokens, mask, cache = padded_cache(llama_bridge, "right")
    with pytest.raises(InputError, match=r"diagnostics=False"):
        tlg.analyze_cache(cache, tokens, attention_mask=mask, ns=[1], diagnostics=True)
    with pytest.raises(InputError, match=r"row 0 of the padded batch has 13 real tokens: query position 20"):
        tlg.analyze_cache(cache, tokens, attention_mask=mask, ns=[1], query_positions=[20])
    bad = {
        "integer or boolean": mask.float(),
        "does not match": mask[:, :5],
        "only 1": mask * 2,
        "no real token": torch.zeros_like(mask),
        "pads between": mask.clone().index_fill_(1, torch.tensor([3]), 0),
    }
    for message, attention_mask in bad.items():
        with pytest.raises(InputError, match=message):
            tlg.analyze_cache(cache, tokens, attention_mask=attention_mask, ns=[1])
