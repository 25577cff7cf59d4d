"""Boundary conventions, the separation margin and the geometric inversion count (definitions §2, §10).

For one row, ``y_i = alpha_i v_i``, the top-``N`` keys ``S = I_N`` (:func:`selection_order`),
``s = sum_{i in S} y_i`` and ``D_i = ||y_i - s||`` (float64, direct)::

    rho_max = max_{i in S} D_i,   rho_min = min_{j not in S} D_j   (+inf when N = K)
    K_out   = #{j not in S: D_j <= rho_max}                          (closed, both conventions)
    K_in    = #{i in S: D_i <= rho_min}   ("paper": closed)
            = #{i in S: D_i <  rho_min}   ("followup": strict, its Appendix A.2)
    precision = N / (N + K_out),  recall = K_in / N
    gamma     = rho_min - rho_max                                    (separation margin)
    ginv      = sum_{i in S} sum_{j not in S} 1{D_j <= D_i}          (geometric inversions)

A separate, direct computation beside the engine's (:func:`~tl_geometry.core.separability.separability`,
whose counts follow "paper"): it loops over ``N`` and is meant for the sizes a study reports.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry.core.rankings import selection_order
from tl_geometry.core.sizes import resolve_ns
from tl_geometry.errors import InputError

CONVENTIONS = ("paper", "followup")


def check_convention(convention: Any) -> str:
    if convention not in CONVENTIONS:
        raise InputError(
            f"convention must be 'paper' (closed balls, definitions §2) or 'followup' (recall counts selected keys "
            f"strictly inside rho_min), got {convention!r}"
        )
    return str(convention)


def separation_margins(
    weights: Float[Tensor, "*rows key"],
    values: Float[Tensor, "*rows key d"],
    ns: Any = "log",
    convention: str = "paper",
) -> dict[str, Tensor]:
    """``precision``, ``recall``, ``gamma``, ``ginv``, ``rho_max`` and ``rho_min`` per row and size, shape ``[*rows, n]``.

    Parameters
    ----------
    weights : attention weights of each row over its visible keys.
    values : the value vectors of the same keys.
    ns : sizes ``N`` (as :func:`~tl_geometry.core.sizes.resolve_ns`: "log", "all" or a list), ``1 <= N <= K``.
    convention : "paper" or "followup" (how ``recall`` treats a selected key at ``rho_min``).

    Returns
    -------
    dict of float64 tensors, and ``"ns"`` (the sizes).
    """
    convention = check_convention(convention)
    if weights.ndim < 1 or values.shape[:-1] != weights.shape:
        raise InputError(
            f"values must be weights' shape plus one axis, got {list(values.shape)} for {list(weights.shape)}"
        )
    n_keys = weights.shape[-1]
    sizes = resolve_ns(ns, n_keys)
    w = weights.to(torch.float64)
    y = w[..., None] * values.to(torch.float64)  # [*rows, K, d]
    order = selection_order(w)
    ranked = torch.gather(y, -2, order[..., None].expand_as(y))  # contributions in selection order
    out: dict[str, list[Tensor]] = {k: [] for k in ("precision", "recall", "gamma", "ginv", "rho_max", "rho_min")}
    for n in sizes.tolist():
        s = ranked[..., :n, :].sum(-2)
        d = torch.linalg.vector_norm(ranked - s[..., None, :], dim=-1)  # [*rows, K], selection order
        inside, outside = d[..., :n], d[..., n:]
        rho_max = inside.max(-1).values
        rho_min = outside.min(-1).values if n < n_keys else torch.full_like(rho_max, float("inf"))
        k_out = (outside <= rho_max[..., None]).sum(-1)
        closed = inside <= rho_min[..., None] if convention == "paper" else inside < rho_min[..., None]
        k_in = closed.sum(-1)
        ginv = (outside[..., None, :] <= inside[..., :, None]).sum((-1, -2))
        size = torch.full_like(rho_max, float(n))  # tensor / tensor: one IEEE division, as n / (n + K_out)
        out["precision"].append(size / (size + k_out.to(torch.float64)))
        out["recall"].append(k_in.to(torch.float64) / size)
        out["gamma"].append(rho_min - rho_max)
        out["ginv"].append(ginv.to(torch.float64))
        out["rho_max"].append(rho_max)
        out["rho_min"].append(rho_min)
    result = {k: torch.stack(v, dim=-1) for k, v in out.items()}
    result["ns"] = sizes
    return result


__all__ = ["CONVENTIONS", "check_convention", "separation_margins"]
