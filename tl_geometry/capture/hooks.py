"""Streaming capture: compute on the fly inside the forward pass, keep only what is asked for.

For each layer, a hook on ``hook_v`` keeps that layer's values ``[batch, pos, kv_head, d_head]``
and a hook on ``hook_pattern`` keeps only the chosen query rows of the pattern
``[batch, head, query, key]``. As soon as both have fired, the layer is handed to the
observers and both are dropped, so no ``[layers, heads, L, L]`` cache ever exists and memory does
not grow with the number of sequences. After the last requested layer the forward pass is
stopped (the rest of the model, unembedding included, is not run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol, Sequence

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.core.layouts import resolve_query_positions, values_per_head
from tl_geometry.errors import InputError, ModelError
from tl_geometry.models import ModelInfo, hook_pattern_name, hook_v_name


@dataclass(frozen=True)
class LayerBatch:
    """What one layer of one forward pass gives the observers.

    Attributes
    ----------
    layer : int
    seq_ids : [batch] int64, the corpus index of each window in the batch.
    query_positions : the query positions ``q`` of ``weights`` (keys ``0..q`` are causal).
    weights : [batch, head, query, key] attention rows of the chosen query positions (all keys;
        those after ``q`` are zero).
    values : [batch, key, kv_head, d_head] value vectors of every position.
    """

    layer: int
    seq_ids: Int[Tensor, " batch"]
    query_positions: tuple[int, ...]
    weights: Float[Tensor, "batch head query key"]
    values: Float[Tensor, "batch key kv_head d_head"]

    def cpu(self) -> "LayerBatch":
        """The same layer with its tensors on the CPU (the same tensors where they are there already), for
        the observers whose accumulators live on the CPU."""
        return replace(self, seq_ids=self.seq_ids.cpu(), weights=self.weights.cpu(), values=self.values.cpu())


def check_batch_heads(batch: LayerBatch, info: ModelInfo) -> None:
    """Raise :class:`InputError` unless ``batch`` has the model's query heads and key/value heads."""
    if batch.values.shape[2] != info.n_kv_heads or batch.weights.shape[1] != info.n_heads:
        raise InputError(
            f"layer {batch.layer}: values have {batch.values.shape[2]} key/value heads and weights "
            f"{batch.weights.shape[1]} heads; the model has {info.n_kv_heads} and {info.n_heads}"
        )


class LayerObserver(Protocol):
    """Anything that accumulates results from :class:`LayerBatch` es."""

    def observe(self, batch: LayerBatch) -> None: ...


class StopForward(Exception):
    """Raised inside a hook of :func:`forward_with_hooks` to end the forward pass early."""


def forward_with_hooks(model: Any, tokens: Int[Tensor, "batch pos"], fwd_hooks: Sequence[tuple[str, Callable]]) -> None:
    """One forward pass of ``tokens`` (moved to the model's device) with ``fwd_hooks``, under
    ``torch.inference_mode``; a hook that raises :class:`StopForward` ends it there (the rest of
    the model, unembedding included, is not run). The hooks keep what they need themselves."""
    with torch.inference_mode():
        try:
            model.run_with_hooks(tokens.to(model_device(model)), fwd_hooks=list(fwd_hooks))
        except StopForward:
            pass


def as_kv_values(values: Tensor, info: ModelInfo) -> Tensor:
    """Bring ``hook_v`` to ``[batch, pos, kv_head, d_head]`` (some models give ``(head d)`` flattened)."""
    if values.ndim == 3:
        values = einops.rearrange(values, "b p (g d) -> b p g d", d=info.d_head)
    if values.ndim != 4 or values.shape[-1] != info.d_head:
        raise ModelError(f"hook_v has shape {tuple(values.shape)}; expected [batch, pos, kv_head, {info.d_head}]")
    if values.shape[2] not in (info.n_kv_heads, info.n_heads):
        raise ModelError(
            f"hook_v has {values.shape[2]} heads; expected n_key_value_heads={info.n_kv_heads} or n_heads={info.n_heads}"
        )
    if values.shape[2] == info.n_heads and info.n_kv_heads != info.n_heads:
        # already repeated per query head: keep one copy per key/value group
        group = info.n_heads // info.n_kv_heads
        values = values[:, :, ::group]
    return values


def run_streaming(
    model: Any,
    info: ModelInfo,
    tokens: Int[Tensor, "batch pos"],
    seq_ids: Int[Tensor, " batch"],
    layers: Sequence[int],
    query_positions: tuple[int, ...],
    observers: Sequence[LayerObserver],
    on_layer_time: Callable[[float], None] | None = None,
) -> None:
    """One forward pass over ``tokens`` that feeds every observer layer by layer.

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer
    info : the model's :class:`ModelInfo`
    tokens : [batch, pos] token ids
    seq_ids : [batch] corpus indices of the windows
    layers : layers to observe (the pass stops after the last of them)
    query_positions : rows of the pattern to keep
    observers : receive one :class:`LayerBatch` per layer
    on_layer_time : called with the seconds spent in the observers for each layer
    """
    wanted = sorted(set(layers))
    last_layer = wanted[-1]
    q_index = torch.tensor(query_positions, dtype=torch.int64)
    pending_v: dict[int, Tensor] = {}
    pending_w: dict[int, Tensor] = {}
    delivered: set[int] = set()

    def deliver(layer: int) -> None:
        if layer not in pending_v or layer not in pending_w:
            return
        start = time.perf_counter()
        batch = LayerBatch(
            layer=layer,
            seq_ids=seq_ids,
            query_positions=query_positions,
            weights=pending_w.pop(layer),
            values=pending_v.pop(layer),
        )
        for obs in observers:
            obs.observe(batch)
        if on_layer_time is not None:
            on_layer_time(time.perf_counter() - start)
        delivered.add(layer)
        if layer == last_layer:
            raise StopForward

    def make_v_hook(layer: int) -> Callable:
        def hook(values: Tensor, hook: Any) -> None:
            pending_v[layer] = as_kv_values(values.detach(), info)
            deliver(layer)

        return hook

    def make_pattern_hook(layer: int) -> Callable:
        def hook(pattern: Tensor, hook: Any) -> None:
            pending_w[layer] = pattern.detach().index_select(2, q_index.to(pattern.device))
            deliver(layer)

        return hook

    fwd_hooks = []
    for layer in wanted:
        fwd_hooks.append((hook_v_name(layer), make_v_hook(layer)))
        fwd_hooks.append((hook_pattern_name(layer), make_pattern_hook(layer)))
    forward_with_hooks(model, tokens, fwd_hooks)
    silent = [layer for layer in wanted if layer not in delivered]
    if silent:
        raise ModelError(
            f"layers {silent[:6]} did not fire both hook_v and hook_pattern during the forward pass: the "
            "model's attention does not expose its pattern (boot the model with eager attention)"
        )


def model_device(model: Any) -> torch.device:
    """The device of the model's parameters (else ``model.cfg.device``, else the CPU)."""
    cfg_device = getattr(model.cfg, "device", None)
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return torch.device(cfg_device or "cpu")


__all__ = [
    "LayerBatch",
    "LayerObserver",
    "StopForward",
    "as_kv_values",
    "check_batch_heads",
    "forward_with_hooks",
    "model_device",
    "resolve_query_positions",
    "run_streaming",
    "values_per_head",
]
