"""The stable descending order of each row's scores on the CPU, from numpy's vectorised sort.

``torch.argsort(scores, descending=True, stable=True)`` is a comparison merge sort per row. numpy's
default sort of float64 and float32 rows is a vectorised quicksort (x86-simd-sort where the CPU
has AVX-512 or AVX2), several times faster but not stable. Sorting ``-scores`` with it and then
putting each run of equal scores back in key order (a compiled pass; runs are short, usually of
one key) gives the same permutation: scores descending, ties to the lower key index.

Example: ``stable_descending(np.array([[0.1, 0.4, 0.4, 0.1]]))`` is ``[[1, 2, 0, 3]]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# whether numba imports: one copy, in fused.py
from tl_geometry.core.fused import AVAILABLE

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


_compiled_ties: Any = None
if AVAILABLE:
    _compiled_ties = numba.njit(cache=True, nogil=True)(_ties_in_key_order)


def stable_descending(scores: np.ndarray) -> np.ndarray:
    """Each row's keys by score, highest first, ties to the lower key index (int64, same shape).

    Parameters
    ----------
    scores : [..., K] float32 or float64, no NaN, at least one element
        The scores (:func:`tl_geometry.core.rankings.selection_order` checks them; other scores
        go to torch's stable sort there).

    Returns
    -------
    [..., K] int64
        What ``torch.argsort(scores, dim=-1, descending=True, stable=True)`` gives.

    >>> stable_descending(np.array([[0.1, 0.4, 0.4, 0.1], [0.0, -0.0, np.inf, -np.inf]])).tolist()
    [[1, 2, 0, 3], [2, 0, 1, 3]]
    """
    if _compiled_ties is None:  # pragma: no cover
        raise RuntimeError("stable_descending needs numba: pip install numba, or sort with torch")
    n_keys = scores.shape[-1]
    negated = np.negative(scores.reshape(-1, n_keys))  # exact: ascending -scores is descending scores
    order = np.argsort(negated, axis=-1).astype(np.int64, copy=False)
    _compiled_ties(negated, order)
    return order.reshape(scores.shape)


__all__ = ["AVAILABLE", "stable_descending"]
