"""Real SmolLM2-135M attention layers for the per-layer benchmarks, captured once on one thread.

``smollm2_layers(layers, seq_len)`` loads the model, runs one window of ``seq_len`` tokens of the
embedded CPython documentation corpus and keeps ``hook_pattern`` [1, head, query, key] and
``hook_v`` [1, pos, kv_head, d] of each chosen layer (no other activation is cached).
"""

from __future__ import annotations

from typing import Any

import torch


def smollm2_layers(
    layers: list[int] | tuple[int, ...], seq_len: int
) -> tuple[Any, dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """The model's :class:`~tl_geometry.models.ModelInfo` and ``{layer: (pattern, values)}``."""
    import tl_geometry as tlg
    from tl_geometry.models import hook_pattern_name, hook_v_name

    torch.set_num_threads(1)
    model = tlg.load_model("smollm2-135m")
    tokens = tlg.corpus_tokens(model, tlg.corpus.python_docs(n_seqs=1, seq_len=seq_len))
    names = {name for layer in layers for name in (hook_pattern_name(layer), hook_v_name(layer))}
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    captured = {layer: (cache[hook_pattern_name(layer)], cache[hook_v_name(layer)]) for layer in layers}
    return tlg.describe_model(model), captured
