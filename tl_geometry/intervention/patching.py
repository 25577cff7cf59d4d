"""Per-head interventions to set beside the geometry: activation patching and mean-ablation.

Columns: docs/columns.md#effect-frames; agreement and speed on SmolLM2: docs/head_types.md#patching.

* :func:`patch_head_out` — exact activation patching of every head's output (``hook_z``, all
  positions) from a clean run into a corrupted run, the ``[n_layers, n_heads]`` tensor of
  ``transformer_lens.patching.get_act_patch_attn_head_out_all_pos``, with many heads' patched runs
  stacked in the batch of one forward pass;
* :func:`attribute_head_out` — attribution patching, its first-order estimate from one forward and
  one backward pass: ``effect[l, h] = sum_{batch, pos, d} (z_clean - z_corrupted) * d metric / d z``;
* :func:`head_out` — either, as the tidy frame ``layer, head, method, corrupted_metric,
  patched_metric, effect``: ``effect`` is always the change ``patched_metric - corrupted_metric``
  (exact or estimated), whichever the method;
* :func:`mean_ablation` — the loss change when one head's output is replaced by its mean, the
  functional test of the regimes (definitions §5) where no localised loss is at hand.

:func:`tl_geometry.join_heads` joins the tensor or the frame with the regimes and the separability::

    effects = patch_head_out(model, clean, corrupted, metric)       # [n_layers, n_heads]
    estimate = attribute_head_out(model, clean, corrupted, metric)  # ~ effects - metric(corrupted)
    frame = head_out(model, clean, corrupted, metric)               # effect = patched - corrupted metric
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable

import pandas as pd
import torch
import torch.nn.functional as F
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.capture.hooks import model_device
from tl_geometry.capture.tables import effect_frame
from tl_geometry.core.checks import typechecked
from tl_geometry.errors import InputError
from tl_geometry.models import describe_model
from tl_geometry.runtime.threads import runs_model

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


#: Token positions (batch x pos) one stacked forward pass of :func:`patch_head_out` holds by default.
TOKENS_PER_PASS = 8192

#: The two ways of :func:`head_out`.
METHODS = ("exact", "attribution")

#: The columns of :func:`head_out`'s frame.
HEAD_OUT_COLUMNS = ["layer", "head", "method", "corrupted_metric", "patched_metric", "effect"]


def _check_pair(clean_tokens: Any, corrupted_tokens: Any, metric: Any) -> tuple[Tensor, Tensor]:
    clean_tokens = _check_tokens(clean_tokens, "clean_tokens")
    corrupted_tokens = _check_tokens(corrupted_tokens, "corrupted_tokens")
    if clean_tokens.shape != corrupted_tokens.shape:
        raise InputError(
            f"clean_tokens {tuple(clean_tokens.shape)} and corrupted_tokens {tuple(corrupted_tokens.shape)} "
            "must have the same shape (patching swaps activations position by position)"
        )
    if not callable(metric):
        raise InputError("metric must be a function of the logits returning a scalar tensor")
    return clean_tokens, corrupted_tokens


def _metric_of(model: Any, tokens: Tensor, metric: Callable[[Tensor], Tensor]) -> float:
    """``metric`` of the model's logits on ``tokens`` (no intervention), checked (:func:`check_metric_value`)."""
    with torch.inference_mode():
        return check_metric_value(metric(model(tokens.to(model_device(model)))))


def _clean_z(model: Any, tokens: Tensor, metric: Callable[[Tensor], Tensor] | None = None) -> dict[str, Tensor]:
    """``hook_z`` of every layer on ``tokens``: name -> ``[batch, pos, head, d_head]``; ``metric``
    (if given) checked on the logits of the same pass (:func:`check_metric_value`)."""
    with torch.inference_mode():
        logits, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_z"))
        if metric is not None:
            check_metric_value(metric(logits))
    return {name: cache[name].clone() for name in cache.keys()}


