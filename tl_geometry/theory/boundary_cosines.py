"""Largest cosine across the top-N boundary, for every ``N`` of a grid at once (definitions §4).

For one row with keys in selection order and the sink at rank ``t_0``::

    rho_out(N) = max_{k in I'_N, j not in I_N} rho_jk,      I'_N = {ranks < N} - {t_0}

(``-inf`` for an empty pair set; :mod:`~tl_geometry.theory.bounds` applies its conventions).
Buckets of ranks between grid points give it as a suffix maximum, ``K^2 d / 2`` multiply-adds per
row and no ``[K, K]`` matrix; float64 cosines are screened in float32 and re-checked exactly
(:func:`rho_out_measured`: the bookkeeping of the screen compiled with numba where it imports, the
same maxima as :func:`rho_out_from_buckets` of :func:`bucket_max_measured`, bit for bit).
The algorithm and the error bound: docs/theory.md §4.
"""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.core.compiled import AVAILABLE

if AVAILABLE:  # whether numba imports is decided once, in core/compiled.py; without it: the torch bookkeeping
    import numba

#: Slack of the float32 screen, in units of float32 epsilon, on top of ``d``.
SCREEN_SLACK = 4

#: Candidate columns of one row from which :func:`distinct_columns` looks for repeated vectors.
DISTINCT_MIN_COLUMNS = 32

#: Largest product of bucket cosines formed at once on the CPU, in elements (1 MiB of float32):
#: it stays in the core's cache while its maximum is taken (``benchmarks/bench_bounds.py``).
PRODUCT_ELEMENTS = 1 << 18


def buckets(ns: Int[Tensor, " g"], n_keys: int) -> tuple[list[int], list[int], Int[Tensor, " k"]]:
    """Bucket bounds ``starts, ends`` (``G + 1`` each) and the bucket of every rank ``[K]``.

    >>> import torch
    >>> starts, ends, of_rank = buckets(torch.tensor([1, 2, 4]), 6)
    >>> starts, ends, of_rank.tolist()
    ([0, 1, 2, 4], [1, 2, 4, 6], [0, 1, 2, 2, 3, 3])
    """
    grid = [int(n) for n in ns]
    starts, ends = [0, *grid], [*grid, n_keys]
    of_rank = torch.searchsorted(ns, torch.arange(n_keys, device=ns.device), right=True)
    return starts, ends, of_rank


def rho_out_from_buckets(bucket_max: Float[Tensor, "r b k"], ns: Int[Tensor, " g"]) -> Float[Tensor, "r g"]:
    """``rho_out(N_g) = max_{k < N_g} max_{b > g} R[b, k]`` from the bucket maxima ``R [r, G+1, K]``."""
    n_sizes = ns.shape[0]
    out = torch.empty(bucket_max.shape[0], n_sizes, dtype=bucket_max.dtype, device=bucket_max.device)
    running = bucket_max[:, n_sizes]  # max over the buckets b > g, updated from the last one down
    for g in range(n_sizes - 1, -1, -1):
        out[:, g] = running[:, : int(ns[g])].amax(dim=-1)
        running = torch.maximum(running, bucket_max[:, g])
    return out


