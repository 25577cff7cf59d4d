"""The small numerical kernels every layer shares: the accumulation dtype, exact powers of two, unit
vectors and the sink's cosines, the cosine distance and the local errors (one copy of each; merged
spreads: :mod:`tl_geometry.core.moments`).

Example: ``times_pow2(x, e)`` is ``x * 2 ** e`` rounded once, beyond float64's range of ``2 ** e`` too.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

#: Every accumulator of the package (diagnostics, taxonomy) sums in this dtype, whatever the
#: dtype of the activations.
ACC_DTYPE = torch.float64


def pow2(exponents: Tensor) -> Tensor:
    """``2 ** exponents`` in float64, exact (``inf`` / 0 beyond float64's range).

    >>> pow2(torch.tensor([-1, 0, 3])).tolist()
    [0.5, 1.0, 8.0]
    """
    return torch.ldexp(torch.ones(exponents.shape, dtype=torch.float64, device=exponents.device), exponents)


def times_pow2(x: Tensor, exponents: Tensor) -> Tensor:
    """``x * 2 ** exponents`` (broadcast), rounded once as :func:`torch.ldexp`: a product by an exact
    power of two, or ``ldexp`` itself where the power would leave float64's range.

    >>> x, e = torch.tensor([2.0**100], dtype=torch.float64), torch.tensor([-1100])
    >>> times_pow2(x, e).item() == 2.0**-1000, (x * pow2(e)).item()   # 2**-1100 itself underflows to 0
    (True, 0.0)
    """
    in_range = exponents.abs() <= 1000
    if x.device.type != "cpu":  # both, chosen per element: no device sync to ask which
        return torch.where(in_range, x * pow2(exponents), torch.ldexp(*torch.broadcast_tensors(x, exponents)))
    if bool(in_range.all()):
        return x * pow2(exponents)
    return torch.ldexp(*torch.broadcast_tensors(x, exponents))


def scale_exponents(weight_max: Tensor, value_max: Tensor, n_keys: Tensor) -> tuple[Tensor, Tensor]:
    """The powers of two that scale each row exactly (both engines and the batched route): weights
    times ``2^-weight_exp`` sum to at most 1 (``weight_exp = e(max alpha) + ceil(log2 K)``), values
    times ``2^-value_exp`` have their largest component in ``[1/2, 1)`` (``e(x)``: the binary
    exponent of :func:`torch.frexp`, ``x = m 2^e`` with ``m`` in ``[1/2, 1)``).

    >>> w, v = scale_exponents(torch.tensor([0.5]), torch.tensor([3.0]), torch.tensor([5]))
    >>> w.tolist(), v.tolist()   # 0.5 = 0.5 * 2^0 and ceil(log2 5) = 3; 3 = 0.75 * 2^2
    ([3], [2])
    """
    log_keys = torch.frexp((n_keys - 1).to(torch.float64)).exponent  # ceil(log2 K), exactly, for K >= 1
    return torch.frexp(weight_max).exponent + log_keys, torch.frexp(value_max).exponent


def unit_vectors(x: Tensor) -> Tensor:
    """``x / ||x||`` along the last axis; a zero vector stays zero (so its cosines count as 0).

    >>> unit_vectors(torch.tensor([[3.0, 4.0], [0.0, 0.0]])).tolist()
    [[0.6000000238418579, 0.800000011920929], [0.0, 0.0]]
    """
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x / norm.clamp_min(torch.finfo(x.dtype).tiny)


def sink_cosine_sums(units: Tensor) -> Tensor:
    """``sum_{j > 0} cos(v_0, v_j)`` of each set of unit vectors ``[..., K, d]`` (key 0 the sink), as
    ``<u_0, sum_{j > 0} u_j>``: one sum over the keys instead of ``K - 1`` products.

    >>> sink_cosine_sums(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])).item()
    1.0
    """
    return (units[..., 1:, :].sum(dim=-2) * units[..., 0, :]).sum(dim=-1)


def cosine_distance(dot: Tensor, norm_y: Tensor, norm_s: Tensor, eps: Tensor) -> Tensor:
    """``1 - dot / (||y|| ||s|| + eps)`` with ``eps`` at the rows' scale; 1 where the denominator is 0."""
    denominator = norm_y * norm_s + eps.to(dot.dtype)
    return 1 - torch.where(denominator > 0, dot / denominator, 0.0)


def local_errors(z: Tensor, centers: Tensor, mass: Tensor, work: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``||z - s|| / ||z||`` and ``||z - s / M_S|| / ||z||`` (definitions §7); NaN where ``z = 0``
    (and, for the second, where ``M_S = 0``).

    ``z`` and ``s`` may be scaled by one power of two (``mass`` not): the ratios are those of the
    unscaled row. ``work`` (optional; no gradients): a tensor of the shape and dtype of ``z - s``
    that holds the differences (a reused work tensor: no fresh pages), else a new one; the same
    numbers either way.
    """
    z_norm = torch.linalg.vector_norm(z, dim=-1)
    difference = z - centers if work is None else torch.sub(z, centers, out=work)
    deletion = torch.linalg.vector_norm(difference, dim=-1) / z_norm
    # numpy's shape arithmetic: torch.broadcast_shapes builds tensors (about 0.3 ms a call)
    scaled = (np.broadcast_shapes(centers.shape, mass[..., None].shape), torch.result_type(centers, mass))
    if scaled == (difference.shape, difference.dtype) and not any(x.requires_grad for x in (z, centers, mass)):
        # z + (-1 * s) / M, written over ``z - s``: the same numbers as z - s / M (the product by -1
        # and the negated quotient are exact) in one pass, and one large temporary, not three
        renormalised = torch.addcdiv(z, centers, mass[..., None], value=-1, out=difference)
    else:
        renormalised = z - centers / mass[..., None]
    renormalised = torch.linalg.vector_norm(renormalised, dim=-1) / z_norm
    nan = z_norm.new_full((), torch.nan, dtype=torch.float64)  # a fill on the device, no copy from the host
    return torch.where(z_norm > 0, deletion, nan), torch.where((z_norm > 0) & (mass > 0), renormalised, nan)
