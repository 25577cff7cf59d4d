"""Tiny random models for examples and tests: no download, a second to build.

The docstring examples of the package and its test suite use these, so that every example runs as
it stands. They are random (seeded) and only good for exercising code, not for findings.

>>> model = tiny_llama_bridge()
>>> model.cfg.n_layers, model.cfg.n_heads
(2, 4)
"""

from __future__ import annotations

import torch


def byte_tokenizer():
    """A byte-level tokenizer with <bos>=0, <eos>=1, <pad>=2 and the 256 byte symbols (259 ids)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<bos>": 0, "<eos>": 1, "<pad>": 2}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        name_or_path="tiny-bytes",
        add_bos_token=True,
    )


def tiny_llama_bridge(n_heads: int = 4, n_kv_heads: int = 2, n_layers: int = 2, seed: int = 0):
    """A random LLaMA (grouped-query when n_kv_heads < n_heads) in a TransformerBridge."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    torch.manual_seed(seed)
    tok = byte_tokenizer()
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=8 * n_heads,
        intermediate_size=64,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=128,
        attn_implementation="eager",  # type: ignore[call-arg]  # a PretrainedConfig keyword the stubs omit
    )
    hf = transformers.LlamaForCausalLM(cfg).eval()
    return TransformerBridge.boot_transformers("tiny-llama", hf_model=hf, tokenizer=tok)


def tiny_gemma3(n_layers: int = 3, sliding_window: int = 4, n_heads: int = 4, seed: int = 0):
    """A random Hugging Face Gemma 3 (``Gemma3ForCausalLM``, eager attention): one key/value head,
    and a sliding window of ``sliding_window`` keys on every layer but each third (global)."""
    import transformers

    torch.manual_seed(seed)
    layer_types = ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(n_layers)]
    cfg = transformers.Gemma3TextConfig(
        vocab_size=len(byte_tokenizer()),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=1,
        head_dim=8,
        query_pre_attn_scalar=8,
        sliding_window=sliding_window,
        layer_types=layer_types,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        attn_implementation="eager",  # type: ignore[call-arg]  # a PretrainedConfig keyword the stubs omit
    )
    cfg.architectures = ["Gemma3ForCausalLM"]
    return transformers.Gemma3ForCausalLM(cfg).eval()


def tiny_gemma3_bridge(n_layers: int = 3, sliding_window: int = 4, n_heads: int = 4, seed: int = 0):
    """:func:`tiny_gemma3` in a TransformerBridge."""
    from transformer_lens.model_bridge import TransformerBridge

    hf = tiny_gemma3(n_layers, sliding_window, n_heads, seed)
    return TransformerBridge.boot_transformers("tiny-gemma3", hf_model=hf, tokenizer=byte_tokenizer())


def tiny_gpt2_bridge(seed: int = 0):
    """A random GPT-2 (joint QKV projection, value biases) in a TransformerBridge."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    torch.manual_seed(seed)
    tok = byte_tokenizer()
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=len(tok), n_positions=128)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    return TransformerBridge.boot_transformers("tiny-gpt2", hf_model=hf, tokenizer=tok)


def tiny_hooked_transformer(n_kv_heads: int | None = 2, seed: int = 0):
    """A random HookedTransformer (TransformerLens 3.x only; removed in 4.0)."""
    import transformer_lens

    torch.manual_seed(seed)
    cfg = transformer_lens.HookedTransformerConfig(
        n_layers=2,
        d_model=32,
        n_heads=4,
        d_head=8,
        n_ctx=128,
        d_vocab=259,
        act_fn="gelu",
        n_key_value_heads=n_kv_heads,
        normalization_type="LN",
        seed=seed,
    )
    model = transformer_lens.HookedTransformer(cfg, tokenizer=byte_tokenizer())
    # random init leaves biases at zero; give b_V and b_O values so the fold check has something to see
    for block in model.blocks:
        block.attn.b_O.data.normal_()
        b_v = block.attn._b_V if hasattr(block.attn, "_b_V") else block.attn.b_V
        b_v.data.normal_()
    return model.eval()


__all__ = [
    "byte_tokenizer",
    "tiny_gemma3",
    "tiny_gemma3_bridge",
    "tiny_gpt2_bridge",
    "tiny_hooked_transformer",
    "tiny_llama_bridge",
]