def bucket_max_measured(
    units: Float[Tensor, "r k d"], ns: Int[Tensor, " g"], sink_rank: Int[Tensor, " r"], dtype: torch.dtype
) -> Float[Tensor, "r b k"]:
    """``R [r, G+1, K]`` of measured cosines, ``units`` in selection order (norm 1, or 0 for a zero vector).

    Computed in ``dtype``, or, for float64, screened in float32 and re-checked (module docstring).

    >>> import torch
    >>> u = torch.nn.functional.normalize(torch.randn(2, 7, 3, dtype=torch.float64), dim=-1)
    >>> ns = torch.tensor([1, 3, 7])
    >>> R = bucket_max_measured(u, ns, torch.tensor([0, 2]), torch.float64)  # sinks at ranks 0 and 2
    >>> rho = u @ u.transpose(1, 2)
    >>> bool((R[1, :, 2] == -torch.inf).all()) and torch.allclose(R[0, 2, 1], rho[0, 3:7, 1].max(), atol=1e-15)
    True
    """
    screen = dtype == torch.float64 and units.dtype == torch.float64
    work = units.to(torch.float32) if screen else units.to(dtype)
    bucket_max = _bucket_max(work, ns, sink_rank)
    if not screen:
        return bucket_max
    slack = (units.shape[-1] + SCREEN_SLACK) * torch.finfo(torch.float32).eps
    rho32 = rho_out_from_buckets(bucket_max, ns).to(torch.float64)
    threshold = torch.where(torch.isinf(rho32), torch.inf, rho32 - 2 * slack)  # [r, G]
    starts, ends, of_rank = buckets(ns, units.shape[1])
    need = _range_min(threshold).transpose(1, 2)  # [r, G (hi), G+1 (lo)]: min of the threshold over N_lo..N_hi
    # column k, bucket b (> 0) counts for the sizes g in [bucket(k), b - 1]
    need_kb = need[:, :, of_rank]  # [r, G, K]
    exact = bucket_max.to(torch.float64)
    candidates = (exact[:, 1:, :] >= need_kb).any(dim=1)  # [r, K]: columns to recompute
    for row in torch.nonzero(candidates.any(dim=-1)).flatten().tolist():
        cols = torch.nonzero(candidates[row]).flatten()
        # one product per distinct vector, as rho_out_measured forms them: BLAS may round a column's
        # products differently beside other columns, so both paths take the same columns at once
        kept, position = column_representatives(units[row].detach().cpu().numpy(), cols.cpu().numpy())
        dots = units[row] @ units[row, torch.from_numpy(kept).to(units.device)].T  # [K, c'], float64
        dots = dots[:, torch.from_numpy(position).to(units.device)]  # [K, c]: each column's representative
        per_bucket = torch.full((len(starts), cols.shape[0]), -torch.inf, dtype=torch.float64, device=units.device)
        per_bucket.scatter_reduce_(0, of_rank[:, None].expand_as(dots), dots, "amax")
        later = torch.arange(len(starts), device=units.device)[:, None] > of_rank[cols][None, :]
        exact[row, :, cols] = torch.where(later, per_bucket, -torch.inf)
    return exact


def rho_out_measured(
    units: Float[Tensor, "r k d"], ns: Int[Tensor, " g"], sink_rank: Int[Tensor, " r"], dtype: torch.dtype
) -> Float[Tensor, "r g"]:
    """``rho_out [r, G]`` of measured cosines: ``rho_out_from_buckets(bucket_max_measured(...))``.

    For float64 on the CPU with numba, the screen's bookkeeping (the float32 ``rho_out``, the
    columns to re-check, the float64 maxima over the re-checked columns) is one compiled pass per
    step instead of ``[r, G, K]`` tensors; the float32 products and the float64 products of the
    re-checked columns are the same torch products, so the result is the same, bit for bit. Only
    the re-checked columns count: a column that is not re-checked is below the maximum for every
    size it counts for (docs/theory.md §4).

    >>> import torch
    >>> u = torch.nn.functional.normalize(torch.randn(3, 40, 4, dtype=torch.float64), dim=-1)
    >>> ns, sinks = torch.tensor([1, 2, 5, 17, 39, 40]), torch.tensor([0, 3, 39])
    >>> reference = rho_out_from_buckets(bucket_max_measured(u, ns, sinks, torch.float64), ns)
    >>> torch.equal(rho_out_measured(u, ns, sinks, torch.float64), reference)
    True
    """
    compiled = AVAILABLE and dtype == torch.float64 and units.dtype == torch.float64
    if not (compiled and units.device.type == "cpu"):
        return rho_out_from_buckets(bucket_max_measured(units, ns, sink_rank, dtype), ns)
    bucket_max = _bucket_max(units.to(torch.float32), ns, sink_rank)
    slack = (units.shape[-1] + SCREEN_SLACK) * torch.finfo(torch.float32).eps
    grid = np.ascontiguousarray(ns.numpy(), dtype=np.int64)
    candidates = np.zeros((units.shape[0], units.shape[1]), dtype=np.bool_)
    _compiled_candidates(bucket_max.detach().numpy(), grid, 2 * slack, candidates)
    out = torch.full((units.shape[0], grid.shape[0]), -torch.inf, dtype=torch.float64)
    out_np = out.numpy()
    for row in np.flatnonzero(candidates.any(axis=-1)).tolist():
        cols = torch.from_numpy(distinct_columns(units[row].detach().numpy(), np.flatnonzero(candidates[row])))
        dots = units[row] @ units[row, cols].T  # [K, c], float64: the products of the torch path
        _compiled_rho_out_of_columns(dots.detach().numpy(), cols.numpy(), grid, out_np[row])
    return out


