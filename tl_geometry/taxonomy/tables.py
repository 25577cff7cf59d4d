"""The features table of raw tensors: what :class:`TaxonomyObserver` gives, without a model."""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry.core.checks import check_row_inputs, typechecked
from tl_geometry.core.sizes import DEFAULT_NS, NsLike, resolve_ns
from tl_geometry.taxonomy.accumulate import FeatureAccumulator
from tl_geometry.taxonomy.features import sink_similarity
from tl_geometry.taxonomy.observer import accumulate_rows


@typechecked
def regime_feature_table(
    weights: Float[Tensor, "seq head k"],
    values: Float[Tensor, "seq head k d"],
    ns: NsLike = DEFAULT_NS,
    *,
    layer: int = 0,
    parts: Any = None,
    dtype: torch.dtype = torch.float64,
) -> pd.DataFrame:
    """Features table (one row per ``(layer, head, query_pos, n)``) of attention rows you hold.

    The rows are those of query ``q = K - 1`` over keys ``0..q`` for every sequence and head;
    each head reads its own values (``kv_head = head``). Averaged over the ``seq`` axis exactly as
    :class:`~tl_geometry.taxonomy.TaxonomyObserver` averages over sequences, so
    :func:`~tl_geometry.taxonomy.classify_heads` accepts the result.

    Parameters
    ----------
    weights : [seq, head, K] attention weights.
    values : [seq, head, K, d] value vectors.
    ns : selection sizes, default "log" as ``analyze`` (None: every ``N``).
    layer : the ``layer`` column's value.
    parts : sequence of part labels, one per ``seq`` (optional): the table then merges all parts;
        use the accumulator directly for per-part tables.
    dtype : precision of the per-row computation.
    """
    check_row_inputs(weights, values)
    n_seqs, n_heads, n_keys = weights.shape
    ns_t = resolve_ns(ns, n_keys, device=weights.device)
    acc = FeatureAccumulator(torch.arange(n_heads))
    labels = [0] * n_seqs if parts is None else list(parts)
    values = values.to(dtype)
    accumulate_rows(
        acc, labels, list(range(n_seqs)), layer, n_keys - 1, ns_t, weights.to(dtype), values, sink_similarity(values)
    )
    return acc.table()
