"""The query engine's screen and decisions in one pass over the keys: a compiled (numba) kernel.

For every engine row ``e`` and size ``g`` of a block, the screening value of key ``i`` is
``E_i = ||y_i||^2 - 2 <y_i, s>`` (Euclidean) or ``1 - <y_i, s> / (||y_i|| ||s|| + eps)`` (cosine),
from the block's one product ``x = <v_i, s>`` (definitions §2), with a band of its own,
``coef ||y_i|| (||y_i|| + 2 ||s||) + absolute`` (docs/engine.md derives it). The kernel makes three
vectorised passes along each row's keys per size (the bounds ``E -+ band``, their extremes as
integer maxima of their bits, then the counts; contiguous, up to the row's last key; selection as
selects: no branch), and returns the keys surely within each radius and the keys to measure in
float64 (:class:`ListedCells`: each once, with what it is measured for, the keys of one centre
together; :func:`measured_radii` takes the radii and counts from their distances, extremes and sums
that no order changes). The arithmetic of ``E`` is that of the torch screen, operation by
operation, in the screen's dtype (no fast-math: nothing reassociated or contracted).

:func:`gram_screen_counts` makes the same passes with the products formed in them: running sums of
the rows of the Gram matrix ``G = V V^T`` (float64 or float32) along each row's selection order,
``x = sum_{t<N} w_t G[i, o_t]``, in float64 (each term a fused multiply-add where the CPU has one:
:func:`gram_sums_fused`), the band widened by their rounding.

Example: ``screen_counts(x, w, v_norm, rank, ns, q, coef, absolute, s_norm, given=False)`` for the
``[P, E, G, K]`` products ``x`` of a block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

# whether numba imports and the compiled-or-torch choice: one copy, in dispatch.py
from tl_geometry.core.compiled import AVAILABLE, use_compiled

if AVAILABLE:
    import numba


def _row_terms(w, v_norm, coef, one, given, sq, w2, cy2, cy):  # pragma: no cover - compiled
    """The terms of ``E`` (screen dtype) and of the band (float64) of every key of one engine row."""
    for k in range(sq.shape[0]):
        wk = w[k]
        y_len = wk * v_norm[k]
        if given:  # x holds E itself (the cosine's): E = 0 - (-1) x, exactly
            sq[k], w2[k] = one - one, -one
        else:
            sq[k], w2[k] = y_len * y_len, wk + wk
        y = np.float64(wk) * np.float64(v_norm[k])
        cy2[k], cy[k] = coef * (y * y), 2 * coef * y


def _intervals(x, sq, w2, cy2, cy, s, absolute, last, lo, hi):  # pragma: no cover - compiled
    """``M, P = E -+ band`` of every key of one row and size into ``lo``, ``hi`` (float64): ``E`` in
    the screen's dtype (``torch.addcmul(sq, w, x, value=-2)``), then the band in float64."""
    for k in range(last):
        value = np.float64(sq[k] - w2[k] * x[k])
        band = cy2[k] + cy[k] * s + absolute
        lo[k], hi[k] = value - band, value + band


#: The bits that :func:`_order_key` flips in a negative float64: all but the sign.
_MAGNITUDE = np.int64(0x7FFFFFFFFFFFFFFF)
#: The bits of ``+inf``: a float64 whose magnitude bits exceed them is a NaN. They are also
#: ``+inf``'s order key, and their complement ``-inf``'s.
_INF_BITS = np.int64(0x7FF0000000000000)
_NEG_INF_KEY = np.int64(~0x7FF0000000000000)


def _order_key(bits):  # pragma: no cover - compiled
    """An int64 in the order of the float64 whose bits these are (``-0.0`` just below ``+0.0``), and back."""
    return bits ^ ((bits >> 63) & _MAGNITUDE)


def _extremes(lo_bits, hi_bits, rank, n, last, out, may_be_nan):  # pragma: no cover - compiled
    """``max M``, ``max P`` over the selected keys (``rank < n``) and ``min M``, ``min P`` over the
    unselected ones of one row and size (``-inf`` and ``+inf`` where there are none; NaNs never
    taken), found as order keys of their bits and written into ``out`` as bits.

    Integer maxima and minima are exact in any order, so LLVM vectorises them; a float maximum it
    vectorises only under fast-math. The extremes are the values themselves (of ``-0.0`` and
    ``+0.0`` either, which every later comparison treats alike). Without ``may_be_nan`` (the Gram
    route: finite products from finite values, a band finite or ``+inf``) the NaN tests are skipped."""
    low, high = _NEG_INF_KEY, _INF_BITS
    m_max, p_max, m_min, p_min = low, low, high, high
    for k in range(last):
        a, b = lo_bits[k], hi_bits[k]
        selected = rank[k] < n
        a_number = (not may_be_nan) | ((a & _MAGNITUDE) <= _INF_BITS)
        b_number = (not may_be_nan) | ((b & _MAGNITUDE) <= _INF_BITS)
        key_a, key_b = _order_key(a), _order_key(b)
        t = key_a if selected & a_number else low
        m_max = t if t > m_max else m_max
        t = key_b if selected & b_number else low
        p_max = t if t > p_max else p_max
        t = high if selected | (not a_number) else key_a
        m_min = t if t < m_min else m_min
        t = high if selected | (not b_number) else key_b
        p_min = t if t < p_min else p_min
    out[0], out[1], out[2], out[3] = _order_key(m_max), _order_key(p_max), _order_key(m_min), _order_key(p_min)


