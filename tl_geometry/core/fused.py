"""The query engine's screen and decisions in one pass over the keys: a compiled (numba) kernel.

For every engine row ``e`` and size ``g`` of a block, the screening value of key ``i`` is
``E_i = ||y_i||^2 - 2 <y_i, s>`` (Euclidean) or ``1 - <y_i, s> / (||y_i|| ||s|| + eps)`` (cosine),
from the block's one product ``x = <v_i, s>`` (definitions §2; docs/engine.md). The kernel reads
``x`` twice per row (the extremes, then the counts) instead of the ~20 tensor passes of the
pure-torch screen, and returns the same counts and the same keys to re-check in float64, in the
order ``Tensor.nonzero`` gives them (row-major), so the torch code that measures those keys gives bit-identical
radii. The arithmetic is that of the torch screen, operation by operation, in the screen's dtype.

Example: ``screen_counts(x, w, v_norm, rank, ns, q, band, s_norm, eps, cosine=False)`` for the
``[P, K, E, G]`` products ``x`` of a block.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

try:  # numba is a dependency; a broken install falls back to the torch screen
    import numba
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None  # type: ignore[assignment]

#: Whether the compiled kernel can run here (numba importable).
AVAILABLE = numba is not None

#: The kernels :func:`tl_geometry.core.query_engine.separability_queries` accepts.
KERNELS = ("numba", "torch")


def _value(x, wk, y_len, s_norm, eps, padding, one, inf, cosine):  # pragma: no cover - compiled
    """``E`` of one key and size, as the torch screen forms it (same operations, same dtype)."""
    if cosine:
        if padding:
            return inf
        denominator = y_len * s_norm + eps
        return one - (wk * x) / denominator if denominator > 0 else one
    sq = inf if padding else y_len * y_len
    return sq - (wk + wk) * x  # torch.addcmul(sq, w, x, value=-2)


def _keep(cells, n_cells, flat, near_max, near_min, band_out, band_in):  # pragma: no cover - compiled
    """Append ``flat`` to the lists of cells it belongs to (counted beyond the capacity too)."""
    for c, hit in enumerate((near_max, near_min, band_out, band_in)):
        if hit:
            if n_cells[c] < cells.shape[1]:
                cells[c, n_cells[c]] = flat
            n_cells[c] += 1


def _screen_counts(x, w, v_norm, rank, ns, q, band, s_norm, eps, consts, cosine, counts, cells):  # pragma: no cover
    # counts [4, P, E, G]: out_lo, out_hi, in_lo, in_hi; cells [4, capacity]: flat [P, K, E, G] indices
    # of the keys near r_max, near r_min, in K_out's band, in K_in's band, in order (as many as fit)
    n_groups, n_keys, n_rows, n_sizes = x.shape
    dtype = band.dtype
    one, inf = consts[0], consts[1]  # in the screen's dtype: float32 arithmetic stays float32
    n_cells = np.zeros(4, dtype=np.int64)
    e_max, e_min = np.empty((n_rows, n_sizes), dtype=dtype), np.empty((n_rows, n_sizes), dtype=dtype)
    lo_max, hi_max = np.empty((n_rows, n_sizes), dtype=dtype), np.empty((n_rows, n_sizes), dtype=dtype)
    lo_min, hi_min = np.empty((n_rows, n_sizes), dtype=dtype), np.empty((n_rows, n_sizes), dtype=dtype)
    for p in range(n_groups):
        e_max[:], e_min[:] = -inf, inf
        for k in range(n_keys):  # the extremes: amax of e_in, amin of e_out (NaN wins)
            for r in range(n_rows):
                wk, rk, padding = w[p, k, r], rank[p, k, r], k > q[r]
                y_len = wk * v_norm[p, k, r]
                for g in range(n_sizes):
                    e = _value(x[p, k, r, g], wk, y_len, s_norm[p, r, g], eps[p, r], padding, one, inf, cosine)
                    if rk < ns[r, g]:
                        if e > e_max[r, g] or e != e:
                            e_max[r, g] = e
                    elif e < e_min[r, g] or e != e:
                        e_min[r, g] = e
        for r in range(n_rows):  # the thresholds of query_engine._Screen.counts
            for g in range(n_sizes):
                b = band[p, r, g]
                lo_max[r, g], hi_max[r, g] = e_max[r, g] - b, e_max[r, g] + b
                if q[r] + 1 > ns[r, g]:
                    lo_min[r, g], hi_min[r, g] = e_min[r, g] - b, e_min[r, g] + b
                else:
                    lo_min[r, g], hi_min[r, g] = inf, -inf
        for k in range(n_keys):  # the counts, and the keys to measure
            for r in range(n_rows):
                wk, rk, padding = w[p, k, r], rank[p, k, r], k > q[r]
                y_len = wk * v_norm[p, k, r]
                for g in range(n_sizes):
                    e = _value(x[p, k, r, g], wk, y_len, s_norm[p, r, g], eps[p, r], padding, one, inf, cosine)
                    if rk < ns[r, g]:
                        e_in, e_out = e, inf
                    else:
                        e_in, e_out = -inf, e
                    counts[0, p, r, g] += e_out < lo_max[r, g]
                    counts[1, p, r, g] += e_out <= hi_max[r, g]
                    counts[2, p, r, g] += e_in < lo_min[r, g]
                    counts[3, p, r, g] += e_in <= hi_min[r, g]
                    near_max = e_in >= lo_max[r, g]
                    near_min = e_out <= hi_min[r, g]
                    band_out = e_out >= lo_max[r, g] and e_out <= hi_max[r, g]
                    band_in = e_in >= lo_min[r, g] and e_in <= hi_min[r, g]
                    if near_max or near_min or band_out or band_in:  # rare: a few keys per row
                        _keep(
                            cells,
                            n_cells,
                            ((p * n_keys + k) * n_rows + r) * n_sizes + g,
                            near_max,
                            near_min,
                            band_out,
                            band_in,
                        )
    return n_cells


def _prefix_sums(v, order, factor, at, by_size, last, centers, z):  # pragma: no cover - compiled
    """Running sums of ``v[order[k]] * factor[k]`` over ``k``, kept at the keys ``at`` (visited in the
    order ``by_size``) and at ``last``: what ``cumsum`` then ``gather`` give, summed in the same order."""
    n_groups, n_rows, n_keys = order.shape
    n_sizes, dim = at.shape[1], v.shape[2]
    acc = np.empty(dim, dtype=v.dtype)
    for p in range(n_groups):
        for r in range(n_rows):
            acc[:] = 0.0
            g = 0
            for k in range(n_keys):
                key, f = order[p, r, k], factor[p, r, k]
                for j in range(dim):
                    acc[j] += v[p, key, j] * f
                while g < n_sizes and at[r, by_size[r, g]] == k:
                    centers[p, r, by_size[r, g]] = acc
                    g += 1
                if k == last[r]:
                    z[p, r, 0] = acc


_compiled: Any = None
_compiled_sums: Any = None
if AVAILABLE:
    _value = numba.njit(cache=True, inline="always")(_value)
    _keep = numba.njit(cache=True, inline="never")(_keep)
    _compiled = numba.njit(cache=True, nogil=True)(_screen_counts)
    _compiled_sums = numba.njit(cache=True, nogil=True)(_prefix_sums)


def screen_counts(
    x: np.ndarray,
    w: np.ndarray,
    v_norm: np.ndarray,
    rank: np.ndarray,
    ns: np.ndarray,
    q: np.ndarray,
    band: np.ndarray,
    s_norm: np.ndarray,
    eps: np.ndarray,
    *,
    cosine: bool,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The counts and re-check cells of one block's screen, in one pass over its keys (twice).

    Parameters
    ----------
    x : [P, K, E, G] screen dtype
        ``<v_i, s(N)>`` of every group, key, engine row and size, in the rows' scale.
    w : [P, K, E] screen dtype
        The rows' scaled weights (0 at padding keys).
    v_norm : [P, K, E] screen dtype
        ``||v_i||`` in each row's scale.
    rank : [P, K, E] int64
        Each key's place in its row's selection order.
    ns : [E, G] int64
        The sizes of each row.
    q : [E] int64
        Each row's last key (keys after it are padding).
    band : [P, E, G] screen dtype
        The half-width of the uncertain band (errors of the screen below ``band / 2``).
    s_norm : [P, E, G] screen dtype
        ``||s||`` (cosine only; any array of the shape otherwise).
    eps : [P, E] screen dtype
        The cosine constant at the rows' scale (cosine only).
    cosine : bool
        The cosine distance (else the Euclidean one).

    Returns
    -------
    counts : [4, P, E, G] int64
        ``#(e_out < r_max - band)``, ``#(e_out <= r_max + band)``, ``#(e_in < r_min - band)`` and
        ``#(e_in <= r_min + band)`` over every key (unselected keys are ``-inf`` in ``e_in``, selected
        ones ``+inf`` in ``e_out``), as the torch screen counts them.
    cells : four int64 arrays of flat ``[P, K, E, G]`` indices, sorted
        The keys near the largest selected value (``r_max``'s candidates), near the smallest
        unselected one (``r_min``'s), and the cells inside the bands of ``K_out`` and ``K_in``.
    """
    if _compiled is None:  # pragma: no cover
        raise RuntimeError("the fused kernel needs numba: pip install numba, or use kernel='torch'")
    consts = np.array([1.0, np.inf], dtype=band.dtype)
    counts = np.zeros((4, *band.shape), dtype=np.int64)
    capacity = 2 * band.size + 256  # usually enough: about one key near each extreme
    while True:
        cells = np.empty((4, capacity), dtype=np.int64)
        n_cells = _compiled(x, w, v_norm, rank, ns, q, band, s_norm, eps, consts, cosine, counts, cells)
        if n_cells.max() <= capacity:
            break
        counts[:] = 0
        capacity = int(n_cells.max())
    return counts, [cells[c, : n_cells[c]] for c in range(4)]


