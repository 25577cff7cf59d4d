"""Feed the observers from an ``ActivationCache`` instead of a forward pass.

``model.run_with_cache(tokens)`` already holds, for every layer, ``hook_v``
``[batch, pos, kv_head, d_head]`` and ``hook_pattern`` ``[batch, head, query, key]``: the two
tensors :func:`tl_geometry.capture.hooks.run_streaming` keeps from its hooks. :func:`run_cached`
hands the same :class:`~tl_geometry.capture.hooks.LayerBatch` es to the same observers, read from
the cache: the values brought to one head per key/value head (:func:`~tl_geometry.capture.hooks.as_kv_values`)
and the pattern's chosen query rows, whose keys after the query are cut by the observers.

Examples
--------
>>> import torch
>>> from tl_geometry.testing import tiny_llama_bridge
>>> model = tiny_llama_bridge()
>>> _, cache = model.run_with_cache(torch.randint(3, 200, (2, 10)), names_filter=lambda n: "blocks.0" in n)
>>> CachedActivations.of(cache).check_layers([0, 1])
Traceback (most recent call last):
...
tl_geometry.errors.InputError: the cache lacks ['blocks.1.attn.hook_v', 'blocks.1.attn.hook_pattern']: ... cache hook_pattern and hook_v too: ...
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from tl_geometry.capture.hooks import LayerBatch, LayerObserver, as_kv_values
from tl_geometry.errors import InputError
from tl_geometry.models import ModelInfo, describe_model, hook_pattern_name, hook_v_name

#: The ``names_filter`` that keeps what the analysis reads, for the error messages.
NAMES_FILTER = 'names_filter=lambda name: name.endswith(("attn.hook_v", "attn.hook_pattern"))'


@dataclass(frozen=True)
class CachedActivations:
    """An ``ActivationCache`` and its model, checked: what :func:`run_cached` reads.

    Attributes
    ----------
    cache : the cache (a mapping from hook names to tensors).
    model : the model that made it (``cache.model``).
    has_batch_dim : False for a cache made with ``remove_batch_dim=True`` (one sequence).
    real_spans : for a padded batch, (first real position, number of real tokens) of each row
        (:func:`tl_geometry.capture.padding.real_spans`); None when every position is a real token.
    """

    cache: Mapping[str, Tensor]
    model: Any
    has_batch_dim: bool
    real_spans: tuple[tuple[int, int], ...] | None = None

    @classmethod
    def of(cls, cache: Any) -> "CachedActivations":
        """Check that ``cache`` is an ``ActivationCache`` that knows its model."""
        model = getattr(cache, "model", None)
        if not hasattr(cache, "keys") or model is None:
            raise InputError(
                f"expected the ActivationCache of model.run_with_cache(tokens), got {type(cache).__name__}: "
                "it carries the model (cache.model) whose geometry the analysis needs"
            )
        return cls(cache, model, bool(getattr(cache, "has_batch_dim", True)))

    def info(self) -> ModelInfo:
        """The model's :class:`ModelInfo`."""
        return describe_model(self.model)

    def check_layers(self, layers: Sequence[int]) -> None:
        """Raise :class:`InputError` naming the hooks of ``layers`` the cache lacks, and the fix."""
        names = set(self.cache.keys())
        missing = [n for layer in layers for n in (hook_v_name(layer), hook_pattern_name(layer)) if n not in names]
        if missing:
            layers_with = {
                suffix: {int(n.split(".")[1]) for n in names if n.startswith("blocks.") and n.endswith(suffix)}
                for suffix in ("attn.hook_v", "attn.hook_pattern")
            }
            have = sorted(layers_with["attn.hook_v"] & layers_with["attn.hook_pattern"])
            kinds = " and ".join(sorted({n.rsplit(".", 1)[1] for n in missing}))
            fix = f"cache {kinds} too: model.run_with_cache(tokens, {NAMES_FILTER})"
            advice = f"analyse those layers only (layers={have}), or {fix}" if have else fix
            raise InputError(
                f"the cache lacks {missing[:4]}{' ...' if len(missing) > 4 else ''}: the analysis reads hook_v "
                f"(the values) and hook_pattern of every layer, and the cache holds both for layers {have}; {advice}"
            )

    def layer(self, layer: int) -> tuple[Tensor, Tensor]:
        """``hook_v`` ``[batch, pos, kv_head, d_head]`` and ``hook_pattern`` ``[batch, head, query, key]`` of ``layer``."""
        values, pattern = self.cache[hook_v_name(layer)].detach(), self.cache[hook_pattern_name(layer)].detach()
        if not self.has_batch_dim:
            values, pattern = values[None], pattern[None]
        return values, pattern

    def shape(self, layer: int) -> tuple[int, int]:
        """(number of sequences, sequence length) of the cache, from ``layer``'s pattern."""
        _, pattern = self.layer(layer)
        if pattern.ndim != 4 or pattern.shape[-1] != pattern.shape[-2]:
            raise InputError(
                f"{hook_pattern_name(layer)} has shape {tuple(pattern.shape)}; expected the whole pattern "
                "[batch, head, pos, pos] of model.run_with_cache(tokens)"
            )
        return int(pattern.shape[0]), int(pattern.shape[-1])