def _decisions(lo, hi, rank, n, last, m_max, p_max, m_min, p_min, flagged):  # pragma: no cover - compiled
    """The keys of one row and size surely within ``r_max`` (unselected) and ``r_min`` (selected), and
    which keys to measure (``flagged``, and how many): branch-free, vectorised by LLVM."""
    within_max, within_min, n_flagged = 0, 0, 0
    for k in range(last):
        selected = rank[k] < n
        sure_out, sure_in = hi[k] <= m_max, hi[k] <= m_min
        within_max += (not selected) & sure_out
        within_min += selected & sure_in
        near_out = (lo[k] <= p_min) | ((not sure_out) & (lo[k] <= p_max))
        near_in = (hi[k] >= m_max) | ((not sure_in) & (lo[k] <= p_min))
        flag = (selected & near_in) | ((not selected) & near_out)
        flagged[k] = flag
        n_flagged += flag
    return within_max, within_min, n_flagged


def _grow(cells):  # pragma: no cover - compiled
    """``cells`` in an array twice as wide."""
    larger = np.empty((cells.shape[0], 2 * cells.shape[1]), dtype=cells.dtype)
    larger[:, : cells.shape[1]] = cells
    return larger


#: What a listed cell is measured for (:class:`ListedCells`), as bits of its kind: a candidate for
#: ``r_max`` (a selected key that may be the farthest), for ``r_min`` (an unselected key that may be
#: the nearest), an unselected key undecided against ``r_max``, a selected key undecided against ``r_min``.
KIND_R_MAX, KIND_R_MIN, KIND_WITHIN_R_MAX, KIND_WITHIN_R_MIN = 1, 2, 4, 8


@dataclass(frozen=True)
class ListedCells:
    """The keys a block's screen leaves to measure in float64: flat ``[P, K, E, G]`` indices, each
    once, row by row, size by size, keys ascending (the keys of one centre together), with the bits
    of what each is measured for (``KIND_*``) and where each lies (:func:`cell_coordinates`'s four
    arrays, written by the kernel as it lists them)."""

    flat: np.ndarray  # [c] int64
    kinds: np.ndarray  # [c] uint8
    coordinates: tuple[np.ndarray, ...]  # group, key, row and flat [P, E, G] index: four [c] int64

    @classmethod
    def of(cls, cells: np.ndarray) -> "ListedCells":
        """From the kernel's ``[6, c]`` rows: flat index, group, key, row, flat ``[P, E, G]`` index, kinds."""
        return cls(cells[0], cells[5].astype(np.uint8), (cells[1], cells[2], cells[3], cells[4]))

    def lists(self) -> list[np.ndarray]:
        """The four lists of flat indices: ``r_max``'s candidates, ``r_min``'s, the unselected keys
        undecided against ``r_max``, the selected ones against ``r_min`` (in the same order).

        >>> kinds = np.array([KIND_R_MAX | KIND_WITHIN_R_MIN, KIND_R_MIN, KIND_R_MAX])
        >>> cells = ListedCells(np.array([3, 5, 9]), kinds, ())
        >>> [c.tolist() for c in cells.lists()]
        [[3, 9], [5], [], [3]]
        """
        return [self.flat[(self.kinds & kind) != 0] for kind in _KINDS]


_KINDS = (KIND_R_MAX, KIND_R_MIN, KIND_WITHIN_R_MAX, KIND_WITHIN_R_MIN)


#: float64's unit roundoff ``2^-53`` and smallest subnormal ``2^-1074`` (the Gram route's band).
_UNIT = 2.0**-53
_TINY = 5e-324

#: The Gram matrix's storage dtypes, each with the unit roundoff and the largest absolute rounding
#: (half its smallest subnormal) of storing a float64 entry in it, which the band adds (0 for
#: float64: the band's ``d u`` term covers the entries as computed).
GRAM_ROUNDING = {np.dtype(np.float64): (0.0, 0.0), np.dtype(np.float32): (2.0**-24, 2.0**-150)}


def _accumulate(gram, order, factor, t, n, last, acc):  # pragma: no cover - compiled
    """``acc[k] += factor[t] * gram[order[t], k]`` for ``t`` up to ``n`` and ``k < last``, in ``t`` order
    (four terms per pass over ``acc``, added one after another: the same sums as one at a time).
    Compiled with contraction only: each term is one fused multiply-add where the CPU has one (one
    rounding instead of two, which the band covers as well; nothing is reordered)."""
    while t + 4 <= n:
        f0, f1, f2, f3 = factor[t], factor[t + 1], factor[t + 2], factor[t + 3]
        g0, g1, g2, g3 = gram[order[t]], gram[order[t + 1]], gram[order[t + 2]], gram[order[t + 3]]
        for k in range(last):
            acc[k] = (((acc[k] + f0 * g0[k]) + f1 * g1[k]) + f2 * g2[k]) + f3 * g3[k]
        t += 4
    while t < n:
        f0, g0 = factor[t], gram[order[t]]
        for k in range(last):
            acc[k] = acc[k] + f0 * g0[k]
        t += 1


