"""Least-squares fit of ``c(k) ~ exp(-beta k)`` (definitions §3, paper §3.2), vectorised over curves."""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: Search range of ``beta``. Below 1e-6 the curve is 1 over any practical lag; above 50,
#: ``exp(-beta k)`` is 0 from ``k = 1`` on (to 1e-21).
BETA_MIN, BETA_MAX = 1e-6, 50.0
_GRID = 241
_BISECTION_STEPS = 64


def fit_exponential_decay(c: Tensor, ks: Tensor) -> tuple[Tensor, Tensor]:
    """``beta`` minimising ``sum_k (c(k) - exp(-beta k))^2`` and ``mae = mean_k |c(k) - exp(-beta k)|``.

    Parameters
    ----------
    c : Tensor [rows, n_k] float64
        Mean cosine per lag (a row with a NaN gets NaN back).
    ks : Tensor [n_k]
        The lags ``k`` (positive).

    Returns
    -------
    beta, mae : Tensors [rows]

    Notes
    -----
    The fit is the nonlinear least squares of definitions §3 in ``c`` itself (not in ``log c``, which
    negative cosines would forbid), over ``beta`` in ``[1e-6, 50]``: a log-spaced grid of 241
    values finds the basin, then bisection on the sign of ``d SSE / d beta`` between the grid
    neighbours of the best value (precise to rounding, so curves that differ only by rounding,
    e.g. summed in another batch order, give the same ``beta`` to ~1e-13). ``beta`` at an end
    of the range means the optimum lies at or beyond it (e.g. ``c(k)`` is flat at 1, or is
    negative everywhere).

    A curve with ``c(1) <= 0`` gets ``beta = inf`` and ``mae = mean_k |c(k)|`` (the limit
    ``exp(-beta k) -> 0``): no decay from 1 describes a curve that is not positive at the first
    lag, and the least-squares problem is then ill-posed (its minima depend on rounding, so a
    finite ``beta`` would change with the batch size). ``inf`` marks it, the same for any batching.
    """
    c = c.to(torch.float64)
    ks = ks.to(torch.float64)

    def sse(beta: Tensor) -> Tensor:  # beta [rows, m] -> [rows, m]
        model = torch.exp(-beta[..., None] * ks)
        return (c[:, None, :] - model).square().sum(-1)

    def slope(beta: Tensor) -> Tensor:  # d SSE / d beta / 2, [rows]
        model = torch.exp(-beta[:, None] * ks)
        return ((c - model) * ks * model).sum(-1)

    grid = torch.logspace(math.log10(BETA_MIN), math.log10(BETA_MAX), _GRID, dtype=torch.float64)
    rows = c.shape[0]
    best = sse(grid.expand(rows, -1)).argmin(-1)
    lo = grid[(best - 1).clamp_min(0)]
    hi = grid[(best + 1).clamp_max(_GRID - 1)]
    # bisection on the sign of the derivative: the minimum is located to ~1e-15 relative, so a
    # curve that differs by rounding (another batch order) gives the same beta to ~1e-13
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        rising = slope(mid) > 0
        hi = torch.where(rising, mid, hi)
        lo = torch.where(rising, lo, mid)
    beta = 0.5 * (lo + hi)
    mae = (c - torch.exp(-beta[:, None] * ks)).abs().mean(-1)
    ill_posed = c[:, 0] <= 0
    beta = torch.where(ill_posed, torch.inf, beta)
    mae = torch.where(ill_posed, c.abs().mean(-1), mae)
    bad = torch.isnan(c).any(-1)
    beta = torch.where(bad, torch.nan, beta)
    mae = torch.where(bad, torch.nan, mae)
    return beta, mae