def check_metric_value(value: Any) -> float:
    """``value``, a metric's result, as a float: a one-element tensor or a number, and finite.

    Checked on the clean run, before the patched passes, so that a metric returning a vector, a
    string or NaN is one :class:`InputError` instead of a failure after every pass.
    """
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise InputError(
                f"metric must return a scalar, got a tensor of shape {tuple(value.shape)}: reduce it (e.g. .mean())"
            )
        number = float(value.detach().double().item())
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        raise InputError(f"metric must return a scalar tensor or a number, got {type(value).__name__}")
    if not math.isfinite(number):
        raise InputError(
            f"metric returned {number} on the clean run: it must be finite (check for a division by zero or log(0))"
        )
    return number


@runs_model
def patch_head_out(
    model: Any,
    clean_tokens: Int[Tensor, "batch pos"],
    corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Callable[[Tensor], Tensor],
    *,
    heads_per_pass: int | None = None,
) -> Float[Tensor, "n_layers n_heads"]:
    """Exact activation patching of every head's output, as TransformerLens shapes it.

    The effect of head ``h`` of layer ``l`` is ``metric(logits)`` of the corrupted run with
    ``hook_z[:, :, h]`` of layer ``l`` replaced, at every position, by its value in the clean run:
    ``transformer_lens.patching.get_act_patch_attn_head_out_all_pos``. That function runs one
    forward pass per head; here ``heads_per_pass`` heads' patched runs are stacked along the batch
    dimension of one forward pass (copy ``g`` of the corrupted batch patches the ``g``-th head), so
    the model runs ``ceil(n_layers * n_heads / heads_per_pass)`` times on a larger batch.

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer
    clean_tokens, corrupted_tokens : [batch, pos] int token ids of the same shape.
    metric : callable
        Logits ``[batch, pos, vocab]`` -> scalar tensor (e.g. the normalised logit difference
        ``(logit_diff - corrupt) / (clean - corrupt)`` of the right answer). It is called on the
        ``batch`` rows of one patched run at a time, as TransformerLens calls it.
    heads_per_pass : int, optional
        Heads patched in one forward pass. Default: as many as keep a pass at
        :data:`TOKENS_PER_PASS` token positions (``batch * pos`` each), at least 1.

    Returns
    -------
    Tensor ``[n_layers, n_heads]`` (float32, on the CPU): the metric of each patched run (not its
    change). :func:`head_out` gives the tidy frame with both the patched metric and the change.

    Examples
    --------
    >>> import torch
    >>> from tl_geometry.testing import tiny_llama_bridge
    >>> model = tiny_llama_bridge()
    >>> clean, corrupt = torch.randint(3, 259, (2, 8)), torch.randint(3, 259, (2, 8))
    >>> patch_head_out(model, clean, corrupt, lambda logits: logits[:, -1, 5].mean()).shape
    torch.Size([2, 4])
    """
    clean_tokens, corrupted_tokens = _check_pair(clean_tokens, corrupted_tokens, metric)
    if heads_per_pass is not None and (isinstance(heads_per_pass, bool) or heads_per_pass < 1):
        raise InputError(f"heads_per_pass must be a positive int, got {heads_per_pass!r}")
    info = describe_model(model)
    device = model_device(model)
    batch, n_pos = corrupted_tokens.shape
    per_pass = heads_per_pass or max(1, TOKENS_PER_PASS // (batch * n_pos))
    clean_z = _clean_z(model, clean_tokens.to(device), metric)
    corrupted = corrupted_tokens.to(device)
    heads = [(layer, head) for layer in range(info.n_layers) for head in range(info.n_heads)]
    effects = torch.empty(info.n_layers, info.n_heads)
    for start in range(0, len(heads), per_pass):
        group = heads[start : start + per_pass]
        by_layer: dict[int, list[tuple[int, int]]] = {}
        for copy, (layer, head) in enumerate(group):
            by_layer.setdefault(layer, []).append((copy, head))

        def patch(z: Tensor, hook: Any, copies: list[tuple[int, int]], clean: Tensor) -> Tensor:
            for copy, head in copies:
                z[copy * batch : (copy + 1) * batch, :, head] = clean[:, :, head]
            return z

        hooks = [
            (HOOK_Z.format(layer=layer), partial(patch, copies=copies, clean=clean_z[HOOK_Z.format(layer=layer)]))
            for layer, copies in by_layer.items()
        ]
        stacked = corrupted.repeat(len(group), 1)  # copy g = rows g*batch .. (g+1)*batch
        with torch.inference_mode():
            logits = model.run_with_hooks(stacked, fwd_hooks=hooks)
            for copy, (layer, head) in enumerate(group):
                effects[layer, head] = float(metric(logits[copy * batch : (copy + 1) * batch]))
    return effects


@runs_model
def attribute_head_out(
    model: Any,
    clean_tokens: Int[Tensor, "batch pos"],
    corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Callable[[Tensor], Tensor],
) -> Float[Tensor, "n_layers n_heads"]:
    """Attribution patching of every head's output: the gradient estimate of :func:`patch_head_out`.

    ``effect[l, h] = sum over batch, pos, d_head of (z_clean - z_corrupted) * d metric / d z`` with
    ``z = hook_z[:, :, h]`` of layer ``l`` and the gradient taken at the corrupted run: the
    first-order estimate of ``metric(patched) - metric(corrupted)`` (TransformerLens' direction,
    clean patched into corrupted). One forward pass on the clean tokens, one forward and one
    backward pass on the corrupted tokens, whatever the number of heads. Each ``hook_z`` enters the
    graph as ``z + delta`` with a zero ``delta`` that requires grad, so the gradient is the total
    derivative (through every later layer) without touching the model's parameters. Agreement with
    exact patching on SmolLM2: docs/head_types.md#patching.

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer
    clean_tokens, corrupted_tokens : [batch, pos] int token ids of the same shape.
    metric : callable
        Logits ``[batch, pos, vocab]`` -> scalar tensor, differentiable (as for
        :func:`patch_head_out`).

    Returns
    -------
    Tensor ``[n_layers, n_heads]`` (float32, on the CPU): the estimated change of the metric. Add
    ``metric(corrupted logits)`` to compare with :func:`patch_head_out`, which returns the metric itself.

    Examples
    --------
    >>> import torch
    >>> from tl_geometry.testing import tiny_llama_bridge
    >>> model = tiny_llama_bridge()
    >>> clean, corrupt = torch.randint(3, 259, (2, 8)), torch.randint(3, 259, (2, 8))
    >>> attribute_head_out(model, clean, corrupt, lambda logits: logits[:, -1, 5].mean()).shape
    torch.Size([2, 4])
    """
    clean_tokens, corrupted_tokens = _check_pair(clean_tokens, corrupted_tokens, metric)
    info = describe_model(model)
    device = model_device(model)
    clean_z = _clean_z(model, clean_tokens.to(device))
    names = [HOOK_Z.format(layer=layer) for layer in range(info.n_layers)]
    deltas: dict[str, Tensor] = {}
    seen: dict[str, Tensor] = {}

    def track(z: Tensor, hook: Any, name: str) -> Tensor:
        delta = torch.zeros_like(z, requires_grad=True)
        deltas[name], seen[name] = delta, z.detach()
        return z + delta

    with torch.enable_grad():
        logits = model.run_with_hooks(
            corrupted_tokens.to(device), fwd_hooks=[(name, partial(track, name=name)) for name in names]
        )
        value = metric(logits)
        if not isinstance(value, Tensor) or value.numel() != 1 or not value.requires_grad:
            raise InputError("metric must return a scalar tensor that depends on the logits (differentiably)")
        missing = [name for name in names if name not in deltas]
        if missing:
            raise InputError(f"{missing[:3]} did not fire during the forward pass: attribution needs every hook_z")
        grads = torch.autograd.grad(value, [deltas[name] for name in names], allow_unused=True)
    effects = torch.zeros(info.n_layers, info.n_heads)
    for layer, (name, grad) in enumerate(zip(names, grads)):
        if grad is not None:  # a layer the metric does not depend on
            diff = clean_z[name].to(grad.dtype) - seen[name].to(grad.dtype)
            effects[layer] = einsum(diff, grad, "batch pos head d, batch pos head d -> head").detach().cpu()
    return effects


def as_frame(effects: Float[Tensor, "n_layers n_heads"], column: str = "effect") -> pd.DataFrame:
    """The tidy frame ``layer, head, <column>`` (one row per head) of a ``[n_layers, n_heads]`` tensor.

    Examples
    --------
    >>> import torch
    >>> as_frame(torch.tensor([[0.5, 1.0]])).to_dict("records")
    [{'layer': 0, 'head': 0, 'effect': 0.5}, {'layer': 0, 'head': 1, 'effect': 1.0}]
    """
    return effect_frame(effects, column)


@runs_model
def head_out(
    model: Any,
    clean_tokens: Int[Tensor, "batch pos"],
    corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Callable[[Tensor], Tensor],
    *,
    method: str = "exact",
) -> pd.DataFrame:
    """Patch each head's output from the clean run into the corrupted run, as a tidy frame.

    ``method="exact"``: :func:`patch_head_out` (the metric of each patched run, as
    ``transformer_lens.patching.get_act_patch_attn_head_out_all_pos``); ``method="attribution"``:
    :func:`attribute_head_out` (the gradient estimate of the metric's change). Both give the same
    columns on the same baseline, the corrupted run's metric (one more forward pass): ``effect``
    is the change ``patched_metric - corrupted_metric``, so switching ``method=`` before
    :func:`tl_geometry.join_heads` (which takes ``effect``) or a threshold keeps the meaning. For the
    ``[n_layers, n_heads]`` tensors, call those two directly (they differ: the patched metric, the
    estimated change).

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer
    clean_tokens, corrupted_tokens : [batch, pos] int token ids of the same shape.
    metric : logits ``[batch, pos, vocab]`` -> scalar tensor (e.g. the normalised logit
        difference ``(logit - corrupt) / (clean - corrupt)`` of the right answer).
    method : {"exact", "attribution"}, default "exact"

    Returns
    -------
    DataFrame :data:`HEAD_OUT_COLUMNS`, one row per (layer, head) (``n_layers * n_heads`` rows):
    ``layer, head, method, corrupted_metric`` (the metric of the corrupted run, the baseline),
    ``patched_metric`` (with the head patched; for ``"attribution"`` the baseline plus the
    estimate), ``effect`` (``patched_metric - corrupted_metric``).

    Examples
    --------
    >>> import torch
    >>> from tl_geometry.testing import tiny_llama_bridge
    >>> model = tiny_llama_bridge()
    >>> clean, corrupt = torch.randint(3, 259, (2, 8)), torch.randint(3, 259, (2, 8))
    >>> effects = head_out(model, clean, corrupt, lambda logits: logits[:, -1, 5].mean())
    >>> effects.shape
    (8, 6)
    >>> bool(((effects.patched_metric - effects.corrupted_metric - effects.effect).abs() < 1e-6).all())
    True
    """
    if method not in METHODS:
        raise InputError(f"method must be one of {list(METHODS)}, got {method!r}")
    clean_tokens, corrupted_tokens = _check_pair(clean_tokens, corrupted_tokens, metric)
    baseline = _metric_of(model, corrupted_tokens, metric)
    if method == "exact":
        patched = patch_head_out(model, clean_tokens, corrupted_tokens, metric).double()
        change = patched - baseline
    else:
        change = attribute_head_out(model, clean_tokens, corrupted_tokens, metric).double()
        patched = change + baseline
    frame = as_frame(change, "effect")
    frame.insert(2, "method", method)
    frame.insert(3, "corrupted_metric", baseline)
    frame.insert(4, "patched_metric", patched.reshape(-1).numpy())
    return frame[HEAD_OUT_COLUMNS]


def _loss(logits: Tensor, tokens: Tensor) -> float:
    """Mean next-token cross-entropy (nats) over every position but the last, in float64."""
    return float(F.cross_entropy(logits[:, :-1].double().flatten(0, 1), tokens[:, 1:].flatten()))


@runs_model
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
