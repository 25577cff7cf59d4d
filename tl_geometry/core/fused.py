"""The query engine's screen and decisions in one pass over the keys: a compiled (numba) kernel.

For every engine row ``e`` and size ``g`` of a block, the screening value of key ``i`` is
``E_i = ||y_i||^2 - 2 <y_i, s>`` (Euclidean) or ``1 - <y_i, s> / (||y_i|| ||s|| + eps)`` (cosine),
from the block's one product ``x = <v_i, s>`` (definitions §2), with a band of its own,
``coef ||y_i|| (||y_i|| + 2 ||s||) + absolute`` (docs/engine.md derives it). The kernel reads ``x``
twice per row (the extremes of ``E -+ band``, then the counts) and returns the keys surely within each
radius and the keys to measure in float64, in the order ``Tensor.nonzero`` gives them (row-major).
The arithmetic of ``E`` is that of the torch screen, operation by operation, in the screen's dtype.

Example: ``screen_counts(x, w, v_norm, rank, ns, q, coef, absolute, s_norm, given=False)`` for the
``[P, K, E, G]`` products ``x`` of a block.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from tl_geometry.errors import InputError

try:  # numba is a dependency; a broken install falls back to the torch screen
    import numba
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None  # type: ignore[assignment]

#: Whether the compiled kernel can run here (numba importable).
AVAILABLE = numba is not None

#: The kernels both engines accept (:func:`tl_geometry.core.query_engine.separability_queries`,
#: :func:`tl_geometry.separability`).
KERNELS = ("numba", "torch")

#: The kernel when none is given: the compiled passes where numba imports, else torch.
DEFAULT_KERNEL = "numba" if AVAILABLE else "torch"


def check_kernel(kernel: str | None) -> str:
    """``kernel``, or :data:`DEFAULT_KERNEL` for None; one of :data:`KERNELS` that can run here.

    >>> check_kernel("torch")
    'torch'
    """
    kernel = DEFAULT_KERNEL if kernel is None else kernel
    if kernel not in KERNELS:
        raise InputError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "numba" and not AVAILABLE:
        raise InputError("kernel='numba' needs numba (pip install numba); use kernel='torch'")
    return kernel


def _bounds(x, w, v_norm, rank, ns, coef, absolute, s_norm, one, given, p, k, r, e, band):  # pragma: no cover
    """``E`` (in the screen's dtype, as the torch screen forms it) and the band of key ``k`` of row
    ``r`` at every size, into ``e`` and ``band``; returns the first size that selects the key."""
    wk = w[p, k, r]
    y_len = wk * v_norm[p, k, r]
    xs = x[p, k, r]
    if given:  # x holds E itself (the cosine's): E = 0 - (-1) x, exactly
        sq, w2 = one - one, -one
    else:
        sq, w2 = y_len * y_len, wk + wk
    for g in range(xs.shape[0]):
        e[g] = sq - w2 * xs[g]  # torch.addcmul(sq, w, x, value=-2)
    y = np.float64(wk) * np.float64(v_norm[p, k, r])
    cy2, cy = coef * (y * y), 2 * coef * y
    s_row, absolute_row = s_norm[p, r], absolute[p, r]
    for g in range(xs.shape[0]):
        band[g] = cy2 + cy * s_row[g] + absolute_row[g]
    return np.searchsorted(ns[r], rank[p, k, r], side="right")  # the sizes are non-decreasing


def _grow(cells):  # pragma: no cover - compiled
    """``cells`` in an array twice as wide."""
    larger = np.empty((cells.shape[0], 2 * cells.shape[1]), dtype=cells.dtype)
    larger[:, : cells.shape[1]] = cells
    return larger


def _screen_counts(x, w, v_norm, rank, ns, q, coef, absolute, s_norm, one, given, counts, cells):  # pragma: no cover
    # counts [2, P, E, G]: the unselected keys surely within r_max, the selected surely within r_min;
    # cells [4, capacity]: flat [P, K, E, G] indices of r_max's candidates, r_min's candidates, the
    # unselected keys undecided against r_max and the selected undecided against r_min, in order.
    # Key k of row r is selected at the sizes g >= first (ns[r] is non-decreasing): two plain loops
    # over the sizes instead of a branch per cell.
    n_groups, n_keys, n_rows, n_sizes = x.shape
    n_cells = np.zeros(4, dtype=np.int64)
    m_max, p_max = np.empty((n_rows, n_sizes)), np.empty((n_rows, n_sizes))
    m_min, p_min = np.empty((n_rows, n_sizes)), np.empty((n_rows, n_sizes))
    e, band = np.empty(n_sizes), np.empty(n_sizes)
    for p in range(n_groups):
        m_max[:], p_max[:], m_min[:], p_min[:] = -np.inf, -np.inf, np.inf, np.inf
        for k in range(n_keys):  # the extremes of the bounds M = E - band, P = E + band
            for r in range(n_rows):
                if k > q[r]:  # padding
                    continue
                first = _bounds(x, w, v_norm, rank, ns, coef, absolute, s_norm, one, given, p, k, r, e, band)
                lo_min, hi_min, lo_max, hi_max = m_min[r], p_min[r], m_max[r], p_max[r]
                for g in range(first):
                    lo, hi = e[g] - band[g], e[g] + band[g]
                    lo_min[g] = lo if lo < lo_min[g] else lo_min[g]
                    hi_min[g] = hi if hi < hi_min[g] else hi_min[g]
                for g in range(first, n_sizes):
                    lo, hi = e[g] - band[g], e[g] + band[g]
                    lo_max[g] = lo if lo > lo_max[g] else lo_max[g]
                    hi_max[g] = hi if hi > hi_max[g] else hi_max[g]
        for k in range(n_keys):  # the counts, and the keys to measure
            for r in range(n_rows):
                if k > q[r]:
                    continue
                first = _bounds(x, w, v_norm, rank, ns, coef, absolute, s_norm, one, given, p, k, r, e, band)
                lo_min, hi_min, lo_max, hi_max = m_min[r], p_min[r], m_max[r], p_max[r]
                within_max, within_min = counts[0, p, r], counts[1, p, r]
                flagged = False
                for g in range(first):  # unselected
                    lo, hi = e[g] - band[g], e[g] + band[g]
                    sure = hi <= lo_max[g]
                    within_max[g] += sure
                    flagged |= (lo <= hi_min[g]) | ((not sure) & (lo <= hi_max[g]))
                for g in range(first, n_sizes):  # selected
                    lo, hi = e[g] - band[g], e[g] + band[g]
                    sure = hi <= lo_min[g]
                    within_min[g] += sure
                    flagged |= (hi >= lo_max[g]) | ((not sure) & (lo <= hi_min[g]))
                if not flagged:  # most keys: nothing to measure
                    continue
                if n_cells.max() + n_sizes > cells.shape[1]:  # room for this key's cells
                    cells = _grow(cells)
                base = ((p * n_keys + k) * n_rows + r) * n_sizes
                c0, c1, c2, c3 = n_cells[0], n_cells[1], n_cells[2], n_cells[3]
                for g in range(n_sizes):  # in flat order
                    lo, hi = e[g] - band[g], e[g] + band[g]
                    if g >= first:
                        if hi >= lo_max[g]:  # may be the farthest selected key
                            cells[0, c0] = base + g
                            c0 += 1
                        if hi > lo_min[g] and lo <= hi_min[g]:
                            cells[3, c3] = base + g
                            c3 += 1
                    else:
                        if lo <= hi_min[g]:  # may be the nearest unselected key
                            cells[1, c1] = base + g
                            c1 += 1
                        if hi > lo_max[g] and lo <= hi_max[g]:
                            cells[2, c2] = base + g
                            c2 += 1
                n_cells[0], n_cells[1], n_cells[2], n_cells[3] = c0, c1, c2, c3
    return n_cells, cells


def _prefix_sums(v, order, factor, at, last, centers, z):  # pragma: no cover - compiled
    """Running sums of ``v[order[k]] * factor[k]`` over ``k``, kept at the keys ``at`` (non-decreasing)
    and at ``last``: what ``cumsum`` then ``gather`` give, summed in the same order."""
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
                while g < n_sizes and at[r, g] == k:
                    centers[p, r, g] = acc
                    g += 1
                if k == last[r]:  # every size is at or before it (N <= K)
                    z[p, r, 0] = acc
                    break


def _differences(v, scale, w, centers, group, key, row, where, out):  # pragma: no cover - compiled
    """``w * (v * scale) - s`` of each listed cell, elementwise as the tensor code forms it."""
    for c in range(group.shape[0]):
        p, k, r = group[c], key[c], row[c]
        weight, factor = w[p, r, k], scale[p, r]
        for j in range(v.shape[2]):
            out[c, j] = weight * (v[p, k, j] * factor) - centers[where[c], j]


_compiled: Any = None
_compiled_sums: Any = None
_compiled_differences: Any = None
if AVAILABLE:
    _bounds = numba.njit(cache=True, inline="always")(_bounds)
    _grow = numba.njit(cache=True, inline="never")(_grow)
    _compiled = numba.njit(cache=True, nogil=True)(_screen_counts)
    _compiled_sums = numba.njit(cache=True, nogil=True)(_prefix_sums)
    _compiled_differences = numba.njit(cache=True, nogil=True)(_differences)


def screen_counts(
    x: np.ndarray,
    w: np.ndarray,
    v_norm: np.ndarray,
    rank: np.ndarray,
    ns: np.ndarray,
    q: np.ndarray,
    coef: float,
    absolute: np.ndarray,
    s_norm: np.ndarray,
    *,
    given: bool,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The counts and re-check cells of one block's screen, in one pass over its keys (twice).

    Key ``i`` of row ``e`` and size ``g`` has the screening value ``E`` and the band
    ``coef ||y_i|| (||y_i|| + 2 ||s||) + absolute`` (``||y_i|| = w v_norm``): the float64 value
    ``D_i^2 - ||s||^2`` of its direct distance (Euclidean; ``D_i - 1`` for the cosine) lies in
    ``[M, P] = [E - band, E + band]`` (docs/engine.md).

    Parameters
    ----------
    x : [P, K, E, G] screen dtype
        ``<v_i, s(N)>`` of every group, key, engine row and size, in the rows' scale (or ``E``: ``given``).
    w : [P, K, E] screen dtype
        The rows' scaled weights.
    v_norm : [P, K, E] screen dtype
        ``||v_i||`` in each row's scale.
    rank : [P, K, E] int64
        Each key's place in its row's selection order.
    ns : [E, G] int64
        The sizes of each row, non-decreasing along each row.
    q : [E] int64
        Each row's last key (keys after it are padding, never read).
    coef : float
        The band's coefficient of ``||y_i|| (||y_i|| + 2 ||s||)`` (0 for the cosine).
    absolute : [P, E, G] float64
        The band's part common to every key of a row and size (``+inf``: decide every key directly).
    s_norm : [P, E, G] float64
        ``||s||`` (the band).
    given : bool
        ``x`` holds the screening values ``E`` themselves (the cosine's, formed by the caller) instead
        of the products.

    Returns
    -------
    counts : [2, P, E, G] int64
        The unselected keys surely within ``r_max`` (``P <= max M`` over the selected keys) and the
        selected keys surely within ``r_min`` (``P <= min M`` over the unselected ones).
    cells : four int64 arrays of flat ``[P, K, E, G]`` indices, sorted
        The candidates for ``r_max`` (selected, ``P >= max M``) and for ``r_min`` (unselected,
        ``M <= min P``), and the keys neither surely within nor surely beyond ``r_max``
        (unselected) and ``r_min`` (selected).
    """
    if _compiled is None:  # pragma: no cover
        raise RuntimeError("the fused kernel needs numba: pip install numba, or use kernel='torch'")
    if ns.shape[1] > 1 and bool((ns[:, 1:] < ns[:, :-1]).any()):
        raise ValueError("screen_counts needs each row's sizes ns in non-decreasing order")
    one = np.ones((), dtype=x.dtype)[()]  # in the screen's dtype: float32 arithmetic stays float32
    counts = np.zeros((2, *absolute.shape), dtype=np.int64)
    cells = np.empty((4, 2 * absolute.size + 256), dtype=np.int64)  # usually enough; grown if not
    n_cells, cells = _compiled(x, w, v_norm, rank, ns, q, float(coef), absolute, s_norm, one, given, counts, cells)
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
        ``N - 1`` of each row's sizes, non-decreasing along each row, at most ``last``.
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
    if at.shape[1] > 1 and bool((at[:, 1:] < at[:, :-1]).any()):
        raise ValueError("prefix_sums needs each row's sizes in non-decreasing order")
    _compiled_sums(
        v.contiguous().numpy(),
        order.contiguous().numpy(),
        factor.contiguous().numpy(),
        at.numpy(),
        last.contiguous().numpy(),
        centers.numpy(),
        z.numpy(),
    )
    return centers, z


def differences(v: Tensor, scale: Tensor, w: Tensor, centers: Tensor, cells: tuple[Tensor, ...]) -> Tensor:
    """The vectors ``y_i - s`` of some cells, in one pass (no gathered ``[c, d]`` intermediates).

    Parameters
    ----------
    v : [P, K, d] float64
        The block's values.
    scale : [P, E] float64
        Each row's power of two for its values (``2^-value_exp``).
    w : [P, E, K] float64
        Each row's scaled weights.
    centers : [P * E * G, d] float64
        The centres ``s(N)``, flat over (group, row, size).
    cells : four [c] int64
        The group, key, row and flat centre index of each cell.

    Returns
    -------
    [c, d] float64
        ``w[p, r, k] * (v[p, k] * scale[p, r]) - centers[where]``: the operations of the tensor code,
        so the same numbers bit for bit.
    """
    group, key, row, where = (t.contiguous().numpy() for t in cells)
    out = torch.empty((group.shape[0], v.shape[2]), dtype=torch.float64)
    _compiled_differences(
        v.contiguous().numpy(),
        scale.contiguous().numpy(),
        w.contiguous().numpy(),
        centers.contiguous().numpy(),
        group,
        key,
        row,
        where,
        out.numpy(),
    )
    return out


__all__ = ["AVAILABLE", "DEFAULT_KERNEL", "KERNELS", "check_kernel", "differences", "prefix_sums", "screen_counts"]
