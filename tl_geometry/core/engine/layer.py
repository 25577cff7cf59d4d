"""``separability_of_layer``: the separability engine's one door for a layer of a forward pass.

A layer batch is the attention rows of some query positions, every head and window of a batch, with
the layer's values. :func:`tl_geometry.core.engine.dispatch.plan_layer` decides which rows go to the block
pipeline together (:func:`~tl_geometry.core.engine.query_engine.separability_queries`) and which one at a
time, cut to the keys their query sees (:func:`~tl_geometry.core.engine.rows.separability_rankings`);
this module runs that plan and returns every row as one :class:`~tl_geometry.core.engine.query_engine.QueryRows`
per ranking, the query positions in the order given. Callers above ``core/`` (the observers) call
this and nothing else: they never choose an engine.

>>> import torch
>>> weights = torch.tensor([0.4, 0.3, 0.2, 0.1]).expand(1, 2, 1, 4)  # [batch, head, query, key]
>>> values = torch.arange(8.0).reshape(1, 4, 1, 2)  # [batch, key, kv_head, d]
>>> rows = separability_of_layer(weights, values, (3,), torch.tensor([0, 0]), ns=[1, 4])
>>> rows["attention"].ns.tolist(), rows["attention"].recall[0, 0].tolist()
([[1, 4]], [[1.0, 1.0]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.core.checks import typechecked
from tl_geometry.core.engine.dispatch import plan_layer
from tl_geometry.core.engine.query_engine import QueryRows, separability_queries
from tl_geometry.core.engine.rows import Separability, separability_rankings
from tl_geometry.core.layouts import values_per_head
from tl_geometry.core.metrics import METRICS
from tl_geometry.core.rankings import DEFAULT_N_RANDOM, check_rankings
from tl_geometry.core.sizes import DEFAULT_NS, NsLike, clip_ns
from tl_geometry.errors import InputError


@typechecked
def separability_of_layer(
    weights: Float[Tensor, "batch head query key"],
    values: Float[Tensor, "batch key kv_head d"],
    query_positions: Sequence[int],
    kv_head_of: Int[Tensor, " head"],
    first_keys: Sequence[int] | None = None,
    ns: NsLike = DEFAULT_NS,
    rank_by: Any = ("attention",),
    *,
    distance: str = "euclidean",
    n_random: int = DEFAULT_N_RANDOM,
    seed: int = 0,
    row_keys: Int[Tensor, "batch head query"] | None = None,
    kernel: str | None = None,
) -> dict[str, QueryRows]:
    """Separability of every head and query row of one layer, for each ranking of ``rank_by``.

    Row ``(b, h, j)`` is query ``q = query_positions[j]`` of head ``h``: the weights
    ``weights[b, h, j, first:q + 1]`` over the values ``values[b, first:q + 1, kv_head_of[h]]`` with
    ``first = first_keys[j]`` (the first key its query sees: 0 on a global layer, ``q - W + 1`` on a
    sliding-window layer of ``W`` keys). Its metrics are those of :func:`tl_geometry.core.separability`
    for that row alone, for its own grid (``clip_ns(ns, q + 1)`` resolved over its keys).

    Parameters
    ----------
    weights : [batch, head, query, key]
        Attention rows of the chosen queries (keys after ``q`` are the pattern's zeros).
    values : [batch, key, kv_head, d]
        Value vectors of every position (as ``hook_v`` gives them).
    query_positions : sequence of int
        ``q`` of each query row.
    kv_head_of : [head] int64
        The key/value head of each query head (definitions §1).
    first_keys : sequence of int, optional
        The first key each query sees (default: 0 for every query, a global layer).
    ns, distance, n_random, seed, kernel : as for :func:`tl_geometry.core.separability`.
    rank_by : str or sequence of str
        The rankings, each once (:func:`tl_geometry.core.rankings.check_rankings`).
    row_keys : [batch, head, query] int64, optional
        Keys of the rows for ``rank_by="random"`` (:func:`tl_geometry.core.rankings.row_keys`).

    Returns
    -------
    dict of str to QueryRows
        Keyed by ranking, in the order given; the metrics ``[batch, head, query, n]`` in the order of
        ``query_positions``, ``ns`` and ``valid`` ``[query, n]`` each query's sizes.
    """
    rankings = check_rankings(rank_by)
    queries = tuple(int(q) for q in query_positions)
    firsts = (0,) * len(queries) if first_keys is None else tuple(int(f) for f in first_keys)
    if len(firsts) != len(queries) or any(not 0 <= f <= q for f, q in zip(firsts, queries)):
        raise InputError(f"first_keys must give one first visible key 0 <= first <= q per query, got {firsts}")
    plan = plan_layer(firsts)
    pieces: list[tuple[tuple[int, ...], dict[str, QueryRows]]] = []
    if plan.blocks:
        pieces.append(
            (
                plan.blocks,
                _blocks(
                    weights,
                    values,
                    queries,
                    kv_head_of,
                    plan.blocks,
                    ns,
                    rankings,
                    distance,
                    n_random,
                    seed,
                    row_keys,
                    kernel,
                ),
            )
        )
    if plan.rows:
        per_head = values_per_head(values, kv_head_of)  # [b, h, L, d]
        for index in plan.rows:
            q, first = queries[index], firsts[index]
            results = separability_rankings(  # the row cut to the keys its query sees
                weights[:, :, index, first : q + 1],
                per_head[:, :, first : q + 1],
                clip_ns(ns, q + 1),
                rankings,
                distance=distance,
                n_random=n_random,
                seed=seed,
                row_keys=None if row_keys is None else row_keys[:, :, index].to(weights.device),
                kernel=kernel,
            )
            pieces.append(((index,), {name: _as_query_rows(res, q) for name, res in results.items()}))
    if len(pieces) == 1 and pieces[0][0] == tuple(range(len(queries))):
        return pieces[0][1]
    return {name: _joined([(indices, rows[name]) for indices, rows in pieces], queries) for name in rankings}


def _blocks(
    weights: Tensor,
    values: Tensor,
    queries: tuple[int, ...],
    kv_head_of: Tensor,
    indices: tuple[int, ...],
    ns: NsLike,
    rankings: tuple[str, ...],
    distance: str,
    n_random: int,
    seed: int,
    row_keys: Tensor | None,
    kernel: str | None,
) -> dict[str, QueryRows]:
    """The rows ``indices`` (queries that see every earlier key) together, one call per ranking."""
    if len(indices) < len(queries):
        chosen = torch.tensor(indices, dtype=torch.int64, device=weights.device)
        weights = weights.index_select(2, chosen)
        row_keys = None if row_keys is None else row_keys.index_select(2, chosen.to(row_keys.device))
    positions = tuple(queries[i] for i in indices)
    keys = None if row_keys is None else row_keys.to(weights.device)
    return {
        name: separability_queries(
            weights,
            values,
            positions,
            kv_head_of,
            ns,
            rank_by=name,
            distance=distance,
            n_random=n_random,
            seed=seed,
            row_keys=keys,
            kernel=kernel,
        )
        for name in rankings
    }


def _as_query_rows(res: Separability, q: int) -> QueryRows:
    """One query's :class:`Separability` (``[batch, head, n]``) as :class:`QueryRows` of one query."""
    return QueryRows(
        query_positions=(q,),
        ns=res.ns[None],
        valid=torch.ones_like(res.ns, dtype=torch.bool)[None],
        **{name: getattr(res, name)[:, :, None] for name in METRICS},
        rank_by=res.rank_by,
        distance=res.distance,
        n_draws=res.n_draws,
    )


def _joined(pieces: list[tuple[tuple[int, ...], QueryRows]], queries: tuple[int, ...]) -> QueryRows:
    """The pieces (query indices, their rows) as one :class:`QueryRows` over ``queries``, each
    query's sizes padded to the longest grid (``ns`` 0, metrics NaN, ``valid`` false)."""
    first = pieces[0][1]
    batch, heads = first.precision.shape[:2]
    width = max(rows.ns.shape[1] for _, rows in pieces)
    device = first.precision.device
    ns = torch.zeros(len(queries), width, dtype=torch.int64, device=device)
    valid = torch.zeros(len(queries), width, dtype=torch.bool, device=device)
    metrics = {
        name: torch.full((batch, heads, len(queries), width), torch.nan, dtype=torch.float64, device=device)
        for name in METRICS
    }
    for indices, rows in pieces:
        at, n = torch.tensor(indices, dtype=torch.int64, device=device), rows.ns.shape[1]
        ns[at, :n] = rows.ns.to(torch.int64)
        valid[at, :n] = rows.valid
        for name in METRICS:
            metrics[name][:, :, at, :n] = getattr(rows, name).to(torch.float64)
    return QueryRows(
        query_positions=queries,
        ns=ns,
        valid=valid,
        **metrics,
        rank_by=first.rank_by,
        distance=first.distance,
        n_draws=first.n_draws,
    )


__all__ = ["separability_of_layer"]
