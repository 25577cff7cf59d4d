"""The stable descending order of each row's scores on the CPU, from numpy's vectorised sort.

``torch.argsort(scores, descending=True, stable=True)`` is a comparison merge sort per row. numpy's
default sort of float64 and float32 rows is a vectorised quicksort (x86-simd-sort where the CPU
has AVX-512 or AVX2), several times faster but not stable. Sorting ``-scores`` with it and then
putting each run of equal scores back in key order (a compiled pass; runs are short, usually of
one key) gives the same permutation: scores descending, ties to the lower key index.

Where every score of a call is a float32 number (attention weights of a float32 model are), one
key per score says it all: ``(2^31 - 1 - f(score)) 2^32 + k`` with ``f`` the float32's bits as an
integer in its order (``-0.0`` taken as ``0.0``). The keys are distinct, so numpy's sort of them,
without any argsort, gives the stable order in their low 32 bits: about twice as fast again.

Example: ``stable_descending(np.array([[0.1, 0.4, 0.4, 0.1]]))`` is ``[[1, 2, 0, 3]]``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

# whether numba imports: one copy, in fused.py
from tl_geometry.core.compiled import AVAILABLE

if AVAILABLE:
    import numba


def _ties_in_key_order(negated, order):  # pragma: no cover - compiled
    """Sort each run of equal ``negated[row, order[row, t]]`` (consecutive ``t``) by key index."""
    n_rows, n_keys = order.shape
    for r in range(n_rows):
        values, row = negated[r], order[r]
        start = 0
        for t in range(1, n_keys + 1):
            if t < n_keys and values[row[t]] == values[row[start]]:
                continue
            if t - start > 1:
                row[start:t].sort()
            start = t


def _float32_keys(scores, keys):  # pragma: no cover - compiled
    """``keys[r, k]``: row ``r``'s key ``k`` by its score (see the module docstring); False, with
    ``keys`` unfinished, at the first score that is not a float32 number (NaN included)."""
    n_rows, n_keys = scores.shape
    rounded = np.empty(n_keys, dtype=np.float32)
    bits = rounded.view(np.int32)
    for r in range(n_rows):
        row, out = scores[r], keys[r]
        inexact = False
        for k in range(n_keys):
            f = np.float32(row[k])
            inexact |= np.float64(f) != row[k]
            rounded[k] = f + np.float32(0.0)  # -0.0 + 0.0 is 0.0: signed zeros tie
        if inexact:
            return False
        for k in range(n_keys):
            b = np.int64(bits[k])
            ascending = b ^ ((b >> 31) & 0x7FFFFFFF)  # in [-2^31, 2^31): the float's order
            out[k] = (np.uint64(0x7FFFFFFF - ascending) << np.uint64(32)) | np.uint64(k)
    return True


_compiled_ties: Any = None
_compiled_keys: Any = None
if AVAILABLE:
    _compiled_ties = numba.njit(cache=True, nogil=True)(_ties_in_key_order)
    _compiled_keys = numba.njit(cache=True, nogil=True)(_float32_keys)


def float32_key_order(scores: np.ndarray) -> np.ndarray | None:
    """The stable descending order of each row ``[R, K]`` from one sort of 64-bit keys, or None
    where a score is not a float32 number (then :func:`stable_descending` sorts the scores).

    >>> float32_key_order(np.array([[0.5, -0.0, 0.0, np.inf]])).tolist()
    [[3, 0, 1, 2]]
    >>> float32_key_order(np.array([[0.1, 0.5]])) is None   # 0.1 is no float32
    True
    """
    if _compiled_keys is None:  # pragma: no cover
        raise RuntimeError("float32_key_order needs numba: pip install numba, or sort with torch")
    if scores.shape[-1] >= 1 << 32:  # pragma: no cover - the key index takes 32 bits
        return None
    keys = np.empty(scores.shape, dtype=np.uint64)
    if not _compiled_keys(np.ascontiguousarray(scores), keys):
        return None
    keys.sort(axis=-1)
    low = keys.view(np.uint32)[..., 0 if sys.byteorder == "little" else 1 :: 2]  # each key's low 32 bits
    return low.astype(np.int64)


def stable_descending(scores: np.ndarray) -> np.ndarray | None:
    """Each row's keys by score, highest first, ties to the lower key index (int64, same shape), or
    None where a score is NaN (then :func:`tl_geometry.core.rankings.selection_order` leaves the
    order to torch's stable sort, which decides where NaNs go).

    Parameters
    ----------
    scores : [..., K] float32 or float64, at least one element

    Returns
    -------
    [..., K] int64, or None
        What ``torch.argsort(scores, dim=-1, descending=True, stable=True)`` gives.

    >>> stable_descending(np.array([[0.1, 0.4, 0.4, 0.1], [0.0, -0.0, np.inf, -np.inf]])).tolist()
    [[1, 2, 0, 3], [2, 0, 1, 3]]
    >>> stable_descending(np.array([[0.5, np.nan]])) is None
    True
    """
    if _compiled_ties is None:  # pragma: no cover
        raise RuntimeError("stable_descending needs numba: pip install numba, or sort with torch")
    n_keys = scores.shape[-1]
    order = float32_key_order(scores.reshape(-1, n_keys))  # declines a NaN, like any non-float32 score
    if order is None:
        if np.isnan(scores).any():
            return None
        negated = np.negative(scores.reshape(-1, n_keys))  # exact: ascending -scores is descending scores
        order = np.argsort(negated, axis=-1).astype(np.int64, copy=False)
        _compiled_ties(negated, order)
    return order.reshape(scores.shape)


__all__ = ["AVAILABLE", "float32_key_order", "stable_descending"]
