"""Moments of ``cos(v_i, v_{i+k})`` for every lag ``k = 1..k_max`` without an ``[L, L]`` matrix.

The unit vectors of one head are cut into blocks of ``B = max(k_max, 32)`` positions. Block ``j`` against
blocks ``j`` and ``j + 1`` (one matrix product ``[B, d] x [d, 2B]``) holds every pair
``(p, p + k)`` with ``p`` in block ``j`` and ``0 <= k <= B`` exactly once; the lag-``k`` entries
are read off with a strided view (row ``i``, column ``i + k``); each row's moments (count, mean,
``M2``: :class:`~tl_geometry.core.moments.Moments`) are taken in two passes over its pairs. The cost is ``2 L B d`` per
head instead of ``L^2 d`` for a Gram matrix, and memory ``O(L B)``. With ``k_max`` close to
``L`` there is a single block, i.e. the Gram matrix (padded to twice its width).

Where numba imports, each row takes two products (block ``j`` against itself and against block
``j + 1``, no concatenated copy) and one compiled pass reads the moments and the negatives off them
(each lag's sum taken along ``p`` in turn) instead of a copy of the diagonals and a dozen tensor
passes; the two agree to rounding (``tests/diagnostics``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tl_geometry.core.compiled import AVAILABLE, use_compiled
from tl_geometry.core.moments import Moments

if AVAILABLE:  # whether numba imports is decided once, in core/compiled.py
    import numba

#: Smallest block: tiny matrix products waste more time in overhead than they save.
_MIN_BLOCK = 32

#: Largest block of products ``[rows, n_blocks, B, 2B]`` formed at once, in elements.
_MAX_ELEMENTS = 1 << 23


def lag_cosine_moments(u: Tensor, k_max: int, *, compiled: bool | None = None) -> tuple[Moments, Tensor]:
    """Per-row moments over ``p`` of ``<u_p, u_{p+k}>`` for ``k = 1..k_max``.

    Parameters
    ----------
    u : Tensor [rows, n, d]
        Unit vectors (rows are independent: sequences times heads).
    k_max : int, ``1 <= k_max <= n - 1``
    compiled : bool or None, default None
        The moments read off the products in one compiled pass (numba) or with torch. None:
        compiled where numba imports and ``u`` is a float64 CPU tensor.

    Returns
    -------
    (moments, negatives) : Moments [rows, k_max], Tensor [rows, k_max]
        The count (``n - k``), mean and ``M2`` of ``c_pk = <u_p, u_{p+k}>`` over ``p = 0..n-1-k``,
        and ``#{p : c_pk < 0}``.
    """
    # by default float64 rows only (the torch path keeps float32 products); asked for, any dtype, widened
    if use_compiled(compiled, u, float64=compiled is None):
        return _lag_moments_compiled(u, k_max)
    rows, n, d = u.shape
    block = max(k_max, _MIN_BLOCK)
    single = block >= n  # one block: the Gram matrix, padded on the right to twice its width
    if single:
        block = n
    n_blocks = -(-n // block)
    # pad to n_blocks + 1 whole blocks: zero vectors add nothing to sums and are never negative
    blocks = F.pad(u, (0, 0, 0, (n_blocks + 1) * block - n)).view(rows, n_blocks + 1, block, d)
    count = torch.zeros(rows, k_max, dtype=torch.float64)
    mean = torch.zeros(rows, k_max, dtype=torch.float64)
    m2 = torch.zeros(rows, k_max, dtype=torch.float64)
    negatives = torch.zeros(rows, k_max, dtype=torch.int64)
    step = max(1, _MAX_ELEMENTS // (n_blocks * block * 2 * block))
    for r0 in range(0, rows, step):
        x = blocks[r0 : r0 + step, :n_blocks]  # [r, nb, B, d]
        if single:
            prod = F.pad(torch.matmul(x, x.transpose(-1, -2)), (0, block))  # [r, 1, B, 2B]
        else:
            y = torch.cat([x, blocks[r0 : r0 + step, 1:]], dim=2)  # [r, nb, 2B, d]: blocks j and j+1
            prod = torch.matmul(x, y.transpose(-1, -2)).contiguous()  # [r, nb, B, 2B]
        r, nb = prod.shape[:2]
        # entry (i, k) of the view is prod[..., i, i + k]: the pair (p, p + k), p = jB + i
        strides = (nb * block * 2 * block, block * 2 * block, 2 * block + 1, 1)
        lagged = prod.as_strided((r, nb, block, block + 1), strides)
        lagged = lagged[..., 1 : k_max + 1].contiguous()  # k = 1..k_max
        # pair (p, p + k) with p = jB + i exists when p + k <= n - 1 (the rest is padding)
        first = torch.arange(nb * block).view(1, nb * block, 1)
        defined = first + torch.arange(1, k_max + 1).view(1, 1, k_max) < n  # [1, nb B, k_max]
        part = Moments.of(lagged.view(r, nb * block, k_max), dim=1, defined=defined.expand(r, -1, -1))
        count[r0 : r0 + r], mean[r0 : r0 + r], m2[r0 : r0 + r] = part.count, part.mean, part.m2
        negatives[r0 : r0 + r] = (lagged < 0).sum(dim=(1, 2))
    return Moments(count, mean, m2), negatives


def _lag_moments_compiled(u: Tensor, k_max: int) -> tuple[Moments, Tensor]:
    """:func:`lag_cosine_moments` with one row's products at a time (block ``j`` against itself and
    against block ``j + 1``: two batched products, no concatenated copy) and the moments in numba."""
    rows, n, d = u.shape
    block = min(max(k_max, _MIN_BLOCK), n)
    n_blocks = -(-n // block)
    blocks = F.pad(u.detach().to(torch.float64), (0, 0, 0, n_blocks * block - n)).view(rows, n_blocks, block, d)
    count, mean, m2 = (np.zeros((rows, k_max)) for _ in range(3))
    negatives = np.zeros((rows, k_max), dtype=np.int64)
    lagged = np.empty((max(n - 1, 1), k_max))
    for r in range(rows):
        x = blocks[r]  # [nb, B, d], contiguous
        same = torch.matmul(x, x.transpose(-1, -2))  # [nb, B, B]
        following = torch.matmul(x[:-1], x[1:].transpose(-1, -2))  # [nb - 1, B, B]
        _lag_kernel(same.numpy(), following.numpy(), n, lagged, r, count, mean, m2, negatives)
    return Moments(*(torch.from_numpy(x) for x in (count, mean, m2))), torch.from_numpy(negatives)


def _lag_moments(same, following, n, lagged, r, count, mean, m2, negatives):  # pragma: no cover - compiled
    """Row ``r`` of the outputs: ``lagged[p, k - 1] = <u_p, u_{p+k}>`` for ``p = jB + i`` read off
    ``same[j, i, i + k]`` (within block ``j``) or ``following[j, i, i + k - B]`` (in block ``j + 1``),
    then the count, the two-pass mean and ``M2`` of :meth:`Moments.of` and the negatives of each
    lag, its sums taken along ``p`` in turn."""
    block = same.shape[1]
    k_max = lagged.shape[1]
    for p in range(n - 1):
        j, i = p // block, p % block
        width = min(k_max, n - 1 - p)  # lags 1..width reach a key
        inside = min(width, block - 1 - i)  # those within block j
        for k in range(inside):
            lagged[p, k] = same[j, i, i + 1 + k]
        for k in range(inside, width):
            lagged[p, k] = following[j, i, i + 1 + k - block]
    total = np.zeros(k_max)
    for p in range(n - 1):
        for k in range(min(k_max, n - 1 - p)):
            total[k] += lagged[p, k]
            negatives[r, k] += lagged[p, k] < 0
    for k in range(k_max):
        count[r, k] = n - 1 - k
        mean[r, k] = total[k] / max(count[r, k], 1.0)
        total[k] = 0.0
    for p in range(n - 1):
        for k in range(min(k_max, n - 1 - p)):
            total[k] += lagged[p, k] - mean[r, k]
    for k in range(k_max):
        mean[r, k] = mean[r, k] + total[k] / count[r, k] if count[r, k] > 0 else 0.0
        total[k] = 0.0
    for p in range(n - 1):
        for k in range(min(k_max, n - 1 - p)):
            deviation = lagged[p, k] - mean[r, k]
            total[k] += deviation * deviation
    for k in range(k_max):
        m2[r, k] = total[k]


if AVAILABLE:
    _lag_kernel = numba.njit(cache=True, nogil=True)(_lag_moments)
