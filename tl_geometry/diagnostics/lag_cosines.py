"""Moments of ``cos(v_i, v_{i+k})`` for every lag ``k = 1..k_max`` without an ``[L, L]`` matrix.

The unit vectors of one head are cut into blocks of ``B = max(k_max, 32)`` positions. Block ``j`` against
blocks ``j`` and ``j + 1`` (one matrix product ``[B, d] x [d, 2B]``) holds every pair
``(p, p + k)`` with ``p`` in block ``j`` and ``0 <= k <= B`` exactly once; the lag-``k`` entries
are read off with a strided view (row ``i``, column ``i + k``); each row's moments (count, mean,
``M2``: :class:`~tl_geometry.core.moments.Moments`) are taken in two passes over its pairs. The cost is ``2 L B d`` per
head instead of ``L^2 d`` for a Gram matrix, and memory ``O(L B)``. With ``k_max`` close to
``L`` there is a single block, i.e. the Gram matrix (padded to twice its width).

Where numba imports, the moments and the negatives are read off the products in one compiled pass
per row (each lag's sum taken along ``p`` in turn) instead of a copy of the diagonals and a dozen
tensor passes; the products are the same, and the two agree to rounding (``tests/diagnostics``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tl_geometry.core.fused import AVAILABLE
from tl_geometry.core.moments import Moments
from tl_geometry.errors import InputError

if AVAILABLE:  # whether numba imports is decided once, in core/fused.py
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
    if compiled is None:
        compiled = AVAILABLE and u.device.type == "cpu" and u.dtype == torch.float64
    elif compiled and (not AVAILABLE or u.device.type != "cpu"):
        raise InputError("compiled=True needs numba and a CPU tensor; use compiled=False (torch)")
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
        if single and compiled:
            prod = torch.matmul(x, x.transpose(-1, -2))  # [r, 1, B, B]: the kernel reads columns < n only
        elif single:
            prod = F.pad(torch.matmul(x, x.transpose(-1, -2)), (0, block))  # [r, 1, B, 2B]
        else:
            y = torch.cat([x, blocks[r0 : r0 + step, 1:]], dim=2)  # [r, nb, 2B, d]: blocks j and j+1
            prod = torch.matmul(x, y.transpose(-1, -2)).contiguous()  # [r, nb, B, 2B]
        r, nb = prod.shape[:2]
        if compiled:
            outputs = (t.numpy() for t in (count, mean, m2, negatives))
            _band_kernel(prod.detach().to(torch.float64).numpy(), n, k_max, r0, *outputs)
            continue
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


def _band_moments(prod, n, k_max, r0, count, mean, m2, negatives):  # pragma: no cover - compiled
    """Rows ``r0 + r`` of the outputs from ``prod [r, nb, B, W]``: lag ``k`` of ``p = jB + i`` is
    ``prod[r, j, i, i + k]`` (``p + k < n``); the count, the two-pass mean and ``M2`` of
    :meth:`Moments.of` and the negatives, each lag's sums taken along ``p`` in turn."""
    rows, nb, block, _ = prod.shape
    total = np.empty(k_max)
    for r in range(rows):
        out = r0 + r
        for k in range(k_max):
            count[out, k] = n - 1 - k
            total[k] = 0.0
        for j in range(nb):
            for i in range(block):
                band = prod[r, j, i, i + 1 :]
                for k in range(min(k_max, n - 1 - j * block - i)):
                    total[k] += band[k]
                    negatives[out, k] += band[k] < 0
        for k in range(k_max):
            mean[out, k] = total[k] / max(count[out, k], 1.0)
            total[k] = 0.0
        for j in range(nb):
            for i in range(block):
                band = prod[r, j, i, i + 1 :]
                for k in range(min(k_max, n - 1 - j * block - i)):
                    total[k] += band[k] - mean[out, k]
        for k in range(k_max):
            mean[out, k] = mean[out, k] + total[k] / count[out, k] if count[out, k] > 0 else 0.0
            total[k] = 0.0
        for j in range(nb):
            for i in range(block):
                band = prod[r, j, i, i + 1 :]
                for k in range(min(k_max, n - 1 - j * block - i)):
                    deviation = band[k] - mean[out, k]
                    total[k] += deviation * deviation
        for k in range(k_max):
            m2[out, k] = total[k]


if AVAILABLE:
    _band_kernel = numba.njit(cache=True, nogil=True)(_band_moments)
