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


@contextlib.contextmanager
def hf_top_n(n, rank_by="attention", renormalize=False):
    """Patch transformers' LLaMA eager attention so that every row is restricted by hand."""
    import transformers.models.llama.modeling_llama as llama

    original = llama.eager_attention_forward

    def eager_top_n(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key_states = llama.repeat_kv(key, module.num_key_value_groups)
        value_states = llama.repeat_kv(value, module.num_key_value_groups)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
        if rank_by == "attention":
            scores = attn_weights.double()
        elif rank_by == "contribution":
            scores = attn_weights.double() * value_states.double().norm(dim=-1)[:, :, None, :]
        else:
            raise ValueError(rank_by)
        attn_weights = restrict_rows_by_sorting(attn_weights, scores, n, renormalize)
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
