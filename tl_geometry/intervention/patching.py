"""Per-head interventions to set beside the geometry: activation patching and mean-ablation.

Columns: docs/columns.md#effect-frames.

* :func:`head_out` — activation patching of every head's output (``hook_z``) from a clean run
  into a corrupted run, by TransformerLens' own ``transformer_lens.patching`` (it runs with a
  ``TransformerBridge`` on TransformerLens 4 and a ``HookedTransformer`` on 3.x);
* :func:`mean_ablation` — the loss change when one head's output is replaced by its mean, the
  functional test of the regimes (definitions §5) where no localised loss is at hand.

Both return a tidy frame, one row per (layer, head), that :func:`tl_geometry.join_heads` joins
with the regimes and the separability.
"""

from __future__ import annotations

from typing import Any, Callable

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor

from tl_geometry.capture.hooks import model_device
from tl_geometry.capture.tables import effect_frame
from tl_geometry.core.checks import typechecked
from tl_geometry.errors import InputError
from tl_geometry.models import describe_model

#: Name of the per-head output hook (``[batch, pos, head, d_head]``), as ``utils.get_act_name("z", l)``.
HOOK_Z = "blocks.{layer}.attn.hook_z"


def _check_tokens(tokens: Any, name: str) -> Tensor:
    if (
        not isinstance(tokens, Tensor)
        or tokens.ndim != 2
        or tokens.dtype.is_floating_point
        or tokens.dtype == torch.bool
    ):
        raise InputError(f"{name} must be an integer tensor [batch, pos] of token ids, got {type(tokens).__name__}")
    if tokens.shape[1] < 2:
        raise InputError(f"{name} needs at least 2 positions, got {tokens.shape[1]}")
    return tokens


def head_out(
    model: Any,
    clean_tokens: Int[Tensor, "batch pos"],
    corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Callable[[Tensor], Tensor],
) -> pd.DataFrame:
    """Patch each head's output, at every position, from the clean run into the corrupted run.

    ``transformer_lens.patching.get_act_patch_attn_head_out_all_pos``: for every (layer, head),
    one forward pass on ``corrupted_tokens`` in which ``hook_z[:, :, head]`` of that layer is
    replaced by its value in the clean run; ``metric(logits)`` of that run is the effect.

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer
    clean_tokens, corrupted_tokens : [batch, pos] int token ids of the same shape.
    metric : logits ``[batch, pos, vocab]`` -> scalar tensor (e.g. the normalised logit
        difference ``(logit - corrupt) / (clean - corrupt)`` of the right answer).

    Returns
    -------
    DataFrame ``layer, head, effect``, one row per (layer, head) (``n_layers * n_heads`` rows).

    Examples
    --------
    >>> import torch
    >>> from tl_geometry.testing import tiny_llama_bridge
    >>> model = tiny_llama_bridge()
    >>> clean, corrupt = torch.randint(3, 259, (2, 8)), torch.randint(3, 259, (2, 8))
    >>> effects = head_out(model, clean, corrupt, lambda logits: logits[:, -1, 5].mean())
    >>> effects.shape
    (8, 3)
    """
    from transformer_lens import patching

    clean_tokens = _check_tokens(clean_tokens, "clean_tokens")
    corrupted_tokens = _check_tokens(corrupted_tokens, "corrupted_tokens")
    if clean_tokens.shape != corrupted_tokens.shape:
        raise InputError(
            f"clean_tokens {tuple(clean_tokens.shape)} and corrupted_tokens {tuple(corrupted_tokens.shape)} "
            "must have the same shape (patching swaps activations position by position)"
        )
    if not callable(metric):
        raise InputError("metric must be a function of the logits returning a scalar tensor")
    device = model_device(model)
    with torch.inference_mode():
        _, cache = model.run_with_cache(clean_tokens.to(device), names_filter=lambda name: name.endswith("hook_z"))
        effects = patching.get_act_patch_attn_head_out_all_pos(model, corrupted_tokens.to(device), cache, metric)
    return effect_frame(effects, "effect")


def _loss(logits: Tensor, tokens: Tensor) -> float:
    """Mean next-token cross-entropy (nats) over every position but the last, in float64."""
    return float(F.cross_entropy(logits[:, :-1].double().flatten(0, 1), tokens[:, 1:].flatten()))


@typechecked
def mean_ablation(model: Any, tokens: Int[Tensor, "batch pos"]) -> pd.DataFrame:
    """Loss change when one head's output is replaced by its mean, for every (layer, head).

    For head ``h`` of layer ``l``: ``m = mean over (batch, pos) of hook_z[:, :, h]`` on ``tokens``;
    a forward pass with ``hook_z[:, :, h] = m`` at every position gives ``loss_ablated``, the mean
    next-token cross-entropy (nats) over all predicted positions. ``delta_loss = loss_ablated -
    loss_clean`` (positive: the head's specific output helped) and ``rel_delta = delta_loss /
    loss_clean``.

    Returns
    -------
    DataFrame ``layer, head, loss_clean, loss_ablated, delta_loss, rel_delta``, one row per
    (layer, head); ``n_layers * n_heads + 1`` forward passes.

    Examples
    --------
    >>> import torch
    >>> from tl_geometry.testing import tiny_llama_bridge
    >>> table = mean_ablation(tiny_llama_bridge(), torch.randint(3, 259, (2, 8)))
    >>> list(table.columns)
    ['layer', 'head', 'loss_clean', 'loss_ablated', 'delta_loss', 'rel_delta']
    """
    tokens = _check_tokens(tokens, "tokens")
    info = describe_model(model)
    device = model_device(model)
    tokens = tokens.to(device)
    rows = []
    with torch.inference_mode():
        logits, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_z"))
        loss_clean = _loss(logits, tokens)
        for layer in range(info.n_layers):
            name = HOOK_Z.format(layer=layer)
            means = cache[name].mean(dim=(0, 1))  # [head, d_head]
            for head in range(info.n_heads):

                def ablate(z: Tensor, hook: Any, head: int = head, means: Tensor = means) -> Tensor:
                    z[:, :, head] = means[head]
                    return z

                loss = _loss(model.run_with_hooks(tokens, fwd_hooks=[(name, ablate)]), tokens)
                rows.append({"layer": layer, "head": head, "loss_clean": loss_clean, "loss_ablated": loss})
    table = pd.DataFrame(rows)
    table["delta_loss"] = table["loss_ablated"] - table["loss_clean"]
    table["rel_delta"] = table["delta_loss"] / table["loss_clean"]
    return table