class ScreenRows(NamedTuple):
    """The rows of one block's screen, as the compiled pass reads them (:func:`screen_counts`).

    ``one`` is 1 in the screen's dtype (float32 arithmetic stays float32); ``given``: ``x`` holds
    the screening values themselves (the cosine's) instead of the products.
    """

    w: np.ndarray  # [P, E, K] the rows' scaled weights
    v_norm: np.ndarray  # [P, E, K] ||v_i|| in each row's scale
    rank: np.ndarray  # [P, E, K] int64, each key's place in its row's selection order
    ns: np.ndarray  # [E, G] int64, the sizes of each row
    q: np.ndarray  # [E] int64, each row's last key
    coef: float  # the band's coefficient of ||y_i|| (||y_i|| + 2 ||s||)
    absolute: np.ndarray  # [P, E, G] float64, the band's part common to a row and size
    s_norm: np.ndarray  # [P, E, G] float64, ||s||
    one: Any
    given: bool


class GramProducts(NamedTuple):
    """The Gram route's inputs of the compiled pass (:func:`gram_screen_counts`); :meth:`none` on the
    value route, whose products come formed."""

    gram: np.ndarray  # [P, L, L] float64 or float32
    order: np.ndarray  # [P, E, K] int64, each row's selection order
    factor: np.ndarray  # [P, E, K] float64, the scaled weight of the t-th selected key
    x_scale: np.ndarray  # [P, E] float64, the power of two to the row's scale
    dim: int  # d, the values' dimension (the band)
    unit: float  # the rounding unit of the Gram's storage
    tiny: float  # the smallest normal number of the Gram's storage

    @classmethod
    def none(cls) -> "GramProducts":
        """No Gram matrix: the value route."""
        empty = np.empty((0, 0, 0))
        return cls(empty, np.empty((0, 0, 0), dtype=np.int64), empty, np.empty((0, 0)), 0, 0.0, 0.0)


