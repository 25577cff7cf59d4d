"""Sums of ``cos(v_i, v_{i+k})`` for every lag ``k = 1..k_max`` without an ``[L, L]`` matrix.

The unit vectors of one head are cut into blocks of ``B = max(k_max, 32)`` positions. Block ``j`` against
blocks ``j`` and ``j + 1`` (one matrix product ``[B, d] x [d, 2B]``) holds every pair
``(p, p + k)`` with ``p`` in block ``j`` and ``0 <= k <= B`` exactly once; the lag-``k`` entries
are read off with a strided view (row ``i``, column ``i + k``). The cost is ``2 L B d`` per
head instead of ``L^2 d`` for a Gram matrix, and memory ``O(L B)``. With ``k_max`` close to
``L`` there is a single block, i.e. the Gram matrix (padded to twice its width).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

#: Smallest block: tiny matrix products waste more time in overhead than they save.
_MIN_BLOCK = 32

#: Largest block of products ``[rows, n_blocks, B, 2B]`` formed at once, in elements.
_MAX_ELEMENTS = 1 << 23


def lag_cosine_sums(u: Tensor, k_max: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row sums over ``p`` of ``<u_p, u_{p+k}>`` for ``k = 1..k_max``.

    Parameters
    ----------
    u : Tensor [rows, n, d]
        Unit vectors (rows are independent: sequences times heads).
    k_max : int, ``1 <= k_max <= n - 1``

    Returns
    -------
    (sums, sums_sq, negatives) : Tensors [rows, k_max]
        ``sum_p c_pk``, ``sum_p c_pk^2`` and ``#{p : c_pk < 0}`` with ``c_pk = <u_p, u_{p+k}>``
        over ``p = 0..n-1-k`` (``n - k`` pairs per row and lag).
    """
    rows, n, d = u.shape
    block = max(k_max, _MIN_BLOCK)
    single = block >= n  # one block: the Gram matrix, padded on the right to twice its width
    if single:
        block = n
    n_blocks = -(-n // block)
    # pad to n_blocks + 1 whole blocks: zero vectors add nothing to sums and are never negative
    blocks = F.pad(u, (0, 0, 0, (n_blocks + 1) * block - n)).view(rows, n_blocks + 1, block, d)
    sums = torch.zeros(rows, k_max, dtype=u.dtype)
    sums_sq = torch.zeros(rows, k_max, dtype=u.dtype)
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
        sums[r0 : r0 + r] = lagged.sum(dim=(1, 2))
        sums_sq[r0 : r0 + r] = lagged.square().sum(dim=(1, 2))
        negatives[r0 : r0 + r] = (lagged < 0).sum(dim=(1, 2))
    return sums, sums_sq, negatives
