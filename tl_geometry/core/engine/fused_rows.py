"""The per-row engine's screen decisions in compiled (numba) passes over each cell's keys.

For every batch ``b`` (row and draw) and size ``N`` of a block, the screen's product gives the
upper bound ``P_t`` of each position's screening value ``E_t = ||y_t||^2 - 2 <y_t, s(N)>`` in
selection order; the lower bound is ``M_t = P_t - 2 ||s|| band_t - band2_t`` (``M = P`` for the
cosine distance). Two passes over ``P`` replace the ~20 tensor passes of the torch decisions
(:mod:`tl_geometry.core.engine.screening`, docs/engine.md):

* :func:`extremes`: ``i* = argmax_{t < N} M_t`` and ``j* = argmin_{t >= N} P_t``;
* :func:`counts`: with the thresholds ``lo``, ``hi`` around ``D_{i*}`` and ``D_{j*}`` (direct
  float64 distances, measured in torch between the passes),
  ``#{P_t < lo}`` and ``#{M_t < hi}`` for both radii: ``K_out = hi - N`` and ``K_in = lo`` where
  exactly one key (``i*``, ``j*``) lies between, else the cell is left to the exact re-check.

Example: ``i_star, j_star = extremes(p, band_key, band_sq, sigma, ns, cosine=False)``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# whether numba imports: one copy, in dispatch.py
from tl_geometry.core.compiled import AVAILABLE

if AVAILABLE:  # a broken install falls back to the torch decisions
    import numba


def _lower(p, neg_two_sigma, band_key, band_sq, cosine):  # pragma: no cover - compiled
    """``M`` of one position, as ``torch.addcmul(P, sigma, band_key, value=-2) - band_sq`` forms it."""
    if cosine:
        return p
    return p + neg_two_sigma * band_key - band_sq


def _beats(v, best, largest):  # pragma: no cover - compiled
    return v > best if largest else v < best


def _first_extreme(x, start, stop, largest):  # pragma: no cover - compiled
    """The first position of the largest (or smallest) of ``x[start:stop]`` (NaNs never taken;
    ``start`` where ``x[start]`` is a NaN): what ``best, at = x[start], start`` then
    ``if x[t] > best`` (``<``) gives.

    Four lanes of positions ``t = start + 1 + 4 i + j`` keep their own first extreme, then the lanes
    are merged by value, ties to the lower position: the same position, without one chain of
    dependent comparisons through every key (about twice as fast). A NaN at ``start`` stays: no
    comparison with it is true. ``largest`` is a constant at each call, so the inlined copies
    carry no branch on it."""
    b0, a0 = x[start], start
    b1 = b2 = b3 = -np.inf if largest else np.inf
    a1 = a2 = a3 = stop
    t = start + 1
    while t + 3 < stop:
        v0, v1, v2, v3 = x[t], x[t + 1], x[t + 2], x[t + 3]
        if _beats(v0, b0, largest):
            b0, a0 = v0, t
        if _beats(v1, b1, largest):
            b1, a1 = v1, t + 1
        if _beats(v2, b2, largest):
            b2, a2 = v2, t + 2
        if _beats(v3, b3, largest):
            b3, a3 = v3, t + 3
        t += 4
    while t < stop:
        if _beats(x[t], b0, largest):
            b0, a0 = x[t], t
        t += 1
    if _beats(b1, b0, largest) or (b1 == b0 and a1 < a0):
        b0, a0 = b1, a1
    if _beats(b2, b0, largest) or (b2 == b0 and a2 < a0):
        b0, a0 = b2, a2
    if _beats(b3, b0, largest) or (b3 == b0 and a3 < a0):
        b0, a0 = b3, a3
    return a0


#: The int32 constants of :func:`_first_extreme_of_bits`: the magnitude bits of a float32, the
#: bits of ``+inf``, the shift of the sign bit, and the smallest int32 (a NaN's key).
_MAGNITUDE32, _INF_BITS32 = np.int32(0x7FFFFFFF), np.int32(0x7F800000)
_SIGN_SHIFT32, _NAN_KEY32 = np.int32(31), np.int32(-(2**31))


def _first_extreme_of_bits(bits, start, stop, largest):  # pragma: no cover - compiled
    """:func:`_first_extreme` of float32s given as their bits (int32), in one vectorised pass.

    Each float becomes an int32 in its order (``-0.0`` and ``+0.0`` alike; for the smallest, its
    complement: the order reversed; a NaN the smallest int32, never taken), shifted into the high
    half of an int64 whose low half is ``2^32 - 1 - t``: the largest int64 is the extreme at its
    first position. An integer maximum is exact in any order, so LLVM vectorises the loop (the
    four-lane float loop has one dependent comparison per lane). The loop runs over a slice from
    0: no index can be negative, which would stop LLVM vectorising it."""
    x = bits[start:stop]
    if (x[0] & _MAGNITUDE32) > _INF_BITS32:  # a NaN at start: no comparison with it is true
        return start
    best = np.int64(-1) << 63
    for t in range(x.shape[0]):
        b = x[t]
        magnitude = b & _MAGNITUDE32
        key = b ^ ((b >> _SIGN_SHIFT32) & _MAGNITUDE32)
        key = key if magnitude != 0 else magnitude  # -0.0 as +0.0
        if not largest:
            key = ~key
        key = key if magnitude <= _INF_BITS32 else _NAN_KEY32
        packed = (np.int64(key) << 32) | np.int64(0xFFFFFFFF - t)
        best = packed if packed > best else best
    return start + (0xFFFFFFFF - (best & 0xFFFFFFFF))


def _extreme(x, bits, start, stop, largest):  # pragma: no cover - compiled
    """:func:`_first_extreme` of ``x[start:stop]``; from ``bits`` (``x`` as int32) where ``x`` is float32."""
    if bits.shape[0] > 0:
        return _first_extreme_of_bits(bits, start, stop, largest)
    return _first_extreme(x, start, stop, largest)


def _extremes(
    upper, upper_bits, band_key, band_sq, sigma, ns, rank, consts, cosine, i_star, j_star
):  # pragma: no cover
    n_batch, n_sizes, n_keys = upper.shape
    n_draws = n_batch // band_key.shape[0]
    ranked = rank.shape[0] > 0  # keys in key order, each at its selection position rank[b, t]
    as_bits = upper_bits.shape[0] > 0  # float32: the extremes from the bits
    lower = np.empty(n_keys, dtype=upper.dtype)  # one cell's M, in selection order
    cell = np.empty(n_keys, dtype=upper.dtype)  # one cell's P gathered into selection order (ranked)
    no_bits = np.empty(0, dtype=upper_bits.dtype)
    lower_bits = lower.view(upper_bits.dtype) if as_bits else no_bits
    cell_bits = cell.view(upper_bits.dtype) if as_bits else no_bits
    key_at = np.empty(n_keys, dtype=np.int64)  # the key at each selection position (ranked)
    key_bands = np.empty((2, n_keys), dtype=band_key.dtype)  # the bands in selection order (ranked)
    for b in range(n_batch):
        row = b // n_draws
        if ranked:
            for t in range(n_keys):
                key_at[rank[b, t]] = t
            for position in range(n_keys):
                key_bands[0, position] = band_key[row, key_at[position]]
                key_bands[1, position] = band_sq[row, key_at[position]]
            bands, bands_sq = key_bands[0], key_bands[1]
        else:
            bands, bands_sq = band_key[row], band_sq[row]
        for g in range(n_sizes):
            n = ns[g]
            neg_two_sigma = consts[0] * sigma[b, g]
            x, x_bits = upper[b, g], upper_bits[b, g] if as_bits else no_bits
            start = min(n, n_keys - 1)
            if ranked:  # gathered, so that I_N is the first N positions here too
                for position in range(n_keys):
                    cell[position] = x[key_at[position]]
                x, x_bits = cell, cell_bits
            if cosine:
                i_star[b, g] = _extreme(x, x_bits, 0, n, True)
            else:
                for t in range(n):  # M of the in-keys, then its first largest
                    lower[t] = _lower(x[t], neg_two_sigma, bands[t], bands_sq[t], cosine)
                i_star[b, g] = _extreme(lower, lower_bits, 0, n, True)
            j_star[b, g] = _extreme(x, x_bits, start, n_keys, False)


def _tally(upper, lower, lo_max, hi_max, lo_min, hi_min, zero):  # pragma: no cover - compiled
    """``#{P_t < lo_max}``, ``#{M_t < hi_max}``, ``#{P_t < lo_min}``, ``#{M_t < hi_min}`` of one cell,
    as sums of ones in the dtype of ``zero``.

    Compiled with only the ``reassoc`` fast-math flag, so that LLVM may reorder these sums (a float
    sum it vectorises only when it may reorder it; an integer count it keeps in four lanes at most,
    numba's counters being int64): sums of zeros and ones are exact in any order below ``2^24``
    (float32) or ``2^53`` (float64). Nothing else is computed here: ``M`` comes formed."""
    one = zero + np.float32(1.0)  # float32 stays float32 (zero + 1 would be float64)
    a0, a1, a2, a3 = zero, zero, zero, zero
    for t in range(upper.shape[0]):
        p, m = upper[t], lower[t]
        a0 += one if p < lo_max else zero
        a1 += one if m < hi_max else zero
        a2 += one if p < lo_min else zero
        a3 += one if m < hi_min else zero
    return int(a0), int(a1), int(a2), int(a3)


def _counts(
    upper, band_key, band_sq, sigma, ns, thresholds, consts, cosine, zero, k_out, k_in, unsure
):  # pragma: no cover
    n_batch, n_sizes, n_keys = upper.shape
    n_draws = n_batch // band_key.shape[0]
    lower = np.empty(n_keys, dtype=upper.dtype)  # one cell's M
    for b in range(n_batch):
        row = b // n_draws
        for g in range(n_sizes):
            n = ns[g]
            x = upper[b, g]
            m = x
            if not cosine:
                neg_two_sigma = consts[0] * sigma[b, g]
                for t in range(n_keys):
                    lower[t] = _lower(x[t], neg_two_sigma, band_key[row, t], band_sq[row, t], cosine)
                m = lower
            below_lo_max, below_hi_max, below_lo_min, below_hi_min = _tally(
                x, m, thresholds[0, b, g], thresholds[1, b, g], thresholds[2, b, g], thresholds[3, b, g], zero
            )
            k_out[b, g] = below_hi_max - n
            doubt = below_hi_max - below_lo_max != 1
            if n == n_keys:  # no out-key: r_min = inf, K_in = N
                k_in[b, g] = n
            else:
                k_in[b, g] = below_lo_min
                doubt = doubt or below_hi_min - below_lo_min != 1
            unsure[b, g] = doubt


def _ordered_rows(y, order, at, by_size, operand, centers, rank):  # pragma: no cover - compiled
    n_rows, n_draws, n_keys = order.shape
    n_sizes, dim = at.shape[0], y.shape[2]
    write_operand, write_rank = operand.shape[0] > 0, rank.shape[0] > 0
    acc = np.empty(dim, dtype=y.dtype)
    for r in range(n_rows):
        for draw in range(n_draws):
            b = r * n_draws + draw
            acc[:] = 0.0
            g = 0
            for k in range(n_keys):
                key = order[r, draw, k]
                if write_rank:
                    rank[b, key] = k
                for j in range(dim):
                    x = y[r, key, j]
                    acc[j] += x
                    if write_operand:
                        operand[b, k, j] = x
                while g < n_sizes and at[by_size[g]] == k:
                    centers[b, by_size[g]] = acc
                    g += 1


def _scaled(values, exponents, out):  # pragma: no cover - compiled
    """``out[r] = float64(values[r]) * 2^-exponents[r]`` (``|exponents| <= 1000``: an exact power of two)."""
    for r in range(values.shape[0]):
        power = math.ldexp(1.0, -exponents[r])
        for k in range(values.shape[1]):
            for j in range(values.shape[2]):
                out[r, k, j] = np.float64(values[r, k, j]) * power


def _contributions_at(y, order, position, out):  # pragma: no cover - compiled
    n_draws = order.shape[1]
    for h in range(position.shape[0]):
        for b in range(position.shape[1]):
            r, draw = b // n_draws, b % n_draws
            for g in range(position.shape[2]):
                out[h, b, g] = y[r, order[r, draw, position[h, b, g]]]


_compiled_extremes: Any = None
_compiled_counts: Any = None
_compiled_ordered_rows: Any = None
_compiled_contributions_at: Any = None
_compiled_scaled: Any = None
if AVAILABLE:
    _lower = numba.njit(cache=True, inline="always")(_lower)
    _beats = numba.njit(cache=True, inline="always")(_beats)
    _first_extreme = numba.njit(cache=True, inline="always")(_first_extreme)
    _first_extreme_of_bits = numba.njit(cache=True, inline="always")(_first_extreme_of_bits)
    _extreme = numba.njit(cache=True, inline="always")(_extreme)
    _compiled_extremes = numba.njit(cache=True, nogil=True)(_extremes)
    # reassoc on the sums of ones alone: _tally is a leaf called from _counts, which has no fast-math
    # flag and forms M (a function called from a fast-math one would be compiled with its flags)
    _tally = numba.njit(cache=True, nogil=True, fastmath={"reassoc"})(_tally)
    _compiled_counts = numba.njit(cache=True, nogil=True)(_counts)
    _compiled_ordered_rows = numba.njit(cache=True, nogil=True)(_ordered_rows)
    _compiled_contributions_at = numba.njit(cache=True, nogil=True)(_contributions_at)
    _compiled_scaled = numba.njit(cache=True, nogil=True)(_scaled)


def scaled_values(values: np.ndarray, exponents: np.ndarray) -> np.ndarray:
    """Rows of values times ``2^-exponents`` in float64, in one walk: the product
    ``times_pow2(values.double(), -exponents)`` forms, exact and rounded once.

    ``values [R, K, d]`` float32 or float64, ``exponents [R]`` integers with ``|e| <= 1000`` (so that
    ``2^-e`` is a float64; beyond, ``torch.ldexp`` decides).

    >>> import numpy as np
    >>> scaled_values(np.array([[[3.0, -0.5]], [[0.0, 0.0]]]), np.array([2, 0])).tolist()
    [[[0.75, -0.125]], [[0.0, 0.0]]]
    """
    if _compiled_scaled is None:  # pragma: no cover
        raise RuntimeError("the compiled scaling needs numba: pip install numba, or use kernel='torch'")
    if exponents.size and int(np.abs(exponents).max()) > 1000:
        raise ValueError("scaled_values needs |exponents| <= 1000 (2^-e within float64's range)")
    out = np.empty(values.shape, dtype=np.float64)
    _compiled_scaled(values, exponents, out)
    return out


def ordered_rows(
    y: np.ndarray,
    order: np.ndarray,
    ns: np.ndarray,
    centers: np.ndarray,
    *,
    operand: np.ndarray | None = None,
    rank: np.ndarray | None = None,
) -> None:
    """Each draw's centres ``s(N)`` (and its operand, or its ranks) in one walk of its order.

    What ``gather`` then ``cumsum`` give, without the float64 ``[d, B, K]`` tensor of sorted
    contributions: the running sum starts at 0 and adds the keys in selection order, as
    ``torch.cumsum`` does, so the centres are the same numbers.

    Parameters
    ----------
    y : [R, K, d] float64
        Contributions in key order.
    order : [R, draws, K] int64
        Each draw's keys in selection order.
    ns : [G] int64
        The sizes (any order).
    centers : [B, G, d] float64, written
        ``s(N) = sum_{t < N} y[r, order[r, draw, t]]`` of batch ``b = r * draws + draw``.
    operand : [B, K, d (+1)] screen dtype, optional, written
        ``operand[b, t, :d]``: ``y`` of batch ``b`` at selection position ``t``, converted to the
        operand's dtype.
    rank : [B, K] int64, optional, written
        Each key's selection position in batch ``b`` (the inverse of its order).
    """
    if _compiled_ordered_rows is None:  # pragma: no cover
        raise RuntimeError("the fused decisions need numba: pip install numba, or use kernel='torch'")
    at = ns - 1
    operand = np.empty((0, 0, 0), dtype=np.float32) if operand is None else operand
    rank = np.empty((0, 0), dtype=np.int64) if rank is None else rank
    _compiled_ordered_rows(y, order, at, np.argsort(at, kind="stable"), operand, centers, rank)


def extremes(
    upper: np.ndarray,
    band_key: np.ndarray,
    band_sq: np.ndarray,
    sigma: np.ndarray,
    ns: np.ndarray,
    *,
    cosine: bool,
    rank: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The positions ``i*`` (largest ``M`` among ``t < N``) and ``j*`` (smallest ``P`` among ``t >= N``).

    Parameters
    ----------
    upper : [B, g, K] screen dtype (float32 or float64)
        ``P``: the screen's upper bounds, keys in selection order (or in key order, with ``rank``).
    band_key, band_sq : [R, K] screen dtype
        ``2 c ||y_t||`` and ``2 c ||y_t||^2`` (unused for the cosine distance), one row for each
        ``B / R`` consecutive batches (the draws of a row), keys in the order of ``upper``.
    sigma : [B, g] screen dtype
        ``||s(N)||``.
    ns : [g] int64
        The sizes.
    cosine : bool
        The cosine distance (``M = P``), else the Euclidean one.
    rank : [B, K] int64, optional
        With keys in key order: each key's selection position (``I_N`` = the keys of rank ``< N``).

    Returns
    -------
    i_star, j_star : [B, g] int64
        The first selection position of the extreme; ``j* = K - 1`` where ``N = K`` (no out-key).
    """
    if _compiled_extremes is None:  # pragma: no cover
        raise RuntimeError("the fused decisions need numba: pip install numba, or use kernel='torch'")
    consts = np.array([-2.0], dtype=upper.dtype)
    rank = np.empty((0, 0), dtype=np.int64) if rank is None else rank
    # float32 bounds: their extremes from their bits (one vectorised pass); else the float loop
    bits = upper.view(np.int32) if upper.dtype == np.float32 else np.empty((0, 0, 0), dtype=np.int32)
    i_star = np.empty(sigma.shape, dtype=np.int64)
    j_star = np.empty(sigma.shape, dtype=np.int64)
    _compiled_extremes(upper, bits, band_key, band_sq, sigma, ns, rank, consts, cosine, i_star, j_star)
    return i_star, j_star


def contributions_at(
    y: np.ndarray, order: np.ndarray, position: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """The contributions at selection positions ``position``: what the direct distances of the
    extremes measure, gathered in one walk (``y[r, order[r, draw, position]]``).

    Parameters
    ----------
    y : [R, K, d] float64
        Contributions in key order.
    order : [R, draws, K] int64
        Each draw's keys in selection order.
    position : [h, B, g] int64
        Selection positions (``i*`` and ``j*`` of :func:`extremes`, stacked) of batch
        ``b = r * draws + draw``.
    out : [h, B, g, d] float64, optional
        Where to write them (a reused work array), else a new array.

    Returns
    -------
    [h, B, g, d] float64
        ``out``.
    """
    if _compiled_contributions_at is None:  # pragma: no cover
        raise RuntimeError("the fused decisions need numba: pip install numba, or use kernel='torch'")
    out = np.empty((*position.shape, y.shape[-1]), dtype=y.dtype) if out is None else out
    _compiled_contributions_at(y, order, position, out)
    return out


def counts(
    upper: np.ndarray,
    band_key: np.ndarray,
    band_sq: np.ndarray,
    sigma: np.ndarray,
    ns: np.ndarray,
    thresholds: np.ndarray,
    *,
    cosine: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``K_out``, ``K_in`` and the cells the screen cannot decide, in one pass over each cell's keys
    (``M`` formed first, then the four counts as sums of ones that LLVM may reorder: exact).

    Parameters
    ----------
    upper, band_key, band_sq, sigma, ns, cosine : as for :func:`extremes` (keys in either order).
    thresholds : [4, B, g] screen dtype
        ``T - eps`` and ``T + eps`` around ``r_max``, then around ``r_min``
        (``screening`` rounds them outwards; ``+inf`` where ``N = K``).

    Returns
    -------
    k_out, k_in : [B, g] int64
        ``#{M_t < T_max + eps} - N`` and ``#{P_t < T_min - eps}`` (``N`` where ``N = K``): the
        counts, wherever the cell is decided.
    unsure : [B, g] bool
        The cells where a key other than ``i*`` (or ``j*``) lies between its two counts.
    """
    if _compiled_counts is None:  # pragma: no cover
        raise RuntimeError("the fused decisions need numba: pip install numba, or use kernel='torch'")
    consts = np.array([-2.0], dtype=upper.dtype)
    zero = np.float32(0.0) if upper.shape[-1] < 2**24 else np.float64(0.0)  # the tallies' dtype: exact
    k_out = np.empty(sigma.shape, dtype=np.int64)
    k_in = np.empty(sigma.shape, dtype=np.int64)
    unsure = np.empty(sigma.shape, dtype=np.bool_)
    _compiled_counts(upper, band_key, band_sq, sigma, ns, thresholds, consts, cosine, zero, k_out, k_in, unsure)
    return k_out, k_in, unsure


__all__ = [
    "AVAILABLE",
    "contributions_at",
    "counts",
    "extremes",
    "ordered_rows",
    "scaled_values",
]