def distinct_columns(units: np.ndarray, cols: np.ndarray, min_columns: int | None = None) -> np.ndarray:
    """The columns ``cols`` (increasing ranks) less those whose unit vector equals, bit for bit, one
    of a lower rank among them (repeated tokens give equal values, in a model's first layer).

    Such a column has the same cosines as the lower one and counts for fewer sizes, so it never
    sets a maximum of :func:`rho_out_measured`. Fewer than ``min_columns`` columns (None:
    :data:`DISTINCT_MIN_COLUMNS`) are returned as they are. :func:`column_representatives` also
    gives each column's representative among them.

    >>> import numpy as np
    >>> u = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.6, 0.8]])
    >>> distinct_columns(u, np.arange(4), min_columns=2).tolist()
    [0, 1, 3]
    >>> distinct_columns(u, np.array([1, 2, 3]), min_columns=2).tolist(), distinct_columns(u, np.arange(4)).tolist()
    ([1, 2, 3], [0, 1, 2, 3])
    """
    return column_representatives(units, cols, min_columns)[0]


def column_representatives(
    units: np.ndarray, cols: np.ndarray, min_columns: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`distinct_columns` ``kept``, and for each of ``cols`` the position in ``kept`` of the
    lowest-ranked column with the same unit vector (itself where it is kept).

    >>> import numpy as np
    >>> u = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.6, 0.8]])
    >>> kept, position = column_representatives(u, np.arange(4), min_columns=2)
    >>> kept.tolist(), position.tolist()
    ([0, 1, 3], [0, 1, 0, 2])
    """
    if cols.shape[0] < (DISTINCT_MIN_COLUMNS if min_columns is None else min_columns):
        return cols, np.arange(cols.shape[0])
    rows = np.ascontiguousarray(units[cols])
    _, first, vector_of = np.unique(
        rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))), return_index=True, return_inverse=True
    )
    by_rank = np.argsort(first)  # the distinct vectors in the order of their first column
    position = np.empty_like(by_rank)
    position[by_rank] = np.arange(by_rank.shape[0])
    return cols[first[by_rank]], position[vector_of.reshape(-1)]


def bucket_max_matrix(rho: Float[Tensor, "r k k"], ns: Int[Tensor, " g"], sink_rank: Int[Tensor, " r"]) -> Tensor:
    """``R [r, G+1, K]`` from a given cosine matrix in selection order (the similarity model)."""
    starts, ends, _ = buckets(ns, rho.shape[-1])
    out = torch.full((rho.shape[0], len(starts), rho.shape[-1]), -torch.inf, dtype=rho.dtype, device=rho.device)
    for b in range(1, len(starts)):
        s, e = starts[b], ends[b]
        if e > s:
            out[:, b, :s] = rho[:, s:e, :s].amax(dim=1)
    return _drop_sink(out, sink_rank)


def _bucket_max(units: Tensor, ns: Tensor, sink_rank: Tensor) -> Tensor:
    """``R [r, G+1, K]``: per bucket, the products of a few rows at a time (:data:`PRODUCT_ELEMENTS`)."""
    starts, ends, _ = buckets(ns, units.shape[1])
    n_rows = units.shape[0]
    out = torch.full((n_rows, len(starts), units.shape[1]), -torch.inf, dtype=units.dtype, device=units.device)
    for b in range(1, len(starts)):
        s, e = starts[b], ends[b]
        if e > s:
            step = n_rows if units.device.type != "cpu" else max(1, PRODUCT_ELEMENTS // ((e - s) * s))
            for r0 in range(0, n_rows, step):
                rows = slice(r0, r0 + step)
                products = torch.matmul(units[rows, s:e], units[rows, :s].transpose(1, 2))
                torch.amax(products, dim=1, out=out[rows, b, :s])
    return _drop_sink(out, sink_rank)


def _drop_sink(bucket_max: Tensor, sink_rank: Tensor) -> Tensor:
    """The sink is never the lower-ranked key of a pair (it is not in ``I'``)."""
    index = sink_rank[:, None, None].expand(-1, bucket_max.shape[1], 1)
    return bucket_max.scatter_(2, index, -torch.inf)


def _candidates(bucket_max, ns, two_slack, out):  # pragma: no cover - compiled
    """The columns the float32 screen cannot rule out, into ``out [r, K]`` (``bucket_max_measured``'s test).

    Per row: ``rho32(N_g)`` as :func:`rho_out_from_buckets` forms it, the threshold
    ``rho32 - 2 slack`` (+inf where ``rho32`` is infinite), and column ``k`` (bucket ``a``) is kept
    when some bucket ``b > a`` has ``R[b, k] >= min_{a <= g < b} threshold[g]``."""
    n_rows, n_buckets, n_keys = bucket_max.shape
    n_sizes = ns.shape[0]
    threshold = np.empty(n_sizes, dtype=np.float64)
    running = np.empty(n_keys, dtype=bucket_max.dtype)
    for r in range(n_rows):
        for k in range(n_keys):
            running[k] = bucket_max[r, n_sizes, k]
        for g in range(n_sizes - 1, -1, -1):
            best = -np.inf
            for k in range(ns[g]):
                if running[k] > best:
                    best = running[k]
            threshold[g] = np.inf if np.isinf(best) else np.float64(best) - two_slack
            for k in range(n_keys):
                if bucket_max[r, g, k] > running[k]:
                    running[k] = bucket_max[r, g, k]
        bucket = 0
        for k in range(n_keys):
            while bucket < n_sizes and ns[bucket] <= k:
                bucket += 1
            need = np.inf
            for b in range(bucket + 1, n_sizes + 1):
                need = min(need, threshold[b - 1])
                if np.float64(bucket_max[r, b, k]) >= need:
                    out[r, k] = True
                    break


def _rho_out_of_columns(dots, cols, ns, out):  # pragma: no cover - compiled
    """``out[g] = max(out[g], max_{p: cols[p] < N_g, j >= N_g} dots[j, p])`` for one row."""
    n_keys, n_cols = dots.shape
    n_sizes = ns.shape[0]
    for p in range(n_cols):
        bucket = 0
        while bucket < n_sizes and ns[bucket] <= cols[p]:
            bucket += 1
        best = -np.inf
        for g in range(n_sizes - 1, bucket - 1, -1):
            end = n_keys if g == n_sizes - 1 else ns[g + 1]
            for j in range(ns[g], end):
                if dots[j, p] > best:
                    best = dots[j, p]
            if best > out[g]:
                out[g] = best


if AVAILABLE:
    _compiled_candidates = numba.njit(cache=True, nogil=True)(_candidates)
    _compiled_rho_out_of_columns = numba.njit(cache=True, nogil=True)(_rho_out_of_columns)


def _range_min(threshold: Tensor) -> Tensor:
    """``out[r, lo, hi] = min_{lo <= g <= hi} threshold[r, g]`` (+inf for ``lo > hi`` and ``lo = G``)."""
    n_rows, n_sizes = threshold.shape
    g = torch.arange(n_sizes, device=threshold.device)
    table = threshold[:, None, :].expand(n_rows, n_sizes, n_sizes)
    table = torch.where(g[None, :, None] <= g[None, None, :], table, torch.inf)  # [r, lo, hi]
    table = torch.cummin(table, dim=-1).values
    return torch.cat([table, torch.full_like(table[:, :1], torch.inf)], dim=1)
