"""``analyze_cache``: :func:`~tl_geometry.analyze`'s tables from the ``ActivationCache`` you already have.

Every analysis of ``analyze`` reads two hooks per layer, ``hook_v`` and ``hook_pattern``, so
``analyze_cache`` runs the same plan, loop and observers (:mod:`tl_geometry.pipeline.loop`) over
a cache instead of forward passes (:mod:`tl_geometry.capture.cached`): grouped-query values mapped
to their query heads and each query row cut to its causal keys as ``analyze`` does, same rows to
rounding. Settings are ``analyze``'s; its keywords about running the model (``out_dir``,
``resume``, ``device``) are refused by name.

A padded batch (``model.to_tokens(texts)`` pads the shorter texts) is measured over each row's
real tokens given ``attention_mask=`` (``transformer_lens.utilities.get_attention_mask``): its query
positions count from the row's first real token and ``"last"`` is its last real token. Pads
found in ``tokens`` without a mask are refused, as is a cache whose real tokens attended to pads
(made without the mask).

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

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from tl_geometry.capture.cached import CachedActivations
from tl_geometry.capture.padding import MASK_ADVICE, find_padding, real_spans
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

#: How far from 1 the attention of a padded row's last real token over its real keys may be
#: (float32 rounding of a softmax); more means the model attended to the pads.
PAD_ATTENTION_TOLERANCE = 1e-4


def analyze_cache(
    cache: Any,
    tokens: Tensor | None = None,
    settings: AnalysisSettings | None = None,
    *,
    attention_mask: Tensor | None = None,
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
    attention_mask : int or bool tensor [n_seqs, seq_len], optional
        For a padded batch: 1 for a real token, 0 for a pad (as ``transformer_lens.utilities.get_attention_mask`` gives
        it, and as given to ``run_with_cache(tokens, attention_mask=...)``). Each row is measured
        over its real tokens alone; ``diagnostics`` needs rows of one length and is refused.
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
    spans = padded_spans(cached.model, tokens, attention_mask, n_seqs, seq_len)
    if spans is not None:
        check_padded(cached, settings, spans, layers, info.n_layers)
        cached = replace(cached, real_spans=spans)
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


def padded_spans(
    model: Any, tokens: Any, attention_mask: Any, n_seqs: int, seq_len: int
) -> tuple[tuple[int, int], ...] | None:
    """Each row's (first real position, number of real tokens) when the batch is padded, else None.

    From ``attention_mask`` when given; without it, pads found in ``tokens`` (the model's pad
    token, :func:`~tl_geometry.capture.padding.find_padding`) are refused, naming the fix.
    """
    if attention_mask is not None:
        spans = real_spans(attention_mask, (n_seqs, seq_len))
        return None if all(span == (0, seq_len) for span in spans) else spans
    if not isinstance(tokens, Tensor) or tokens.is_floating_point():
        return None  # checked_tokens names the problem
    padded = find_padding(tokens if tokens.ndim == 2 else tokens[None], getattr(model, "tokenizer", None))
    if padded is None:
        return None
    rows, side = padded
    raise InputError(
        f"rows {rows[:8]}{' ...' if len(rows) > 8 else ''} of tokens are padded on the {side} (the pad token "
        f"{model.tokenizer.pad_token_id}): pass {MASK_ADVICE} (the same mask as to run_with_cache) to measure each "
        "row over its real tokens, or attention_mask=torch.ones_like(tokens) if those tokens are text"
    )


def check_padded(
    cached: CachedActivations,
    settings: AnalysisSettings,
    spans: tuple[tuple[int, int], ...],
    layers: list[int],
    n_layers: int,
) -> None:
    """Refuse, naming the fix, what a padded batch cannot give: the diagnostics (one query for every
    row), query positions beyond a short row, or a cache whose real tokens attended to its pads."""
    if settings.diagnostics:
        raise InputError(
            "the diagnostics average one query position over every row, and a padded batch's rows end at "
            "different positions: pass diagnostics=False (or analyse rows of one length)"
        )
    for row, (_, length) in enumerate(spans):
        try:
            settings.resolve(n_layers, length, cached.info().sliding_windows)
        except InputError as error:
            raise InputError(f"row {row} of the padded batch has {length} real tokens: {error}") from None
    for layer in layers:
        _, pattern = cached.layer(layer)
        for row, (first, length) in enumerate(spans):
            real = pattern[row, :, first + length - 1, first : first + length].sum(-1)  # [head]
            leak = float((1 - real).abs().max())
            if leak > PAD_ATTENTION_TOLERANCE:
                raise InputError(
                    f"the cache was made without this attention mask: in layer {layer}, row {row}'s last real "
                    f"token gives {leak:.3g} of its attention to pads; run "
                    "model.run_with_cache(tokens, attention_mask=attention_mask) and pass the same mask here"
                )


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

__all__ = [
    "NOT_FOR_A_CACHE",
    "PAD_ATTENTION_TOLERANCE",
    "analyze_cache",
    "check_padded",
    "checked_tokens",
    "padded_spans",
]
