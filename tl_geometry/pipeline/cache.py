"""``analyze_cache``: :func:`~tl_geometry.analyze`'s tables from the ``ActivationCache`` you already have.

Every analysis of ``analyze`` reads two hooks per layer, ``hook_v`` and ``hook_pattern``, so
``analyze_cache`` runs the same plan, loop and observers (:mod:`tl_geometry.pipeline.loop`) over
a cache instead of forward passes (:mod:`tl_geometry.capture.cached`): grouped-query values mapped
to their query heads and each query row cut to its causal keys as ``analyze`` does, same rows to
rounding. Settings are ``analyze``'s; its keywords about running the model (``out_dir``,
``resume``, ``device``) are refused by name.

Example
-------
>>> import torch, tl_geometry as tlg
>>> from tl_geometry.testing import tiny_llama_bridge
>>> model = tiny_llama_bridge()
>>> tokens = torch.randint(3, 200, (2, 16))
>>> _, cache = model.run_with_cache(tokens)
>>> result = tlg.analyze_cache(cache, tokens, ns=[1, 4])
>>> result.separability[["seq", "layer", "head", "query_pos", "n"]].shape
(32, 5)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tl_geometry.capture.cached import CachedActivations
from tl_geometry.errors import InputError
from tl_geometry.pipeline.loop import run_analysis
from tl_geometry.pipeline.plan import AnalysisPlan
from tl_geometry.pipeline.result import AnalysisResult
from tl_geometry.pipeline.settings import (
    AnalysisSettings,
    combine_settings,
    fill_settings_doc,
    signature_with_settings,
)

#: ``analyze``'s keywords that are about running the model, and why a cache has no use for them.
NOT_FOR_A_CACHE = {
    "out_dir": "a cache is analysed in memory, in one go: save the result with result.save(directory)",
    "resume": "a cache is analysed in memory, in one go: there is no run to resume",
    "device": "the analysis computes where the cache's tensors are",
    "corpus": "the cache holds the activations of its own tokens: pass those tokens as tokens=",
}


def analyze_cache(
    cache: Any,
    tokens: Tensor | None = None,
    settings: AnalysisSettings | None = None,
    *,
    progress: bool = False,
    **overrides: Any,
) -> AnalysisResult:
    """Measure what :func:`tl_geometry.analyze` measures, from the cache of ``model.run_with_cache(tokens)``.

    Parameters
    ----------
    cache : ActivationCache
        From ``run_with_cache`` of a ``TransformerBridge`` or a ``HookedTransformer``: it holds
        ``blocks.{l}.attn.hook_v`` and ``blocks.{l}.attn.hook_pattern`` of the layers analysed
        (``names_filter=lambda name: name.endswith(("attn.hook_v", "attn.hook_pattern"))`` keeps only
        those) and knows its model (``cache.model``).
    tokens : int tensor [n_seqs, seq_len] or [seq_len], optional
        The tokens the cache was made from, kept as ``result.tokens`` (None: not kept).
    settings : AnalysisSettings, optional
        As for :func:`tl_geometry.analyze`; a setting also given as a keyword replaces that field.
    {settings}
    progress : bool, default False
        Show a progress bar over sequences.

    Returns
    -------
    AnalysisResult
        The tables of ``analyze`` on the same tokens (``config["source"]`` is ``"ActivationCache"``).
    """
    refused = sorted(set(overrides) & set(NOT_FOR_A_CACHE))
    if refused:
        raise InputError(f"analyze_cache does not take {refused[0]}=: {NOT_FOR_A_CACHE[refused[0]]}")
    settings = combine_settings(settings, overrides, "analyze_cache(cache, ns=...)")
    cached = CachedActivations.of(cache)
    info = cached.info()
    wanted = range(info.n_layers) if settings.layers is None else settings.layers
    present = [layer for layer in wanted if layer < info.n_layers]  # resolve refuses the others by name
    cached.check_layers(present)
    n_seqs, seq_len = cached.shape(present[0]) if present else (0, 1)
    layers, queries = settings.resolve(info.n_layers, seq_len, info.sliding_windows)
    for layer in layers[1:]:
        if cached.shape(layer) != (n_seqs, seq_len):
            raise InputError(f"layers 0 and {layer} of the cache hold different sequences: cache one run_with_cache")
    plan = AnalysisPlan(
        model=cached.model,
        info=info,
        settings=settings,
        corpus_name="ActivationCache",
        tokens=checked_tokens(tokens, n_seqs, seq_len),
        layers=layers,
        queries=queries,
        cached=cached,
    )
    return run_analysis(plan, progress=progress)


def checked_tokens(tokens: Any, n_seqs: int, seq_len: int) -> Tensor | None:
    """``tokens`` as an int64 tensor ``[n_seqs, seq_len]`` (a 1-D one for a single sequence), or None."""
    if tokens is None:
        return None
    if not isinstance(tokens, Tensor) or tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise InputError(f"tokens must be an integer tensor of token ids, got {type(tokens).__name__}")
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tuple(tokens.shape) != (n_seqs, seq_len):
        raise InputError(
            f"tokens of shape {tuple(tokens.shape)} do not match the cache's {n_seqs} sequences of {seq_len} "
            "positions: pass the tokens given to run_with_cache"
        )
    return tokens.detach().to("cpu", torch.int64)


analyze_cache.__doc__ = fill_settings_doc(analyze_cache.__doc__)
analyze_cache.__signature__ = signature_with_settings(analyze_cache)  # type: ignore[attr-defined]

__all__ = ["NOT_FOR_A_CACHE", "analyze_cache", "checked_tokens"]