def run_cached(
    cached: CachedActivations,
    info: ModelInfo,
    seq_ids: Int[Tensor, " batch"],
    layers: Sequence[int],
    query_positions: tuple[int, ...],
    observers: Sequence[LayerObserver],
    on_layer_time: Callable[[float], None] | None = None,
    queries_of_length: Callable[[int], tuple[int, ...]] | None = None,
) -> None:
    """Feed every observer the layers of the sequences ``seq_ids`` of a cache, layer by layer.

    The counterpart of :func:`tl_geometry.capture.hooks.run_streaming` (same arguments, the cache
    in place of the model and its tokens): the observers receive the same :class:`LayerBatch` es.
    A padded cache (``cached.real_spans``) is fed row by row cut to its real tokens, the rows of
    one length together, at the query positions ``queries_of_length(length)`` (positions counted
    from each row's first real token).
    """
    if cached.real_spans is not None:
        if queries_of_length is None:
            raise ValueError("a padded cache needs queries_of_length")
        run_cached_rows(cached, info, seq_ids, layers, queries_of_length, observers, on_layer_time)
        return
    q_index = torch.tensor(query_positions, dtype=torch.int64)
    for layer in sorted(set(layers)):
        start = time.perf_counter()
        values, pattern = cached.layer(layer)
        ids = seq_ids.to(values.device)
        batch = LayerBatch(
            layer=layer,
            seq_ids=seq_ids,
            query_positions=query_positions,
            weights=pattern.index_select(0, ids.to(pattern.device)).index_select(2, q_index.to(pattern.device)),
            values=as_kv_values(values.index_select(0, ids), info),
        )
        for obs in observers:
            obs.observe(batch)
        if on_layer_time is not None:
            on_layer_time(time.perf_counter() - start)


def run_cached_rows(
    cached: CachedActivations,
    info: ModelInfo,
    seq_ids: Int[Tensor, " batch"],
    layers: Sequence[int],
    queries_of_length: Callable[[int], tuple[int, ...]],
    observers: Sequence[LayerObserver],
    on_layer_time: Callable[[float], None] | None = None,
) -> None:
    """:func:`run_cached` for a padded cache: each row cut to its real tokens, rows of one length together."""
    spans = cached.real_spans or ()
    by_length: dict[int, list[int]] = {}
    for seq in seq_ids.tolist():
        by_length.setdefault(spans[seq][1], []).append(int(seq))
    for layer in sorted(set(layers)):
        start = time.perf_counter()
        values, pattern = cached.layer(layer)
        for length, seqs in sorted(by_length.items()):
            queries = queries_of_length(length)
            q_index = torch.tensor(queries, dtype=torch.int64, device=pattern.device)
            firsts = [spans[seq][0] for seq in seqs]
            batch = LayerBatch(
                layer=layer,
                seq_ids=torch.tensor(seqs, dtype=torch.int64),
                query_positions=queries,
                weights=torch.stack(
                    [pattern[seq, :, f : f + length, f : f + length] for seq, f in zip(seqs, firsts)]
                ).index_select(2, q_index),
                values=as_kv_values(torch.stack([values[seq, f : f + length] for seq, f in zip(seqs, firsts)]), info),
            )
            for obs in observers:
                obs.observe(batch)
        if on_layer_time is not None:
            on_layer_time(time.perf_counter() - start)


__all__ = ["NAMES_FILTER", "CachedActivations", "run_cached", "run_cached_rows"]
