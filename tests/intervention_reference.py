"""Hand-built reference of the top-N intervention on a plain transformers LLaMA (no TransformerLens).

``eager_top_n`` is a copy of transformers' ``eager_attention_forward`` with the restriction of
definitions §8 written out: stable argsort of the scores of every row with more than ``n`` visible
keys, the first ``n`` kept, the rest zeroed, optionally divided by the kept sum.
"""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.nn.functional as F

import tl_geometry as tlg
from tl_geometry.intervention.loss import corpus_nll
from tl_geometry.testing import byte_tokenizer


def restrict_rows_by_sorting(weights, scores, n, renormalize):
    """weights/scores [b, h, q, k]; rows q >= n keep the first n keys of a stable descending sort of
    the visible keys' scores (keys > q are never candidates)."""
    b, h, q_len, k_len = weights.shape
    out = weights.clone()
    visible = torch.ones(q_len, k_len, dtype=torch.bool).tril()
    masked = torch.where(visible, scores.double(), torch.tensor(-torch.inf, dtype=torch.float64))
    order = torch.argsort(masked, dim=-1, descending=True, stable=True)[..., :n]
    keep = torch.zeros_like(weights, dtype=torch.bool).scatter_(-1, order, True)
    rows = torch.arange(q_len) >= n
    kept = torch.where(keep, weights, torch.zeros_like(weights))
    if renormalize:
        kept = kept / kept.sum(-1, keepdim=True)
    out[:, :, rows] = kept[:, :, rows]
    return out


def restrict_heads_by_sorting(weights, scores, sizes, renormalize):
    """The per-head restriction, one head at a time: head h keeps ``sizes[h]`` keys (``<= 0``: unchanged)."""
    out = weights.clone()
    for h, size in enumerate(int(s) for s in sizes):
        if size > 0:
            out[:, h : h + 1] = restrict_rows_by_sorting(weights[:, h : h + 1], scores[:, h : h + 1], size, renormalize)
    return out


def hand_scores(rank_by, weights, value_states):
    """float64 scores of one head's rows [b, 1, q, k] under a deterministic ranking, written out."""
    if rank_by == "attention":
        return weights.double()
    if rank_by == "contribution":
        return weights.double() * value_states.double().norm(dim=-1)[:, :, None, :]
    if rank_by == "sink_window":
        k_len = weights.shape[-1]
        scores = torch.arange(k_len, dtype=torch.float64).expand(weights.shape).clone()
        scores[..., 0] = torch.inf
        return scores
    raise ValueError(rank_by)


def llama_pair(n_heads=4, n_kv_heads=2, seed=0):
    """A random grouped-query LLaMA as plain transformers model and, with the same weights, as a bridge."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    torch.manual_seed(seed)
    tok = byte_tokenizer()
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=8 * n_heads, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, max_position_embeddings=128,
        attn_implementation="eager",
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper attention than the random init's near-uniform rows, so top-N matters
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(12.0)
        hf.lm_head.weight.mul_(30.0)  # and sharper predictions, so the loss feels the change
    plain = copy.deepcopy(hf)
    return plain, TransformerBridge.boot_transformers("tiny-llama", hf_model=hf, tokenizer=tok)


@contextlib.contextmanager
def hf_top_n(n, rank_by="attention", renormalize=False):
    """Patch transformers' LLaMA eager attention so that every row is restricted by hand.

    ``n`` an int (every head) or a tensor ``[n_layers, n_heads]`` (``<= 0``: full); ``rank_by`` a
    ranking or ``{(layer, head): ranking}`` (others: attention)."""
    import transformers.models.llama.modeling_llama as llama

    original = llama.eager_attention_forward

    def eager_top_n(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key_states = llama.repeat_kv(key, module.num_key_value_groups)
        value_states = llama.repeat_kv(value, module.num_key_value_groups)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
        if isinstance(n, int) and isinstance(rank_by, str):
            scores = hand_scores(rank_by, attn_weights, value_states)
            attn_weights = restrict_rows_by_sorting(attn_weights, scores, n, renormalize)
        else:
            layer, n_heads = module.layer_idx, attn_weights.shape[1]
            sizes = [n] * n_heads if isinstance(n, int) else n[layer].tolist()
            names = [
                rank_by if isinstance(rank_by, str) else rank_by.get((layer, h), "attention") for h in range(n_heads)
            ]
            scores = torch.cat(
                [hand_scores(names[h], attn_weights[:, h : h + 1], value_states[:, h : h + 1]) for h in range(n_heads)],
                dim=1,
            )
            attn_weights = restrict_heads_by_sorting(attn_weights, scores, sizes, renormalize)
        attn_output = torch.matmul(attn_weights, value_states)
        return attn_output.transpose(1, 2).contiguous(), attn_weights

    llama.eager_attention_forward = eager_top_n
    try:
        yield
    finally:
        llama.eager_attention_forward = original


def hf_nll(hf_model, tokens):
    """Mean next-token NLL over targets 1..L-1 of every window, float64."""
    with torch.inference_mode():
        logits = hf_model(tokens).logits
    return float(F.cross_entropy(logits[:, :-1].double().flatten(0, 1), tokens[:, 1:].flatten()))


def ignoring_pattern_edits(bridge):
    """A bridge whose hook_pattern fires but whose result is thrown away (as a native kernel would)."""
    from transformer_lens.hook_points import HookPoint

    class Ignoring(HookPoint):
        def __call__(self, x, *args, **kwargs):
            super().__call__(x, *args, **kwargs)
            return x

    model = copy.deepcopy(bridge)
    for block in model.blocks:
        block.attn.hook_pattern.__class__ = Ignoring
    return model


def intervened_nll(model, tokens, **kwargs):
    """The mean NLL of ``tokens`` under ``tlg.top_n_attention(model, **kwargs)`` (the package's path)."""
    with tlg.top_n_attention(model, **kwargs):
        return corpus_nll(model, tokens, batch_size=2, progress=False).nll
