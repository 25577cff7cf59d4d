"""Separability of every query row of one layer at once: the query engine (definitions §2, §7).

The same metrics as :func:`tl_geometry.core.separability.separability`, for every chosen query
``q`` (keys ``0..q``), head and ranking draw of a layer in blocks of queries: the inner products
``<v_i, s(N)>`` of a whole block come from one matrix product ``V S^T`` per key/value head, or from
running sums of the Gram matrix ``V V^T`` inside the compiled pass where that is cheaper (``products``),
rows of different lengths share one padded tensor (padding keys score ``-inf`` and never count), and
every decision is the per-row engine's exact float64 one. How and why: docs/engine.md.

Examples
--------

>>> import torch
>>> w = torch.softmax(torch.randn(1, 2, 4, 4).tril() * 4 - torch.ones(4, 4).triu(1) * 1e9, -1)
>>> v = torch.randn(1, 4, 1, 3)
>>> rows = separability_queries(w, v, [0, 1, 2, 3], kv_head_of=torch.tensor([0, 0]), ns="all")
>>> rows.ns.tolist()   # one grid per query (K = q + 1), padded with 0
[[1, 0, 0, 0], [1, 2, 0, 0], [1, 2, 3, 0], [1, 2, 3, 4]]
>>> rows.precision.shape   # [batch, head, query, n]
torch.Size([1, 2, 4, 4])
>>> from tl_geometry.core.separability import separability
>>> one = separability(w[:, :, 2, :3], v[:, :3, 0][:, None].expand(1, 2, 3, 3), "all")
>>> torch.equal(one.recall, rows.recall[:, :, 2, :3])
True
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import einops
import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry.core.checks import check_row_inputs, typechecked
from tl_geometry.core.engine import fused
from tl_geometry.core.engine.batched import layer_metrics
from tl_geometry.core.engine.dispatch import route
from tl_geometry.core.engine.screening import SCREEN_DTYPE  # the screen's dtype by default: one for both
from tl_geometry.core.metrics import COMPUTED_METRICS, METRICS, SeparabilityMetrics
from tl_geometry.core.numerics import cosine_distance, local_errors, pow2, scale_exponents, times_pow2
from tl_geometry.core.rankings import (
    COSINE_EPS,
    DEFAULT_N_RANDOM,
    check_distance,
    check_n_random,
    check_rank_by,
    check_seed,
    ranking_scores,
    row_keys,
    selection_order,
    uniform_scores,
)
from tl_geometry.core.sizes import DEFAULT_NS, NsLike, clip_ns, resolve_ns
from tl_geometry.errors import InputError

#: Cells (rows x keys x (sizes + d_head)) of one block: 4 M (32 MiB per float64 tensor of the
#: block). Measured on one SmolLM2-135M layer (512 tokens, every query, 9 heads, log grid, float64,
#: one thread): 1 M 2.25 s, 2 M 1.60 s, 4 M 1.02 s, 8 M 1.07 s, 16 M 1.19 s.
DEFAULT_BLOCK_CELLS = 1 << 22

#: How the products ``<v_i, s(N)>`` are formed (``products=``): ``"values"``, one matrix product of
#: the values and the centres per block; ``"gram"``, running sums of the rows of ``G = V V^T`` along
#: each row's selection order inside the compiled pass (Euclidean, ``kernel="numba"``); ``"auto"``,
#: the cheaper per block (:data:`GRAM_COST`).
PRODUCTS = ("auto", "values", "gram")

#: ``"auto"`` takes the Gram route for a block of ``K`` keys, ``G`` sizes and ``d`` dimensions where
#: ``GRAM_COST * K <= G * d``: the running sums make ``K`` multiply-adds per key and row, the value
#: product ``G d``, and a running sum costs about this many times one multiply-add of the product
#: (measured on SmolLM2-135M layers of 512 and 1024 tokens, benchmarks/bench_query_layer.py).
GRAM_COST = 2

#: The Gram matrices of one call (``P K^2`` entries) take at most this many bytes: the blocks whose
#: ``K`` would need more take the value route.
GRAM_MAX_BYTES = 64 << 20

#: The Gram matrices are stored in float32 (half the bytes that the running sums stream; the band
#: takes their rounding, docs/engine.md) where every value exponent of the call lies within this of
#: 0, so that no entry (at most ``d 2^80``) overflows float32; else in float64.
GRAM_FLOAT32_EXPONENT = 40

#: The cells a Gram-route row counts per key in a block's budget: its per-key rows (weights, order,
#: ranks, sorted weights, their running sum, norms) and room; it stores no ``[G, K]`` product.
GRAM_ROW_CELLS = 8

#: The Gram route takes a block's rows whose value exponents lie within this of 0 (its powers of
#: two ``2^(-2 value_exp)`` stay far from float64's limits); other blocks take the value route.
GRAM_MAX_EXPONENT = 200

#: A row whose values' scale lies more than ``2**MAX_SCALE_GAP`` below its block's (values of very
#: different magnitudes in one window) is not screened: every key of it is decided by direct
#: float64 distances (exact, only slower).
MAX_SCALE_GAP = 60

#: Up to this gap the rows' contributions are formed from the block's values (``w 2^gap`` times
#: ``v 2^-block_exp``), which is exact; beyond it from each row's own scaled values.
MAX_FOLDED_GAP = 900


@dataclass(frozen=True, kw_only=True)
class QueryRows(SeparabilityMetrics):
    """Separability of every head and chosen query row of one layer (definitions §2 and §7).

    The metrics of :class:`~tl_geometry.core.metrics.SeparabilityMetrics`, each of shape
    ``[batch, head, query, n]`` float64 (NaN where ``valid`` is false).

    Attributes
    ----------
    query_positions : the query positions ``q``, in the order given (row ``q`` has ``K = q + 1`` keys).
    ns : [query, n] int64
        The selection sizes of each query's grid (resolved with ``K = q + 1``), padded with 0.
    valid : [query, n] bool
        Where ``ns`` holds a size (``ns > 0``).
    """

    query_positions: tuple[int, ...]
    ns: Int[Tensor, "query n"]
    valid: Bool[Tensor, "query n"]


@typechecked
def separability_queries(
    weights: Float[Tensor, "batch head query key"],
    values: Float[Tensor, "batch key kv_head d"],
    query_positions: Sequence[int],
    kv_head_of: Int[Tensor, " head"],
    ns: NsLike = DEFAULT_NS,
    *,
    rank_by: str = "attention",
    distance: str = "euclidean",
    n_random: int = DEFAULT_N_RANDOM,
    seed: int = 0,
    row_keys: Int[Tensor, "batch head query"] | None = None,
    block_cells: int = DEFAULT_BLOCK_CELLS,
    kernel: str | None = None,
    screen: torch.dtype | None = None,
    products: str = "auto",
) -> QueryRows:
    """Separability of every head and query row of one layer, all query positions at once.

    Row ``(b, h, j)`` is the attention row of query ``q = query_positions[j]``: weights
    ``weights[b, h, j, :q + 1]`` over the values ``values[b, :q + 1, kv_head_of[h]]``. Its metrics are
    those :func:`tl_geometry.core.separability` gives for that row alone (same counts, radii to rounding),
    for its own grid ``resolve_ns(ns, q + 1)``.

    Parameters
    ----------
    weights : [batch, head, query, key]
        Attention rows of the chosen queries; keys after ``q`` are ignored (the pattern's zeros).
    values : [batch, key, kv_head, d]
        Value vectors of every position (as ``hook_v`` gives them).
    query_positions : sequence of int
        ``q`` of each query row, ``0 <= q < key``.
    kv_head_of : [head] int64
        The key/value head of each query head (definitions §1).
    ns, rank_by, distance, n_random, seed, kernel : as for :func:`tl_geometry.core.separability`
        (every count and radius is that of float64 distances, whatever the inputs' dtype).
    row_keys : [batch, head, query] int64, optional
        Keys of the rows for ``rank_by="random"`` (:func:`tl_geometry.core.rankings.row_keys`).
    block_cells : int
        Working-set size of one block (rows x keys x (sizes + d); on the Gram route rows x
        (``GRAM_ROW_CELLS`` keys + sizes d)); a tuning knob only.
    screen : {torch.float32, torch.float64}, optional
        The dtype of the screen's product and bounds: :data:`SCREEN_DTYPE` (float32) by default, as
        the per-row engine screens; float64 only to compare (the compiled route). The keys the screen cannot call are
        decided in float64 either way, so every metric is the same, bit for bit.
    products : {"auto", "values", "gram"}
        How the inner products ``<v_i, s(N)>`` of the screen are formed (:data:`PRODUCTS`): one
        matrix product per block (``"values"``, in ``screen``'s dtype), running sums of the Gram
        matrix inside the compiled pass (``"gram"``, float64 sums; Euclidean with ``kernel="numba"``,
        else the value route), or the cheaper per block (``"auto"``). Every metric is the same,
        bit for bit.

    Returns
    -------
    QueryRows
    """
    rank_by, distance = check_rank_by(rank_by), check_distance(distance)
    n_random, seed = check_n_random(n_random), check_seed(seed)
    queries = tuple(int(q) for q in query_positions)
    n_batch, n_heads, n_queries, n_pos = weights.shape
    if len(queries) != n_queries:
        raise InputError(f"{len(queries)} query positions for {n_queries} query rows: give one position per row")
    if values.shape[0] != n_batch or values.shape[1] != n_pos:
        raise InputError(
            f"values of shape {tuple(values.shape)} do not match the weights {tuple(weights.shape)}: "
            "give [batch, key, kv_head, d] with the weights' batch and keys"
        )
    if any(not 0 <= q < n_pos for q in queries):
        raise InputError(f"query positions must lie in 0..{n_pos - 1} (the rows have {n_pos} keys), got {queries}")
    if kv_head_of.numel() != n_heads or bool(((kv_head_of < 0) | (kv_head_of >= values.shape[2])).any()):
        raise InputError(f"kv_head_of must give one key/value head in 0..{values.shape[2] - 1} per query head")
    if row_keys is not None and tuple(row_keys.shape) != (n_batch, n_heads, n_queries):
        raise InputError(f"row_keys must have shape {(n_batch, n_heads, n_queries)}, one key per row")
    path = route(weights.device, kernel)
    screen = SCREEN_DTYPE if screen is None else screen
    if screen not in (torch.float32, torch.float64):
        raise InputError(f"screen must be torch.float32 or torch.float64, got {screen}")
    if products not in PRODUCTS:
        raise InputError(f"products must be one of {PRODUCTS}, got {products!r}")
    if path == "torch":
        return _batched(weights, values, queries, kv_head_of, ns, rank_by, distance, n_random, seed, row_keys)
    if distance != "euclidean":
        products = "values"  # the Gram route is a part of the compiled Euclidean pass
    with _block_threads(weights.device) as workers:  # see _solve_all
        return _compute(
            weights,
            values,
            queries,
            kv_head_of,
            ns,
            rank_by,
            distance,
            n_random,
            seed,
            row_keys,
            screen,
            block_cells,
            workers,
            products,
        )


def _batched(
    weights: Tensor,
    values: Tensor,
    queries: tuple[int, ...],
    kv_head_of: Tensor,
    ns: NsLike,
    rank_by: str,
    distance: str,
    n_random: int,
    seed: int,
    row_keys: Tensor | None,
) -> QueryRows:
    """:func:`separability_queries` on the batched route (:func:`tl_geometry.core.engine.batched.layer_metrics`)."""
    device, n_seen = weights.device, max(queries) + 1  # the keys some row sees
    weights, values = weights[..., :n_seen], values[:, :n_seen]
    q_t = torch.tensor(queries, dtype=torch.int64, device=device)
    check_row_inputs(torch.where(torch.arange(n_seen, device=device) <= q_t[:, None], weights, 0), values)
    grid = _Grid.of(ns, queries, device)
    n_draws = n_random if rank_by == "random" else 1
    out = layer_metrics(
        weights,
        values,
        kv_head_of,
        q_t + 1,
        grid.ns,
        rank_by=rank_by,
        distance=distance,
        n_draws=n_draws,
        seed=seed,
        row_keys=row_keys,
    )
    return _query_rows(out, grid, queries, rank_by, distance, n_draws)


def _query_rows(
    out: dict[str, Tensor], grid: "_Grid", queries: tuple[int, ...], rank_by: str, distance: str, n_draws: int
) -> QueryRows:
    """The per-draw metrics ``[batch, head, query, draw, size]`` as :class:`QueryRows`: the
    F-scores of each draw, then means over the draws (definitions §7)."""
    out["f_at_rmax"] = 2 * out["precision"] / (1 + out["precision"])
    out["f_at_rmin"] = 2 * out["recall"] / (1 + out["recall"])
    nan = grid.ns.new_full((), torch.nan, dtype=torch.float64)  # a fill on the device, no copy from the host
    metrics = {
        name: torch.where(grid.valid, x[:, :, :, 0] if n_draws == 1 else x.mean(dim=3), nan) for name, x in out.items()
    }
    return QueryRows(
        query_positions=queries,
        ns=torch.where(grid.valid, grid.ns, 0),
        valid=grid.valid,
        **{name: metrics[name] for name in METRICS},
        rank_by=rank_by,
        distance=distance,
        n_draws=n_draws,
    )


def _compute(
    weights: Tensor,
    values: Tensor,
    queries: tuple[int, ...],
    kv_head_of: Tensor,
    ns: NsLike,
    rank_by: str,
    distance: str,
    n_random: int,
    seed: int,
    row_keys: Tensor | None,
    screen: torch.dtype,
    block_cells: int,
    workers: int,
    products: str,
) -> QueryRows:
    """:func:`separability_queries` after its checks, on the compiled route."""
    n_batch, n_heads, n_queries, n_pos = weights.shape
    device = weights.device
    q_t = torch.tensor(queries, dtype=torch.int64, device=device)
    causal = torch.arange(n_pos, device=device) <= q_t[:, None]  # [query, key]
    # in the given dtype: each block takes its rows in float64 (float32 and float16 convert exactly),
    # so that no float64 copy of every row is made at once (on a busy heap: fresh pages, faulted in)
    weights = torch.where(causal, weights, 0)
    values = values[:, : max(queries) + 1]  # the keys some row sees
    check_row_inputs(weights, values)
    values, kv_head_of = _grouped(values, kv_head_of)
    values = values.to(torch.float64)
    grid = _Grid.of(ns, queries, device)
    n_draws = n_random if rank_by == "random" else 1
    shape = (n_batch, n_heads, n_queries, n_draws, grid.ns.shape[1])
    out = {name: torch.full(shape, torch.nan, dtype=torch.float64, device=device) for name in COMPUTED_METRICS}
    problem = _Problem(
        weights[..., : values.shape[1]],
        values,
        kv_head_of,
        q_t,
        grid,
        rank_by,
        distance,
        n_draws,
        seed,
        row_keys,
        screen,
        _value_exponents(values),
        products=products,
    )
    groups = n_batch * values.shape[2]
    small = bool((problem.value_exps.abs() <= GRAM_FLOAT32_EXPONENT).all())
    gram_dtype = torch.float32 if small else torch.float64
    blocks, gram_keys = _blocks(
        queries, n_batch * n_heads * n_draws, values.shape[-1], grid, block_cells, products, groups, gram_dtype.itemsize
    )
    if gram_keys:  # <v_i, v_j> of the keys 0..K-1 of the longest Gram-route block, per group
        keys = einops.rearrange(values[:, :gram_keys], "b k g d -> (b g) k d")
        problem.gram = torch.bmm(keys, keys.mT).to(gram_dtype).numpy()  # float64, then rounded once
    _solve_all(problem, blocks, out, workers)
    return _query_rows(out, grid, queries, rank_by, distance, n_draws)


def _takes_gram(products: str, n_keys: int, n_sizes: int, dim: int, groups: int, itemsize: int) -> bool:
    """Whether a block of ``n_keys`` keys and ``n_sizes`` sizes (``groups`` key/value heads times the
    batch) forms its products from the Gram matrix (of entries of ``itemsize`` bytes)."""
    if products == "values" or groups * n_keys * n_keys * itemsize > GRAM_MAX_BYTES:
        return False
    return products == "gram" or GRAM_COST * n_keys <= n_sizes * dim


def _value_exponents(values: Tensor) -> Tensor:
    """The binary exponent of ``max |v|`` over keys ``0..k`` of each key ``k`` and key/value head:
    [b, L, g] int32 (a row ending at ``k`` scales its values by ``2^-exponent``)."""
    running = torch.cummax(values.abs().amax(dim=-1), dim=1).values
    return torch.frexp(running).exponent


def _grouped(values: Tensor, kv_head_of: Tensor) -> tuple[Tensor, Tensor]:
    """Values and ``kv_head_of`` such that the heads of a key/value head are consecutive and
    equally many (``h // group``, as models group them); other maps get one value head per head."""
    n_heads, n_kv = kv_head_of.numel(), values.shape[2]
    if n_heads % n_kv == 0:
        standard = torch.arange(n_heads, device=kv_head_of.device) // (n_heads // n_kv)
        if torch.equal(kv_head_of.to(standard.device), standard):
            return values, standard
    per_head = values.index_select(2, kv_head_of.to(values.device))
    return per_head, torch.arange(n_heads, device=kv_head_of.device)


@dataclass(frozen=True)
class _Grid:
    """Each query's selection sizes, padded to the longest grid with ``N = K`` (valid = False).

    The engine works on each grid sorted (``ascending``: the running sums of the centres,
    :func:`tl_geometry.core.engine.fused.prefix_sums`, need non-decreasing sizes); ``unsort`` [query, G] puts a result back in the given order (None when every grid is
    sorted already, as ``"log"`` and ``"all"`` are)."""

    ns: Tensor  # [query, G] int64
    valid: Tensor  # [query, G] bool
    ascending: Tensor  # [query, G] int64
    unsort: Tensor | None

    @classmethod
    def of(cls, ns: NsLike, queries: tuple[int, ...], device: torch.device) -> "_Grid":
        if isinstance(ns, (str, type(None))):
            key: object = ns
        else:
            key = tuple(int(n) for n in (ns.tolist() if hasattr(ns, "tolist") else ns))
        padded, valid = _grids(key, queries)  # every layer of a run asks for the same grids
        # stable: a valid N = K stays before the padding, so the valid sizes stay first
        ascending, where = torch.sort(padded, dim=1, stable=True)
        unsort = None if torch.equal(ascending, padded) else torch.argsort(where, dim=1).to(device)
        return cls(padded.to(device), valid.to(device), ascending.to(device), unsort)


@lru_cache(maxsize=16)
def _grids(ns: object, queries: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Each query's grid ``resolve_ns(clip_ns(ns, q + 1), q + 1)`` padded with ``N = K``, and where it is valid."""
    grids = {k: resolve_ns(clip_ns(ns, k), k) for k in sorted({q + 1 for q in queries})}
    width = max(g.shape[0] for g in grids.values())
    padded = torch.stack([torch.cat([g, g.new_full((width - g.shape[0],), k)]) for k, g in grids.items()])
    valid = torch.stack([torch.arange(width) < g.shape[0] for g in grids.values()])
    index = torch.tensor([list(grids).index(q + 1) for q in queries], dtype=torch.int64)
    return padded[index], valid[index]


def _blocks(
    queries: tuple[int, ...],
    rows_per_query: int,
    dim: int,
    grid: _Grid,
    block_cells: int,
    products: str = "values",
    groups: int = 1,
    gram_itemsize: int = 8,
) -> tuple[list[Tensor], int]:
    """Query indices in blocks of nearby positions, each within ``block_cells`` (one query at least),
    none padding its shortest row by more than a quarter (plus 8 keys). A row of ``K`` keys and ``G``
    sizes counts ``K (G + d)`` cells (the value product's ``[G, K]`` and the sums' ``[K, d]``), or
    ``GRAM_ROW_CELLS K + G d`` where it takes the Gram route (its per-key rows and its centres).
    Also the largest ``K`` of the blocks that take the Gram route (0: none): the Gram matrices' size
    (``groups`` of them, of entries of ``gram_itemsize`` bytes)."""
    by_position = sorted(range(len(queries)), key=lambda j: queries[j])
    width = grid.valid.sum(dim=1).tolist()
    blocks: list[list[int]] = []
    current: list[int] = []
    top = 0
    for j in by_position:
        keys = max(top, queries[j] + 1)
        sizes = max([width[i] for i in current] + [width[j]])
        too_long = current and keys > (queries[current[0]] + 1) * 5 // 4 + 8
        gram = _takes_gram(products, keys, sizes, dim, groups, gram_itemsize)
        per_row = GRAM_ROW_CELLS * keys + sizes * dim if gram else keys * (sizes + dim)
        if current and (too_long or rows_per_query * (len(current) + 1) * per_row > block_cells):
            blocks.append(current)
            current, keys = [], queries[j] + 1
        current.append(j)
        top = keys
    blocks.append(current)
    shapes = [(queries[b[-1]] + 1, max(width[i] for i in b)) for b in blocks]  # K and G (b by position)
    gram_keys = max((k for k, g in shapes if _takes_gram(products, k, g, dim, groups, gram_itemsize)), default=0)
    return [torch.tensor(b, dtype=torch.int64) for b in blocks], gram_keys


@contextmanager
def _block_threads(device: torch.device) -> Iterator[int]:
    """How many threads solve whole blocks (torch's intra-op threads on the CPU, else 1), with torch
    itself set to one intra-op thread meanwhile (restored after).

    A block is dozens of tensor operations of a few milliseconds each; splitting each of them
    across threads costs a barrier per operation, which on a shared machine waits for the slowest
    core every time. Whole blocks per thread avoid that; the blocks write disjoint queries.
    """
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads <= 1:
        yield 1
        return
    torch.set_num_threads(1)
    try:
        yield threads
    finally:
        torch.set_num_threads(threads)


def _solve_all(problem: "_Problem", blocks: list[Tensor], out: dict[str, Tensor], workers: int) -> None:
    """Solve every block, on ``workers`` threads (see :func:`_block_threads`)."""
    if workers <= 1 or len(blocks) <= 1:
        for block in blocks:
            problem.solve(block, out)
        return
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def solve(block: Tensor) -> None:  # in the caller's autograd modes (they are per thread)
        torch.set_num_threads(1)  # this worker's operations run on it alone
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            problem.solve(block, out)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(solve, blocks))


@dataclass
class _Problem:
    """One layer's rows; :meth:`solve` computes one block of queries into the output tensors."""

    weights: Tensor  # [b, h, Q, L] the given dtype, zero after q (a block converts its rows to float64)
    values: Tensor  # [b, L, g, d] float64
    kv_head_of: Tensor  # [h], consecutive equal groups
    queries: Tensor  # [Q] int64
    grid: _Grid
    rank_by: str
    distance: str
    n_draws: int
    seed: int
    row_keys: Tensor | None
    screen: torch.dtype  # the screen's dtype (every decision is float64)
    value_exps: Tensor  # [b, L, g] int32: the exponent of max |v| over keys 0..k (rows ending at k)
    products: str = "values"  # see PRODUCTS
    # [P, K, K] float32 or float64 (GRAM_FLOAT32_EXPONENT): <v_i, v_j> per group, K of the longest Gram-route block
    gram: np.ndarray | None = None

    def solve(self, block: Tensor, out: dict[str, Tensor]) -> None:
        block = block.to(self.weights.device)
        n_batch, n_heads = self.weights.shape[:2]
        n_kv = self.values.shape[2]
        q = self.queries[block]  # [Qb]
        n_keys = int(q.max()) + 1
        rows = _BlockRows.of(self, block, q, n_keys)
        metrics = rows.metrics()
        unsort = None if self.grid.unsort is None else self.grid.unsort[block]
        first = int(block[0])
        consecutive = torch.equal(block, torch.arange(first, first + block.numel(), device=block.device))
        at: slice | Tensor = slice(first, first + block.numel()) if consecutive else block  # a view, no index_put
        for name, x in metrics.items():  # x: [P, hg, Qb, draw, G] -> out [b, h, Q, draw, G]
            x = einops.rearrange(x, "(b g) j q r n -> b (g j) q r n", b=n_batch, g=n_kv)
            if unsort is not None:  # the sizes in the given order (within the block's width)
                x = torch.gather(x, -1, unsort[None, None, :, None, : x.shape[-1]].expand_as(x))
            out[name][:, :, at, :, : x.shape[-1]] = x


@dataclass
class _BlockRows:
    """The rows of one block of queries, grouped by key/value head.

    Shapes: ``P = batch * kv_head`` groups, ``J = heads per group``, ``Qb`` queries, ``D`` draws,
    ``K`` keys (the block's longest row), ``G`` sizes, ``d`` value dimensions. The engine rows
    ``e = (j, q, draw)`` of a group share its values.
    """

    problem: _Problem
    q: Tensor  # [Qb]
    ns: Tensor  # [Qb, G]
    w: Tensor  # [P, J, Qb, K] scaled weights, float64
    v: Tensor  # [P, K, d] float64, unscaled
    weight_exp: Tensor  # [P, J, Qb]
    value_exp: Tensor  # [P, Qb]
    order: Tensor  # [P, J, Qb, D, K]
    block_exp: Tensor  # [P] the largest value exponent of the block
    v_block: Tensor  # [P, K, d] float64, v * 2^-block_exp

    @classmethod
    def of(cls, problem: _Problem, block: Tensor, q: Tensor, n_keys: int) -> "_BlockRows":
        n_kv = problem.values.shape[2]
        w = problem.weights[:, :, block, :n_keys].to(torch.float64)  # [b, h, Qb, K]
        w = einops.rearrange(w, "b (g j) q k -> (b g) j q k", g=n_kv)
        v = einops.rearrange(problem.values[:, :n_keys], "b k g d -> (b g) k d")
        # the per-row scaling of tl_geometry.core.engine.rows: keys 0..q of each row
        weight_exp, _ = scale_exponents(w.amax(dim=-1), w.new_zeros(()), q + 1)
        value_exp = einops.rearrange(problem.value_exps[:, q], "b q g -> (b g) q")  # [P, Qb]
        w = times_pow2(w, -weight_exp[..., None])
        width = int(problem.grid.valid[block].sum(dim=1).max())  # the block's longest grid
        block_exp = value_exp.amax(dim=-1)
        v_block = times_pow2(v, -block_exp[:, None, None])
        order = cls._order(problem, block, q, w, v_block)
        return cls(
            problem, q, problem.grid.ascending[block, :width], w, v, weight_exp, value_exp, order, block_exp, v_block
        )

    @staticmethod
    def _order(problem: _Problem, block: Tensor, q: Tensor, w: Tensor, v: Tensor) -> Tensor:
        """The selection order of every row and draw, padding keys last: [P, J, Qb, D, K]."""
        n_keys = w.shape[-1]
        keys = torch.arange(n_keys, device=w.device)
        padding = keys > q[:, None]  # [Qb, K]
        if problem.rank_by != "random":  # the group's values broadcast over its rows
            scores = ranking_scores(w, v[:, None, None], problem.rank_by)
        else:
            n_kv = problem.values.shape[2]
            keys_all = problem.row_keys
            if keys_all is None:  # the row's index in the flattened [batch, head, query] of the call
                b, h, n_q = problem.weights.shape[:3]
                keys_all = row_keys(seq=torch.arange(b * h * n_q, device=w.device).reshape(b, h, n_q))
            keys_blk = einops.rearrange(
                keys_all[:, :, block.to(keys_all.device)].to(w.device), "b (g j) q -> (b g) j q", g=n_kv
            )
            scores = uniform_scores(keys_blk, n_keys, draws=problem.n_draws, seed=problem.seed)
            return selection_order(torch.where(padding[:, None, :], -torch.inf, scores))
        return selection_order(torch.where(padding, -torch.inf, scores))[:, :, :, None, :]

    def metrics(self) -> dict[str, Tensor]:
        """Every per-draw metric of the block: [P, J, Qb, D, G] float64."""
        p = self.problem
        n_groups, n_per, n_q, n_draws, n_keys = self.order.shape
        dim = self.v.shape[-1]
        device = self.w.device
        order = self.order.reshape(n_groups, -1, n_keys)  # [P, E, K], E = (j, q, draw)
        n_rows = order.shape[1]
        # per engine row: its weight row's scaled weights and exponents
        w_rows = einops.repeat(self.w, "p j q k -> p (j q r) k", r=n_draws)
        value_exp = einops.repeat(self.value_exp, "p q -> p (j q r)", j=n_per, r=n_draws)
        weight_exp = einops.repeat(self.weight_exp, "p j q -> p (j q r)", r=n_draws)
        ns = einops.repeat(self.ns, "q n -> (j q r) n", j=n_per, r=n_draws)  # [E, G]
        q_rows = einops.repeat(self.q, "q -> (j q r)", j=n_per, r=n_draws)  # [E]
        # centres s(N): running sums of the contributions in selection order, float64, as the per-row
        # engine forms them (y = w * (v 2^-value_exp)); the row's scale is carried by w when exact
        sorted_w = torch.gather(w_rows, -1, order)
        gap = self.block_exp[:, None] - value_exp  # [P, E] >= 0
        gap_max = int(gap.max())
        folded = gap_max <= MAX_FOLDED_GAP  # w 2^gap and v 2^-block_exp are exact
        if folded:  # the same sums, without the [P, E, K, d] tensor
            factor = sorted_w if gap_max == 0 else sorted_w * pow2(gap)[..., None]  # times 1: the same
            centers, z = fused.prefix_sums(self.v_block, order, factor, ns - 1, q_rows)
        else:
            flat = (torch.arange(n_groups, device=device)[:, None, None] * n_keys + order).reshape(-1)
            if folded:
                sorted_y = self.v_block.reshape(-1, dim).index_select(0, flat).view(n_groups, n_rows, n_keys, dim)
                sorted_y.mul_((sorted_w * pow2(gap)[..., None])[..., None])
            else:
                sorted_y = self.v.reshape(-1, dim).index_select(0, flat).view(n_groups, n_rows, n_keys, dim)
                sorted_y = times_pow2(sorted_y, -value_exp[..., None, None]).mul_(sorted_w[..., None])
            sorted_y.cumsum_(dim=-2)
            centers = torch.gather(sorted_y, -2, einops.repeat(ns - 1, "e n -> p e n d", p=n_groups, d=dim))
            z = torch.gather(sorted_y, -2, einops.repeat(q_rows, "e -> p e 1 d", p=n_groups, d=dim))  # s(K)
            del sorted_y
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(n_keys, device=device).expand_as(order))
        screen = _Screen.of(self, w_rows, value_exp, weight_exp, ns, q_rows, rank, centers, order, sorted_w)
        k_out, k_in, r_max, r_min = screen.counts()
        n_float = ns.to(torch.float64)
        out = {"precision": n_float / (n_float + k_out), "recall": k_in / n_float}
        if p.distance == "euclidean":
            scale = pow2(weight_exp + value_exp)[..., None]
            r_max, r_min = r_max * scale, r_min * scale
        out["r_max"], out["r_min"] = r_max, r_min
        mass = torch.gather(torch.cumsum(sorted_w, dim=-1), -1, einops.repeat(ns - 1, "e n -> p e n", p=n_groups))
        mass = mass * pow2(weight_exp)[..., None]
        out["retained_mass"] = mass
        out["local_error_del"], out["local_error_ren"] = local_errors(z, centers, mass)
        return {name: einops.rearrange(x, "p (j q r) n -> p j q r n", j=n_per, q=n_q) for name, x in out.items()}


@dataclass
class _Screen:
    """Counts and radii of one block, screened in ``dtype`` from one value product per group and
    decided in float64 (docs/engine.md, "Every query position at once").

    ``E`` of key ``i``, engine row ``e`` and size ``g`` is ``||y_i||^2 - 2 <y_i, s>`` (Euclidean) or
    the cosine distance minus 1, and the float64 value of its direct distance (``D_i^2 - ||s||^2``,
    or ``D_i - 1``) lies within ``band = coef ||y_i|| (||y_i|| + 2 ||s||) + absolute[p, e, g]`` of
    it: a band per key, so that the many keys of tiny weight get tiny bands. Padding keys
    (``i > q``) are never selected and never counted.
    """

    rows: _BlockRows
    w_rows: Tensor  # [P, E, K] scaled weights
    value_exp: Tensor  # [P, E]
    ns: Tensor  # [E, G]
    q: Tensor  # [E]
    rank: Tensor  # [P, E, K]
    centers: Tensor  # [P, E, G, d] float64, scaled
    eps: Tensor  # [P, E] the cosine constant at the rows' scale
    # the compiled kernel's inputs (fused.screen_counts or fused.gram_screen_counts)
    fused_inputs: dict[str, Any] | None = None

    @classmethod
    def of(
        cls,
        rows: _BlockRows,
        w_rows: Tensor,
        value_exp: Tensor,
        weight_exp: Tensor,
        ns: Tensor,
        q: Tensor,
        rank: Tensor,
        centers: Tensor,
        order: Tensor,
        sorted_w: Tensor,
    ) -> "_Screen":
        p = rows.problem
        n_groups, n_rows, n_sizes, dim = centers.shape
        n_keys = rank.shape[-1]
        gram = (
            p.gram is not None
            and _takes_gram(p.products, n_keys, n_sizes, dim, p.gram.shape[0], p.gram.itemsize)
            and bool((value_exp.abs() <= GRAM_MAX_EXPONENT).all())
        )
        dtype = torch.float64 if gram else p.screen
        # the rows' values are v * 2^-value_exp; the product runs on the block's values
        # v * 2^-block_exp, so each row's centres are taken 2^(block_exp - value_exp) larger
        gap = rows.block_exp[:, None] - value_exp  # [P, E] >= 0
        screened = gap <= MAX_SCALE_GAP
        every = bool(screened.all())  # as usual: no masking below
        aligned = not bool(gap.any())  # every row at the block's scale (usual): nothing to rescale
        if not gram:  # [P, E, G, K]: the keys innermost, along which the compiled kernel runs
            s_scaled = centers if aligned else times_pow2(centers, gap[..., None, None])
            if not every:
                s_scaled = torch.where(screened[..., None, None], s_scaled, 0.0)
            x = torch.bmm(einops.rearrange(s_scaled.to(dtype), "p e n d -> p (e n) d"), rows.v_block.to(dtype).mT)
            x = x.view(n_groups, n_rows, n_sizes, n_keys)  # <v_i, s> in the rows' scale
        # ||v_i|| in each row's scale, from the block's values (no overflow): [P, E, K] float64
        # (0 for the rows not screened: their screening values are 0, every key is decided directly)
        v_norm = torch.linalg.vector_norm(rows.v_block, dim=-1)[:, None, :].expand(n_groups, n_rows, n_keys)
        if not aligned:
            v_norm = times_pow2(v_norm, gap[:, :, None])
        if not every:
            v_norm = torch.where(screened[:, :, None], v_norm, 0.0)
        s_norm = torch.linalg.vector_norm(centers, dim=-1)  # [P, E, G] float64
        coef, absolute = _band(dim, dtype, p.distance, s_norm, gap, screened)
        eps = COSINE_EPS * pow2(-2 * (weight_exp + value_exp))
        screen = cls(rows, w_rows, value_exp, ns, q, rank, centers, eps)
        w_keys, v_keys = w_rows.to(dtype), v_norm.to(dtype)  # [P, E, K]
        # what both compiled routes read, as numpy arrays (fused.py; CPU tensors: taken only for them)
        arrays = {"w": w_keys, "v_norm": v_keys, "rank": rank, "ns": ns, "q": q, "absolute": absolute, "s_norm": s_norm}

        def compiled_inputs() -> dict[str, Any]:
            return {name: t.contiguous().numpy() for name, t in arrays.items()} | {"coef": coef}

        if gram:  # the products formed in the compiled pass (fused.gram_screen_counts)
            screen.fused_inputs = compiled_inputs() | {
                "gram": p.gram,
                "order": order.contiguous().numpy(),
                "factor": sorted_w.contiguous().numpy(),
                "x_scale": pow2(-2 * value_exp).contiguous().numpy(),
                "dim": dim,
            }
            return screen
        if p.distance == "cosine":  # E = 1 - <y, s> / (||y|| ||s|| + eps), formed here for the compiled pass
            w_t, v_t = w_keys[:, :, None], v_keys[:, :, None]  # [P, E, 1, K]
            denominator = (w_t * v_t) * einops.rearrange(s_norm, "p e n -> p e n 1").to(dtype)
            denominator = denominator + einops.rearrange(eps, "p e -> p e 1 1").to(dtype)
            x = 1 - torch.where(denominator > 0, (w_t * x) / denominator, 0.0)
        # one compiled pass over the keys decides from x (fused.py)
        screen.fused_inputs = compiled_inputs() | {"x": x.contiguous().numpy(), "given": p.distance == "cosine"}
        return screen

    def counts(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``K_out``, ``K_in``, ``r_max``, ``r_min`` (scaled): four [P, E, G].

        With ``M = E - band`` and ``P = E + band`` (the direct value lies in ``[M, P]``): the
        farthest selected key has ``P >= max M`` over the selected keys, the nearest unselected one
        ``M <= min P`` over the unselected keys; the direct distances of those candidates give the
        radii. An unselected key with ``P <= max M`` is surely within ``r_max``, one with ``M >
        max P`` surely beyond; the same for the selected keys and ``r_min``; the others are measured.
        """
        assert self.fused_inputs is not None
        inputs = self.fused_inputs
        gram = "gram" in inputs
        counts, listed = fused.gram_screen_counts(**inputs) if gram else fused.screen_counts(**inputs)
        k_out, k_in = torch.from_numpy(counts)
        kinds = torch.from_numpy(listed.kinds)
        group, key, row, where = (torch.from_numpy(x) for x in listed.coordinates)  # where each cell lies
        # every listed cell measured at once (one gather per block; the compiled screen lists the
        # keys of one centre together, so each centre is read once)
        dist = self._distances(group, key, row, where)
        return fused.measured_radii(dist, where, kinds, k_out, k_in)  # r_min +inf where nothing is left out

    def _distances(self, group: Tensor, key: Tensor, row: Tensor, where: Tensor) -> Tensor:
        """Direct float64 distances of key ``key`` of row ``row`` in group ``group`` from its centre
        ``where`` (the flat [P, E, G] index of the row's size)."""
        n_groups, n_keys, dim = self.rows.v.shape
        n_rows = self.centers.shape[1]
        euclidean = self.rows.problem.distance == "euclidean"
        if euclidean and bool((self.value_exp.abs() <= 1000).all()):
            scale = pow2(-self.value_exp)  # exact: the product of times_pow2
            centers = self.centers.reshape(-1, dim)
            return fused.distances(self.rows.v, scale, self.w_rows, centers, (group, key, row, where))
        group_row = group * n_rows + row
        v = self.rows.v.reshape(-1, dim).index_select(0, group * n_keys + key)  # flat gathers: fast
        v = times_pow2(v, -self.value_exp.reshape(-1).index_select(0, group_row)[:, None])
        y = self.w_rows.reshape(-1).index_select(0, group_row * n_keys + key)[:, None] * v
        s = self.centers.reshape(-1, dim).index_select(0, where)
        if euclidean:
            return torch.linalg.vector_norm(y - s, dim=-1)
        dot = einops.einsum(y, s, "c d, c d -> c")
        norm_y, norm_s = torch.linalg.vector_norm(y, dim=-1), torch.linalg.vector_norm(s, dim=-1)
        return cosine_distance(dot, norm_y, norm_s, self.eps.reshape(-1).index_select(0, group_row))


def _band(
    dim: int, dtype: torch.dtype, distance: str, s_norm: Tensor, gap: Tensor, screened: Tensor
) -> tuple[float, Tensor]:
    """The band of the screen (docs/engine.md): its per-key coefficient and its [P, E, G] float64 part
    common to a row and size (``+inf`` for the rows not screened)."""
    unit, unit64 = torch.finfo(dtype).eps / 2, torch.finfo(torch.float64).eps / 2
    # a key's rounding floor when the block's values are finer than the row's (subnormals)
    floor = 4 * dim * dim * torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps * pow2(gap)
    if distance == "euclidean":  # twice the rounding of the screen and of the direct distance
        coef = 2 * ((dim + 16) * unit + (2 * dim + 24) * unit64)
        absolute = 2 * (2 * dim + 24) * unit64 * s_norm * s_norm + floor[..., None]
    else:
        coef = 0.0
        absolute = (2 * (dim + 8) * (2 * unit + 2 * unit64) + floor)[..., None].expand_as(s_norm)
    return coef, torch.where(screened[..., None], absolute, torch.inf)


__all__ = ["DEFAULT_BLOCK_CELLS", "SCREEN_DTYPE", "QueryRows", "separability_queries"]
