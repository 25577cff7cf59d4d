"""The gradient-sensitivity predictor of ``N*`` (the follow-up's Appendix E.4; definitions §10).

For a size ``N``, every (layer, head) and causal query with more than ``N`` visible keys, the
deletion error ``e_del(N) = z - s(N) = sum_{k not in I_N} alpha_k v_k`` (attention ranking, §7) and
the gradient of the summed next-token loss with respect to that head's output ``z``::

    S(N) = sum_{layers, heads, queries} |<grad_z loss, e_del(N)>|

the first-order size of the loss change that deleting the keys outside ``I_N`` would make, from
one forward and one backward pass of the full model (no intervention). Reported per target and
relative to the full loss, beside the measured ``delta_nll_rel`` of
:func:`~tl_geometry.intervention.sparsification_curve`.
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import einops
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from tl_geometry.capture.hooks import as_kv_values, model_device
from tl_geometry.corpus import as_corpus, corpus_tokens
from tl_geometry.errors import InputError
from tl_geometry.intervention.curve import check_ns
from tl_geometry.intervention.loss import check_targets, check_windows, window_nll
from tl_geometry.intervention.restrict import restrict_pattern
from tl_geometry.models import describe_model, hook_pattern_name, hook_v_name

SENSITIVITY_COLUMNS = ["n", "sensitivity", "sensitivity_per_target", "sensitivity_rel", "nll_full", "n_tokens"]
HOOK_Z = "blocks.{layer}.attn.hook_z"


def deletion_error(pattern: Tensor, values: Tensor, n: int) -> Tensor:
    """``e_del(N)`` of every head and query, ``[batch, query, head, d_head]``, from the pattern
    ``[batch, head, query, key]`` and values ``[batch, key, head, d_head]`` (one per query head)."""
    left_out = pattern - restrict_pattern(pattern, pattern, n, renormalize=False)
    return einops.einsum(left_out, values, "b h q k, b k h d -> b q h d")


def gradient_sensitivity(
    model: Any,
    corpus: Any,
    ns: str | Sequence[int] = "pow2",
    *,
    batch_size: int = 1,
    targets: int | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """``S(N)`` for every size ``N`` (attention ranking, deletion), one forward and one backward pass per batch.

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer with eager attention (``hook_pattern``,
        ``hook_v`` and ``hook_z`` of every layer) and parameters that take gradients.
    corpus : a corpus or token windows ``[n_seqs, L]``.
    ns : "pow2" or a list of sizes.
    batch_size : windows per pass.
    targets : count only the last ``targets`` positions of each window in the loss (default: all).

    Returns
    -------
    Tidy DataFrame, one row per ``N``: ``sensitivity`` (``S(N)``, nats), ``sensitivity_per_target``
    (``S / n_tokens``), ``sensitivity_rel`` (``S / (n_tokens NLL)``, comparable to ``delta_nll_rel``),
    ``nll_full``, ``n_tokens``.
    """
    info = describe_model(model)
    tokens = check_windows(corpus_tokens(model, as_corpus(corpus, 512), info))
    seq_len = int(tokens.shape[1])
    sizes = check_ns(ns, seq_len)
    n_targets = check_targets(targets, seq_len)
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise InputError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    device = model_device(model)
    group = info.n_heads // info.n_kv_heads
    sums = torch.zeros(len(sizes), dtype=torch.float64)
    nll_total = 0.0
    for start in tqdm(range(0, tokens.shape[0], batch_size), desc="sensitivity", disable=not progress):
        batch = tokens[start : start + batch_size].to(device)
        saved: dict[tuple[str, int], Tensor] = {}

        def keep(kind: str, layer: int, saved: dict = saved) -> Any:
            def hook(act: Tensor, hook: Any) -> Tensor | None:
                if kind == "z":  # z + 0: the gradient reaching the zero is the gradient with respect to z
                    zero = torch.zeros_like(act, requires_grad=True)
                    saved[(kind, layer)] = zero
                    return act + zero
                saved[(kind, layer)] = act.detach()
                return None

            return hook

        hooks = []
        for layer in range(info.n_layers):
            hooks += [
                (hook_pattern_name(layer), keep("pattern", layer)),
                (hook_v_name(layer), keep("v", layer)),
                (HOOK_Z.format(layer=layer), keep("z", layer)),
            ]
        with torch.enable_grad():
            logits = model.run_with_hooks(batch, fwd_hooks=hooks)
            loss = window_nll(logits, batch, n_targets).sum()
            if not loss.requires_grad:
                raise InputError("the model's loss takes no gradient: load it with parameters that require grad")
            loss.backward()
        nll_total += float(loss.detach())
        for layer in range(info.n_layers):
            z = saved[("z", layer)]
            if z.grad is None:
                raise InputError(f"no gradient reached blocks.{layer}.attn.hook_z: this model does not expose it")
            values = as_kv_values(saved[("v", layer)], info).repeat_interleave(group, dim=2).to(torch.float64)
            pattern = saved[("pattern", layer)].to(torch.float64)
            grad = z.grad.to(torch.float64)
            for j, n in enumerate(sizes):
                error = deletion_error(pattern, values, n)
                sums[j] += (grad * error).sum(-1).abs().sum()
        model.zero_grad(set_to_none=True)
    n_tokens = int(tokens.shape[0] * n_targets)
    nll_full = nll_total / n_tokens
    return pd.DataFrame(
        [
            {
                "n": n,
                "sensitivity": float(s),
                "sensitivity_per_target": float(s) / n_tokens,
                "sensitivity_rel": float(s) / nll_total,
                "nll_full": nll_full,
                "n_tokens": n_tokens,
            }
            for n, s in zip(sizes, sums.tolist())
        ],
        columns=SENSITIVITY_COLUMNS,
    )


__all__ = ["SENSITIVITY_COLUMNS", "deletion_error", "gradient_sensitivity"]