def prefix_sums(v: Tensor, order: Tensor, factor: Tensor, at: Tensor, last: Tensor) -> tuple[Tensor, Tensor]:
    """The centres ``s(N)`` and outputs of one block's rows without their ``[P, E, K, d]`` running sums.

    Parameters
    ----------
    v : [P, K, d] float64
        The block's values.
    order : [P, E, K] int64
        Each row's selection order.
    factor : [P, E, K] float64
        Each row's weight of its ``k``-th selected key (the contribution is ``v[order[k]] * factor[k]``).
    at : [E, G] int64
        ``N - 1`` of each row's sizes.
    last : [E] int64
        Each row's last real key (``K - 1``).

    Returns
    -------
    centers : [P, E, G, d] float64
        ``sum_{k <= at} v[order[k]] * factor[k]``, summed in ``k`` order as ``torch.cumsum``.
    z : [P, E, 1, d] float64
        The same at ``last``.
    """
    n_groups, n_rows, _ = order.shape
    centers = torch.empty((n_groups, n_rows, at.shape[1], v.shape[2]), dtype=v.dtype)
    z = torch.empty((n_groups, n_rows, 1, v.shape[2]), dtype=v.dtype)
    at = at.contiguous()
    by_size = torch.argsort(at, dim=1, stable=True)
    _compiled_sums(
        v.contiguous().numpy(),
        order.contiguous().numpy(),
        factor.contiguous().numpy(),
        at.numpy(),
        by_size.numpy(),
        last.contiguous().numpy(),
        centers.numpy(),
        z.numpy(),
    )
    return centers, z


__all__ = ["AVAILABLE", "KERNELS", "prefix_sums", "screen_counts"]