def _screen_counts(x, products, rows, counts, cells):  # pragma: no cover
    # x [P, E, G, K] the products (the value route), or, where products.gram [P, L, L] (L >= K;
    # float64 or float32, read into float64) is not empty, x [0, 0, 0, 0] float64 and the products
    # formed here (the Gram route, GramProducts: order, factor [P, E, K], x_scale [P, E], ns
    # non-decreasing; unit and tiny the rounding of the Gram's storage; see below). rows
    # (ScreenRows): w, v_norm, rank [P, E, K]; ns [E, G]; q [E]; absolute, s_norm [P, E, G].
    gram, order, factor, x_scale, dim, gram_unit, gram_tiny = products
    w, v_norm, rank, ns, q, coef, absolute, s_norm, one, given = rows
    # counts [2, P, E, G]: the unselected keys surely within r_max, the selected surely within r_min;
    # cells [6, capacity]: the keys to measure, each once: flat [P, K, E, G] index, group, key, row,
    # flat [P, E, G] index of the row and size, and the bits (ListedCells) of what for. Each row and
    # size is three passes along its keys (contiguous; keys after the row's last never read), then a
    # look at its few flagged keys.
    from_gram = gram.shape[0] > 0
    n_groups, n_rows, n_keys = rank.shape
    n_sizes = ns.shape[1]
    n_cells = 0
    sq, w2 = np.empty(n_keys, dtype=x.dtype), np.empty(n_keys, dtype=x.dtype)
    cy2, cy = np.empty(n_keys), np.empty(n_keys)
    lo, hi = np.empty(n_keys), np.empty(n_keys)
    lo_bits, hi_bits = lo.view(np.int64), hi.view(np.int64)
    extremes = np.empty(4)
    extremes_bits = extremes.view(np.int64)
    # the flags, read eight at a time (as one uint64) by the last look: most words hold none
    flagged = np.zeros(8 * ((n_keys + 7) // 8), dtype=np.bool_)
    flag_words = flagged.view(np.uint64)
    acc = np.empty(n_keys if from_gram else 0, dtype=x.dtype)  # the Gram route's products of one row
    for p in range(n_groups):
        for r in range(n_rows):
            last = q[r] + 1
            _row_terms(w[p, r], v_norm[p, r], coef, one, given, sq, w2, cy2, cy)
            rank_r = rank[p, r]
            lengths, t, xs = 0.0, 0, 1.0
            if from_gram:  # x = xs * acc with xs a power of two, folded into 2 alpha_i
                xs = x_scale[p, r]
                for k in range(last):
                    w2[k] = w2[k] * xs
                acc[:last] = 0.0
            for g in range(n_sizes):
                n, s, band_floor = ns[r, g], s_norm[p, r, g], absolute[p, r, g]
                if from_gram:
                    # the running sums up to N, and the band's term of their rounding: a(N) ||y_i||
                    # with a(N) = 4 ((d + 2N + 8) u + u_G) A(N), A(N) = sum_{t<N} factor_t ||v_t||,
                    # formed as cy (s + a / (2 coef)); and their subnormal floors (docs/engine.md)
                    _accumulate(gram[p], order[p, r], factor[p, r], t, n, last, acc)
                    for j in range(t, n):
                        lengths += factor[p, r, j] * v_norm[p, r, order[p, r, j]]
                    t = n
                    s = s + (2 * (dim + 2 * n + 8) * _UNIT + 2 * gram_unit) * lengths / coef
                    band_floor = band_floor + 8.0 * (xs * (dim + n) + 2.0) * _TINY + 4.0 * xs * n * gram_tiny
                    _intervals(acc, sq, w2, cy2, cy, s, band_floor, last, lo, hi)
                    _extremes(lo_bits, hi_bits, rank_r, n, last, extremes_bits, False)
                else:
                    _intervals(x[p, r, g], sq, w2, cy2, cy, s, band_floor, last, lo, hi)
                    _extremes(lo_bits, hi_bits, rank_r, n, last, extremes_bits, True)
                m_max, p_max, m_min, p_min = extremes[0], extremes[1], extremes[2], extremes[3]
                counts[0, p, r, g], counts[1, p, r, g], n_flagged = _decisions(
                    lo, hi, rank_r, n, last, m_max, p_max, m_min, p_min, flagged
                )
                if n_cells + n_flagged > cells.shape[1]:  # room for this row's cells
                    cells = _grow(cells)
                word, seen = 0, 0
                while seen < n_flagged:  # the few flagged keys, up to the last one: their cells
                    if flag_words[word] == 0:  # (flags past ``last`` may be stale: never read)
                        word += 1
                        continue
                    for k in range(8 * word, min(8 * word + 8, last)):
                        if not flagged[k]:
                            continue
                        seen += 1
                        if rank_r[k] < n:  # r_max's candidate (the farthest selected key?), r_min's undecided
                            kind = (KIND_R_MAX if hi[k] >= m_max else 0) | (
                                KIND_WITHIN_R_MIN if hi[k] > m_min and lo[k] <= p_min else 0
                            )
                        else:  # r_min's candidate (the nearest unselected key?), r_max's undecided
                            kind = (KIND_R_MIN if lo[k] <= p_min else 0) | (
                                KIND_WITHIN_R_MAX if hi[k] > m_max and lo[k] <= p_max else 0
                            )
                        if kind:  # (none only where a bound is NaN)
                            cells[0, n_cells] = ((p * n_keys + k) * n_rows + r) * n_sizes + g
                            cells[1, n_cells], cells[2, n_cells], cells[3, n_cells] = p, k, r
                            cells[4, n_cells] = (p * n_rows + r) * n_sizes + g
                            cells[5, n_cells] = kind
                            n_cells += 1
                    word += 1
    return n_cells, cells


def _prefix_sums(v, order, factor, at, last, centers, z):  # pragma: no cover - compiled
    """Running sums of ``v[order[k]] * factor[k]`` over ``k``, kept at the keys ``at`` (non-decreasing)
    and at ``last``: what ``cumsum`` then ``gather`` give, summed in the same order (four keys per
    pass over the running sum, added one after another: the same sums as one at a time)."""
    n_groups, n_rows, n_keys = order.shape
    n_sizes, dim = at.shape[1], v.shape[2]
    acc = np.empty(dim, dtype=v.dtype)
    for p in range(n_groups):
        for r in range(n_rows):
            acc[:] = 0.0
            f, o, k = factor[p, r], order[p, r], 0
            for g in range(n_sizes + 1):  # up to each size's last key, then to the row's last key
                stop = at[r, g] if g < n_sizes else last[r]  # inclusive; every size is at most last (N <= K)
                while k + 3 <= stop:  # contiguous rows: LLVM vectorises
                    f0, f1, f2, f3 = f[k], f[k + 1], f[k + 2], f[k + 3]
                    a0, a1, a2, a3 = v[p, o[k]], v[p, o[k + 1]], v[p, o[k + 2]], v[p, o[k + 3]]
                    for j in range(dim):
                        acc[j] = (((acc[j] + a0[j] * f0) + a1[j] * f1) + a2[j] * f2) + a3[j] * f3
                    k += 4
                while k <= stop:
                    f0, a0 = f[k], v[p, o[k]]
                    for j in range(dim):
                        acc[j] += a0[j] * f0
                    k += 1
                if g < n_sizes:
                    centers[p, r, g] = acc
                else:
                    z[p, r, 0] = acc


def _differences(v, scale, w, centers, group, key, row, where, out):  # pragma: no cover - compiled
    """``w * (v * scale) - s`` of each listed cell, elementwise as the tensor code forms it."""
    for c in range(group.shape[0]):
        p, k, r = group[c], key[c], row[c]
        weight, factor = w[p, r, k], scale[p, r]
        value, center, result = v[p, k], centers[where[c]], out[c]  # contiguous rows: LLVM vectorises
        for j in range(value.shape[0]):
            result[j] = weight * (value[j] * factor) - center[j]


def _coordinates(flat, n_keys, n_rows, n_sizes, group, key, row, where):  # pragma: no cover - compiled
    """Group, key, row and flat ``[P, E, G]`` index of each flat ``[P, K, E, G]`` cell."""
    for c in range(flat.shape[0]):
        f = flat[c]
        size, rest = f % n_sizes, f // n_sizes
        r, rest = rest % n_rows, rest // n_rows
        group[c], key[c], row[c] = rest // n_keys, rest % n_keys, r
        where[c] = (group[c] * n_rows + r) * n_sizes + size


def _measured_radii(dist, where, kinds, k_out, k_in, r_max, r_min):  # pragma: no cover - compiled
    """:func:`measured_radii` in two passes over the listed cells (a NaN distance stays, as torch's do)."""
    for c in range(dist.shape[0]):  # every row and size's extremes among its candidates
        d, w, kind = dist[c], where[c], kinds[c]
        if kind & KIND_R_MAX and (d > r_max[w] or d != d):
            r_max[w] = d
        if kind & KIND_R_MIN and (d < r_min[w] or d != d):
            r_min[w] = d
    for c in range(dist.shape[0]):  # then the undecided keys against them
        d, w, kind = dist[c], where[c], kinds[c]
        if kind & KIND_WITHIN_R_MAX and d <= r_max[w]:
            k_out[w] += 1
        if kind & KIND_WITHIN_R_MIN and d <= r_min[w]:
            k_in[w] += 1


_compiled: Any = None
_compiled_sums: Any = None
_compiled_radii: Any = None
_compiled_differences: Any = None
_compiled_coordinates: Any = None
if AVAILABLE:
    _row_terms = numba.njit(cache=True, inline="always")(_row_terms)
    _intervals = numba.njit(cache=True, inline="always")(_intervals)
    _order_key = numba.njit(cache=True, inline="always")(_order_key)
    _extremes = numba.njit(cache=True, inline="always")(_extremes)
    _decisions = numba.njit(cache=True, inline="always")(_decisions)
    _grow = numba.njit(cache=True, inline="never")(_grow)
    _accumulate = numba.njit(cache=True, fastmath={"contract"})(_accumulate)
    _compiled = numba.njit(cache=True, nogil=True)(_screen_counts)
    _compiled_sums = numba.njit(cache=True, nogil=True)(_prefix_sums)
    _compiled_differences = numba.njit(cache=True, nogil=True)(_differences)
    _compiled_coordinates = numba.njit(cache=True, nogil=True)(_coordinates)
    _compiled_radii = numba.njit(cache=True, nogil=True)(_measured_radii)


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
) -> tuple[np.ndarray, ListedCells]:
    """The counts and re-check cells of one block's screen, in one pass over its keys (twice).

    Key ``i`` of row ``e`` and size ``g`` has the screening value ``E`` and the band
    ``coef ||y_i|| (||y_i|| + 2 ||s||) + absolute`` (``||y_i|| = w v_norm``): the float64 value
    ``D_i^2 - ||s||^2`` of its direct distance (Euclidean; ``D_i - 1`` for the cosine) lies in
    ``[M, P] = [E - band, E + band]`` (docs/engine.md).

    Parameters
    ----------
    x : [P, E, G, K] screen dtype
        ``<v_i, s(N)>`` of every group, engine row, size and key, in the rows' scale (or ``E``:
        ``given``); the keys innermost: the kernel's loops run along them.
    w : [P, E, K] screen dtype
        The rows' scaled weights.
    v_norm : [P, E, K] screen dtype
        ``||v_i||`` in each row's scale.
    rank : [P, E, K] int64
        Each key's place in its row's selection order.
    ns : [E, G] int64
        The sizes of each row (in any order).
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
    cells : ListedCells
        The keys to measure, each once: the candidates for ``r_max`` (selected, ``P >= max M``) and
        for ``r_min`` (unselected, ``M <= min P``), and the keys neither surely within nor surely
        beyond ``r_max`` (unselected) and ``r_min`` (selected).
    """
    if _compiled is None:  # pragma: no cover
        raise RuntimeError("the fused kernel needs numba: pip install numba, or use kernel='torch'")
    one = np.ones((), dtype=x.dtype)[()]  # in the screen's dtype: float32 arithmetic stays float32
    counts, cells = _outputs(absolute)
    rows = ScreenRows(w, v_norm, rank, ns, q, float(coef), absolute, s_norm, one, given)
    n_cells, cells = _compiled(x, GramProducts.none(), rows, counts, cells)
    return counts, ListedCells.of(cells[:, :n_cells])


def gram_screen_counts(
    gram: np.ndarray,
    order: np.ndarray,
    factor: np.ndarray,
    w: np.ndarray,
    v_norm: np.ndarray,
    rank: np.ndarray,
    ns: np.ndarray,
    q: np.ndarray,
    x_scale: np.ndarray,
    dim: int,
    coef: float,
    absolute: np.ndarray,
    s_norm: np.ndarray,
) -> tuple[np.ndarray, ListedCells]:
    """:func:`screen_counts` (Euclidean, float64) with the products formed in the pass, from the Gram matrix.

    The product ``<v_i, s(N)>`` of a row is ``x_scale * sum_{t < N} factor_t G[i, order_t]``: a running
    sum along the row's selection order of the rows of ``G = V V^T``, ``K`` multiply-adds per key and
    row for all its sizes together, against ``d`` per key and size by the value product; no
    ``[P, E, G, K]`` product is stored. The sums are float64 whatever the Gram's dtype. The band takes
    their rounding too, and a float32 Gram's (docs/engine.md), so the counts and cells decide the same
    keys surely or not as the definitions require.

    Every input must be finite (``absolute`` may be ``+inf``), as the engine's are: the products and
    bounds are then never NaN, and the pass takes its extremes without testing for NaNs.

    Parameters
    ----------
    gram : [P, L, L] float64 or float32
        ``<v_i, v_j>`` of each group's values as given (``L`` at least the block's ``K``), formed in
        float64 (float32: each entry then rounded to it; half the bytes that the sums stream).
    order : [P, E, K] int64
        Each row's selection order.
    factor : [P, E, K] float64
        Each row's scaled weight of its ``t``-th selected key.
    w, v_norm, rank, q, coef, absolute, s_norm :
        As for :func:`screen_counts` (float64).
    ns : [E, G] int64
        The sizes of each row, non-decreasing.
    x_scale : [P, E] float64
        The power of two that takes the Gram's products to the row's scale (``2^(-2 value_exp)``).
    dim : int
        ``d``, the values' dimension (the band).

    Returns
    -------
    counts, cells : as :func:`screen_counts`.
    """
    if _compiled is None:  # pragma: no cover
        raise RuntimeError("the fused kernel needs numba: pip install numba, or use kernel='torch'")
    _check_non_decreasing(ns, "gram_screen_counts")
    if not coef > 0:  # the band's term is formed through 1 / coef (the Euclidean screen's coef > 0)
        raise ValueError(f"gram_screen_counts needs coef > 0 (the Euclidean screen's), got {coef}")
    if gram.dtype not in GRAM_ROUNDING:
        raise ValueError(f"gram_screen_counts needs a float64 or float32 Gram matrix, got {gram.dtype}")
    gram_unit, gram_tiny = GRAM_ROUNDING[gram.dtype]
    counts, cells = _outputs(absolute)
    products = GramProducts(gram, order, factor, x_scale, int(dim), gram_unit, gram_tiny)
    rows = ScreenRows(w, v_norm, rank, ns, q, float(coef), absolute, s_norm, np.float64(1.0), False)
    n_cells, cells = _compiled(np.empty((0, 0, 0, 0)), products, rows, counts, cells)
    return counts, ListedCells.of(cells[:, :n_cells])


def gram_running_sums(gram: np.ndarray, order: np.ndarray, factor: np.ndarray, n: int, last: int) -> np.ndarray:
    """``sum_{t < n} factor[t] * gram[order[t], :last]`` as the Gram route adds it: float64, in ``t`` order.

    Parameters
    ----------
    gram : [L, L] float64 or float32
        One group's Gram matrix.
    order, factor : [K] int64, [K] float64
        A row's selection order and the weight of its ``t``-th selected key.
    n, last : int
        The terms to add (``n <= K``) and the products to form (``last <= L``).

    Returns
    -------
    [last] float64
        The products of the row's keys ``0..last-1`` with its centre of size ``n`` (unscaled).

    >>> gram_running_sums(np.eye(3), np.array([2, 0, 1]), np.array([0.5, 0.25, 0.25]), 2, 3).tolist()
    [0.25, 0.0, 0.5]
    """
    if not (0 <= n <= min(len(order), len(factor)) and 0 <= last <= gram.shape[1]):
        raise ValueError(f"gram_running_sums needs n <= len(order) and last <= L, got n={n}, last={last}")
    if n and not 0 <= int(np.min(order[:n])) <= int(np.max(order[:n])) < gram.shape[0]:
        raise ValueError("gram_running_sums needs the order's keys among the Gram matrix's rows")
    acc = np.zeros(last)
    _accumulate(np.ascontiguousarray(gram), np.ascontiguousarray(order), np.ascontiguousarray(factor), 0, n, last, acc)
    return acc


@lru_cache(maxsize=1)
def gram_sums_fused() -> bool:
    """Whether the Gram route's running sums add each term as a fused multiply-add here (one rounding:
    CPUs with FMA) or as a product then a sum (two): whether :func:`gram_running_sums` keeps the
    ``2^-60`` of ``-1 + (1 + 2^-30)^2``, which one rounding keeps and two do not.

    >>> gram_sums_fused() in (True, False)
    True
    """
    x = 1.0 + 2.0**-30  # the terms -1 (exact), then x * x = 1 + 2^-29 + 2^-60
    sums = gram_running_sums(np.array([[-1.0], [x]]), np.array([0, 1]), np.array([1.0, x]), 2, 1)
    return bool(sums[0] != 2.0**-29)


def _check_non_decreasing(sizes: np.ndarray | Tensor, caller: str) -> None:
    """Raise ValueError unless each row of ``sizes [E, G]`` is non-decreasing (the sums run forward)."""
    if sizes.shape[1] > 1 and bool((sizes[:, 1:] < sizes[:, :-1]).any()):
        raise ValueError(f"{caller} needs each row's sizes in non-decreasing order")


def _outputs(absolute: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' counts ``[2, P, E, G]`` and listed cells ``[6, capacity]`` (usually enough; grown if not)."""
    return np.zeros((2, *absolute.shape), dtype=np.int64), np.empty((6, 2 * absolute.size + 256), dtype=np.int64)


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
    _check_non_decreasing(at, "prefix_sums")
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


def grid_sums(
    values: Tensor, factor: Tensor, ns: Tensor, order: Tensor | None = None, *, compiled: bool | None = None
) -> Tensor:
    """``s[r, g] = sum_{t < ns[g]} factor[r, t] * values[r, order[r, t]]`` for every row, summed in ``t`` order.

    The centres ``s(N)`` of a grid of sizes for rows whose own values are ``values [R, K, d]``
    (``order [R, K]``: each row's selection order; None: ``values`` are in selection order
    already) and ``factor [R, K]`` the weight of each row's ``t``-th selected key; ``ns [G]`` in
    any order. ``compiled`` (None: where numba imports and ``values`` is a float64 CPU tensor):
    :func:`prefix_sums` with one row per group, ``K d`` additions per row and no ``[R, K, d]``
    copy; else ``torch.cumsum`` of the sorted contributions (the same numbers).

    >>> import torch
    >>> v, f = torch.randn(2, 5, 3, dtype=torch.float64), torch.rand(2, 5, dtype=torch.float64)
    >>> s = grid_sums(v, f, torch.tensor([4, 1]))
    >>> torch.equal(s, grid_sums(v, f, torch.tensor([4, 1]), compiled=False))
    True
    >>> torch.allclose(s[:, 0], (f[:, :4, None] * v[:, :4]).sum(1)) and torch.equal(s[:, 1], v[:, 0] * f[:, :1])
    True
    """
    compiled = use_compiled(compiled, values, float64=True, reference="torch.cumsum")
    n_rows, n_keys, dim = values.shape
    if not compiled:
        ordered = values if order is None else torch.gather(values, 1, order[..., None].expand(-1, -1, dim))
        return torch.cumsum(ordered * factor.to(values.dtype)[..., None], dim=1)[:, ns - 1]
    if order is None:
        order = torch.arange(n_keys).expand(n_rows, n_keys)
    grid, back = torch.unique(ns, sorted=True, return_inverse=True)
    centers, _ = prefix_sums(
        values, order[:, None], factor.to(values.dtype)[:, None], (grid - 1)[None, :], torch.tensor([n_keys - 1])
    )
    return centers[:, 0, back]


#: The bytes of one chunk of :func:`distances`' differences: they stay in the CPU's caches between
#: the pass that forms them and the norm that reads them (one ``[cells, d]`` array of every listed
#: cell, about 125 MB a layer of SmolLM2 at 512 tokens, went to memory and back; smaller chunks
#: cost more calls than they save).
DISTANCE_CHUNK_BYTES = 1 << 21


def distances(
    v: Tensor, scale: Tensor, w: Tensor, centers: Tensor, cells: tuple[Tensor, ...], *, chunk: int | None = None
) -> Tensor:
    """The direct Euclidean distances ``||y - s||`` of some cells, a chunk of cells at a time.

    Each chunk's vectors ``y - s`` are formed in one compiled pass (no gathered ``[c, d]``
    intermediates) into one reused buffer, and :func:`torch.linalg.vector_norm` takes their lengths:
    each row's length is the one a single norm of every row gives, bit for bit.

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
    chunk : int, optional
        Cells per chunk; by default as many as fill :data:`DISTANCE_CHUNK_BYTES`.

    Returns
    -------
    [c] float64
        ``||w[p, r, k] * (v[p, k] * scale[p, r]) - centers[where]||``: the operations of the tensor
        code, so the same numbers bit for bit.
    """
    group, key, row, where = (t.contiguous().numpy() for t in cells)
    n_cells, dim = group.shape[0], v.shape[2]
    chunk = max(1, DISTANCE_CHUNK_BYTES // (8 * max(dim, 1))) if chunk is None else chunk
    if chunk < 1:
        raise ValueError(f"distances needs chunk >= 1, got {chunk}")
    arrays = [t.contiguous().numpy() for t in (v, scale, w, centers)]
    out = torch.empty(n_cells, dtype=torch.float64)
    work = torch.empty((min(chunk, n_cells), dim), dtype=torch.float64)
    for start in range(0, n_cells, chunk):
        stop = min(start + chunk, n_cells)
        part = work[: stop - start]
        cut = slice(start, stop)
        _compiled_differences(*arrays, group[cut], key[cut], row[cut], where[cut], part.numpy())
        torch.linalg.vector_norm(part, dim=-1, out=out[cut])
    return out


def cell_coordinates(
    flat: Tensor, n_keys: int, n_rows: int, n_sizes: int, *, compiled: bool | None = None
) -> tuple[Tensor, ...]:
    """Where each listed cell of a block's screen lies: one copy for both screens.

    Parameters
    ----------
    flat : [c] int64
        Flat ``[P, K, E, G]`` indices (``P`` groups, ``K`` keys, ``E`` rows, ``G`` sizes).
    n_keys, n_rows, n_sizes : int
        ``K``, ``E`` and ``G``.
    compiled : bool or None
        One numba pass (True) or six torch operations (False, on any device). None: compiled where
        numba imports and ``flat`` is on the CPU. The two give the same integers.

    Returns
    -------
    group, key, row, where : four [c] int64
        The cell's group, key and row, and the flat ``[P, E, G]`` index of its row and size.

    >>> [t.tolist() for t in cell_coordinates(torch.tensor([0, 13]), n_keys=2, n_rows=2, n_sizes=3)]
    [[0, 1], [0, 0], [0, 0], [0, 7]]
    """
    if not use_compiled(compiled, flat):
        size, rest = flat % n_sizes, flat // n_sizes
        row, rest = rest % n_rows, rest // n_rows
        key, group = rest % n_keys, rest // n_keys
        return group, key, row, (group * n_rows + row) * n_sizes + size
    out = torch.empty((4, flat.shape[0]), dtype=torch.int64)
    _compiled_coordinates(flat.contiguous().numpy(), n_keys, n_rows, n_sizes, *out.numpy())
    return tuple(out)


def measured_radii(
    dist: Tensor, where: Tensor, kinds: Tensor, k_out: Tensor, k_in: Tensor, *, compiled: bool | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The radii and counts of a block's rows and sizes from the direct distances of its listed cells.

    Parameters
    ----------
    dist : [c] float64
        The direct distance of each listed cell (:class:`ListedCells`).
    where : [c] int64
        Its row and size: the flat ``[P, E, G]`` index (:func:`cell_coordinates`).
    kinds : [c] uint8
        What it was listed for (the ``KIND_*`` bits).
    k_out, k_in : [P, E, G] int64
        The screen's counts of the keys surely within ``r_max`` and ``r_min``.
    compiled : bool or None
        Two numba passes (True) or torch scatters (False, on any device); None: compiled where
        numba imports and ``dist`` is on the CPU. The two give the same numbers.

    Returns
    -------
    k_out, k_in, r_max, r_min : [P, E, G]
        ``r_max`` the largest distance of the ``KIND_R_MAX`` cells of each row and size (``-inf``
        where none), ``r_min`` the smallest of the ``KIND_R_MIN`` cells (``+inf``: nothing left out);
        the counts plus the ``KIND_WITHIN_R_MAX`` cells within ``r_max`` and the
        ``KIND_WITHIN_R_MIN`` cells within ``r_min`` (new tensors).

    >>> k = torch.zeros(1, 1, 1, dtype=torch.int64)
    >>> kinds = torch.tensor([KIND_R_MAX, KIND_R_MAX, KIND_WITHIN_R_MAX], dtype=torch.uint8)
    >>> dist, where = torch.tensor([1.0, 2.0, 1.5], dtype=torch.float64), torch.zeros(3, dtype=torch.int64)
    >>> [t.flatten().tolist() for t in measured_radii(dist, where, kinds, k, k)]
    [[1], [0], [2.0], [inf]]
    """
    shape = tuple(k_out.shape)
    if use_compiled(compiled, dist, float64=True):
        k_out, k_in = k_out.clone(), k_in.clone()
        r_max = torch.full(shape, -torch.inf, dtype=torch.float64)
        r_min = torch.full(shape, torch.inf, dtype=torch.float64)
        arrays = (dist, where, kinds, k_out.view(-1), k_in.view(-1), r_max.view(-1), r_min.view(-1))
        _compiled_radii(*(t.contiguous().numpy() for t in arrays[:3]), *(t.numpy() for t in arrays[3:]))
        return k_out, k_in, r_max, r_min
    r_max = _extreme(dist, where, kinds, KIND_R_MAX, shape, "amax")
    r_min = _extreme(dist, where, kinds, KIND_R_MIN, shape, "amin")
    k_out = k_out + _within(dist, where, kinds, KIND_WITHIN_R_MAX, r_max)
    k_in = k_in + _within(dist, where, kinds, KIND_WITHIN_R_MIN, r_min)
    return k_out, k_in, r_max, r_min


def _extreme(dist: Tensor, where: Tensor, kinds: Tensor, kind: int, shape: tuple[int, ...], reduce: str) -> Tensor:
    """Max / min of the distances ``dist`` of the listed cells of ``kind`` per row and size
    (``where``, flat): of ``shape`` (``-inf`` / ``+inf`` where none)."""
    fill = -torch.inf if reduce == "amax" else torch.inf
    values = torch.where((kinds & kind) != 0, dist, fill)
    out = torch.full((math.prod(shape),), fill, dtype=torch.float64, device=dist.device)
    return out.scatter_reduce_(0, where, values, reduce=reduce).view(shape)


def _within(dist: Tensor, where: Tensor, kinds: Tensor, kind: int, radius: Tensor) -> Tensor:
    """How many of the distances ``dist`` of the listed cells of ``kind`` lie within the radius of
    their row and size ``where``: of the radius' shape."""
    hits = ((dist <= radius.reshape(-1).index_select(0, where)) & ((kinds & kind) != 0)).to(torch.int64)
    out = torch.zeros(radius.numel(), dtype=torch.int64, device=dist.device)
    return out.index_add_(0, where, hits).view(radius.shape)


__all__ = [
    "AVAILABLE",
    "DISTANCE_CHUNK_BYTES",
    "GRAM_ROUNDING",
    "GramProducts",
    "KIND_R_MAX",
    "KIND_R_MIN",
    "KIND_WITHIN_R_MAX",
    "KIND_WITHIN_R_MIN",
    "ListedCells",
    "ScreenRows",
    "cell_coordinates",
    "distances",
    "gram_running_sums",
    "gram_screen_counts",
    "gram_sums_fused",
    "grid_sums",
    "measured_radii",
    "prefix_sums",
    "screen_counts",
    "use_compiled",
]
