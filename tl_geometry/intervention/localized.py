"""Localised loss: restrict one layer, or one (layer, head), at a time (definitions §8).

Columns: docs/columns.md#localized-loss.

For each unit ``u``: ``delta_nll_rel(u) = (NLL_u - NLL) / NLL``, where ``NLL_u`` is the corpus
loss with only ``u``'s attention rows restricted to their top-``N`` keys and everything else full;
``NLL`` (the full model) is computed once. Cost: one pass over the corpus per unit.

Examples
--------
>>> import torch
>>> from tl_geometry.testing import tiny_llama_bridge
>>> from tl_geometry.corpus import from_tokens
>>> local = localized_loss(tiny_llama_bridge(), from_tokens(torch.randint(3, 259, (2, 16))), n=2,
...                        unit="layer", progress=False)
>>> list(local.columns)
['unit', 'layer', 'head', 'rank_by', 'renormalize', 'n', 'nll', 'nll_full', 'delta_nll_rel', 'n_tokens']
>>> len(local)
2
"""

from __future__ import annotations

import numbers
from typing import Any

import pandas as pd
import torch

from tl_geometry.core.progress import tqdm
from tl_geometry.core.rankings import check_rank_by, check_seed
from tl_geometry.corpus import as_corpus, corpus_tokens
from tl_geometry.errors import InputError
from tl_geometry.intervention.context import check_n, resolve_units, top_n_attention
from tl_geometry.intervention.loss import check_windows, corpus_nll
from tl_geometry.models import describe_model

UNITS = ("layer", "head")
LOCAL_COLUMNS = ["unit", "layer", "head", "rank_by", "renormalize", "n", "nll", "nll_full", "delta_nll_rel", "n_tokens"]


def check_unit(unit: Any) -> str:
    if not isinstance(unit, str) or unit not in UNITS:
        raise InputError(f"unit={unit!r} is not a unit: use 'layer' or 'head'")
    return unit


def localized_loss(
    model: Any,
    corpus: Any,
    n: int = 8,
    unit: str = "head",
    *,
    rank_by: str = "attention",
    renormalize: bool = False,
    layers: Any = None,
    seed: int = 0,
    batch_size: int = 4,
    progress: bool = True,
) -> pd.DataFrame:
    """``delta_nll_rel`` with one unit restricted at a time, everything else full.

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer with eager attention.
    corpus : a corpus or token windows ``[n_seqs, L]``.
    n : keys kept per query (>= 1).
    unit : ``"layer"`` (all heads of one layer) or ``"head"`` (one (layer, head)).
    rank_by, renormalize, seed : as in :func:`top_n_attention`.
    layers : None (all) or the layers whose units are measured.
    batch_size, progress : windows per forward pass; progress bars.

    Returns
    -------
    Tidy DataFrame, one row per unit: ``unit, layer, head, rank_by, renormalize, n, nll, nll_full,
    delta_nll_rel, n_tokens`` (``head`` is ``<NA>`` for ``unit="layer"``).
    """
    n, unit, rank_by, seed = check_n(n), check_unit(unit), check_rank_by(rank_by), check_seed(seed)
    if not isinstance(renormalize, bool):
        raise InputError(f"renormalize must be True or False, got {renormalize!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise InputError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    info = describe_model(model)
    chosen = sorted(resolve_units(info, layers, None))
    tokens = check_windows(corpus_tokens(model, as_corpus(corpus, 512), info))
    with top_n_attention(model, n=n, rank_by=rank_by):  # refuses a model that ignores pattern edits
        pass
    full = corpus_nll(model, tokens, batch_size, progress=False)
    units = (
        [(layer, None) for layer in chosen]
        if unit == "layer"
        else [(layer, h) for layer in chosen for h in range(info.n_heads)]
    )
    rows = []
    for layer, head in tqdm(units, desc=f"localised loss ({unit})", unit=unit, disable=not progress):
        with top_n_attention(
            model, n=n, rank_by=rank_by, renormalize=renormalize, layers=layer, heads=head, seed=seed
        ) as state:

            def set_ids(seq_ids: torch.Tensor) -> None:
                state.seq_ids = seq_ids

            loss = corpus_nll(model, tokens, batch_size, progress=False, before_batch=set_ids)
        rows.append(
            {
                "unit": unit,
                "layer": layer,
                "head": head,
                "rank_by": rank_by,
                "renormalize": renormalize,
                "n": n,
                "nll": loss.nll,
                "nll_full": full.nll,
                "delta_nll_rel": (loss.nll - full.nll) / full.nll,
                "n_tokens": loss.n_tokens,
            }
        )
    table = pd.DataFrame(rows, columns=LOCAL_COLUMNS)
    table["head"] = table["head"].astype("Int64")
    return table


__all__ = ["LOCAL_COLUMNS", "UNITS", "check_unit", "localized_loss"]
