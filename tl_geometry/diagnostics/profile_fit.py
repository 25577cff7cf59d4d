"""Fit of the piecewise attention-weight law of Assumption 3 (definitions §3, paper §3.3, Fig. 4).

Model of a profile ``alpha_0 .. alpha_{K-1}`` (``n = K - 1`` content keys)::

    alpha_0 = p_sink
    alpha_i = p_base                                   1 <= i <= T1
    alpha_i = p_base (1 + eta_osc cos(omega i))        T1 < i <= T2
    alpha_i = p_base exp(eta_exp (i - T2))             T2 < i <= n

fitted by least squares on ``log max(alpha_i, floor)``, vectorised over profiles: recency, then
oscillation, then an exact refit; a phase is kept only if it pays for itself (without one,
``T1 = T2`` and ``eta_osc = omega = NaN``, or ``T2 = n`` and ``eta_exp = NaN``). Nothing raises on
a degenerate profile: floored entries are counted in ``n_floored`` and make ``fit_ok`` False.
The stages and the threshold: docs/diagnostics.md §2 ("How the profile is fitted").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import einops
import torch
import torch.nn.functional as F
from torch import Tensor

#: Fewest keys in an oscillation phase.
MIN_OSC = 3
#: Extra margin of the phase-acceptance threshold (see the module docstring).
_MARGIN = 6.0
#: Number of ``T1`` candidates (block boundaries) of the coarse stage-2 search.
_COARSE_T1 = 64


@dataclass
class ProfileFitTensors:
    """Parameters per profile (all ``[R]``) and the fitted curve ``[R, K]`` (``alpha`` scale)."""

    p_sink: Tensor
    p_base: Tensor
    eta_osc: Tensor
    omega: Tensor
    eta_exp: Tensor
    t1: Tensor
    t2: Tensor
    fit_error: Tensor
    fit_ok: Tensor
    n_floored: Tensor
    fitted: Tensor


def fit_profiles(
    alpha: Tensor, floor: float = 1e-12, n_omega: int = 256, max_log_error: float = 1.0
) -> ProfileFitTensors:
    """Fit Assumption 3 to every row of ``alpha`` ``[R, K]`` (see the module docstring)."""
    alpha = alpha.to(torch.float64)
    rows, k = alpha.shape
    n = k - 1
    finite = torch.isfinite(alpha).all(-1)
    p_sink = alpha[:, 0].clone()
    if n < 1:
        nan = torch.full((rows,), math.nan, dtype=torch.float64)
        zero = torch.zeros(rows, dtype=torch.int64)
        return ProfileFitTensors(
            p_sink,
            nan,
            nan.clone(),
            nan.clone(),
            nan.clone(),
            zero,
            zero.clone(),
            nan.clone(),
            torch.zeros(rows, dtype=torch.bool),
            zero.clone(),
            alpha.clone(),
        )
    content = alpha[:, 1:]
    usable = torch.isfinite(content) & (content >= floor)
    n_floored = (~usable).sum(-1)
    y = torch.where(usable, content, floor).log()
    mean_y = y.mean(-1, keepdim=True)
    yc = y - mean_y  # centred: sums of squares carry no cancellation error on flat profiles
    pos = torch.arange(1, n + 1, dtype=torch.float64)
    eps = n * 1e-12

    # stage 1: T2 and the recency slope, every T2 at once (oscillation left out)
    t2, has_exp, lin = _fit_recency(yc, pos, eps)
    for attempt in range(2):
        # stage 2: T1 and omega on 1..T2
        resid = torch.where(pos <= t2[:, None], yc - lin.b[:, None], 0.0)
        t1, omega, has_osc = _fit_oscillation(resid, pos, t2, n_omega, eps)
        # stage 3: exact eta_osc, with (log p_base, eta_exp) in closed form
        osc_mask = (pos > t1[:, None]) & (pos <= t2[:, None]) & has_osc[:, None]
        cosv = torch.where(osc_mask, torch.cos(torch.where(has_osc, omega, 0.0)[:, None] * pos), 0.0)
        eta, b, e = _refit_exact(yc, pos, t2, cosv, lin)
        if attempt == 1 or not has_osc.any():
            break
        # stage 1 again, the oscillation now held: an unmodelled oscillation can pass for recency
        wave = torch.log1p(eta[:, None] * torch.cos(omega[:, None] * pos))
        osc = torch.where((pos > t1[:, None]) & has_osc[:, None], wave, 0.0)
        min_t2 = torch.where(has_osc, t1 + MIN_OSC, 1.0)
        t2_new, has_exp, lin = _fit_recency(yc, pos, eps, osc, min_t2)
        if torch.equal(t2_new, t2):
            break
        t2 = t2_new
    offset = torch.log1p(eta[:, None] * cosv)
    ramp = (pos - t2[:, None]).clamp_min(0)
    fit_y = b[:, None] + offset + e[:, None] * ramp
    fit_error = (yc - fit_y).abs().mean(-1)

    fit_ok = finite & (n_floored == 0) & torch.isfinite(fit_error) & (fit_error <= max_log_error)
    fitted = torch.cat([p_sink[:, None], (fit_y + mean_y).exp()], dim=-1)
    nan = torch.tensor(math.nan, dtype=torch.float64)
    return ProfileFitTensors(
        p_sink=p_sink,
        p_base=(b + mean_y[:, 0]).exp(),
        eta_osc=torch.where(has_osc, eta, nan),
        omega=torch.where(has_osc, omega, nan),
        eta_exp=torch.where(has_exp, e, nan),
        t1=torch.where(has_osc, t1, t2).to(torch.int64),
        t2=t2.to(torch.int64),
        fit_error=fit_error,
        fit_ok=fit_ok,
        n_floored=n_floored,
        fitted=fitted,
    )


@dataclass
class _Linear:
    """Per-profile sums of the recency design at the chosen ``T2`` (for the closed-form refit)."""

    n: int
    sx: Tensor
    sxx: Tensor
    sxy: Tensor
    det: Tensor
    has_ramp: Tensor
    b: Tensor


def _solve(
    n: int, sx: Tensor, sxx: Tensor, s1: Tensor, sxy: Tensor, det: Tensor, has_ramp: Tensor
) -> tuple[Tensor, Tensor]:
    """Least squares of ``y = b + e x`` from its sums; ``e = 0``, ``b = mean`` without a ramp."""
    safe = torch.where(has_ramp, det, 1.0)
    b = torch.where(has_ramp, (sxx * s1 - sx * sxy) / safe, s1 / n)
    e = torch.where(has_ramp, (n * sxy - sx * s1) / safe, 0.0)
    return b, e


def _fit_recency(
    yc: Tensor, pos: Tensor, eps: float, osc: Tensor | None = None, min_t2: Tensor | None = None
) -> tuple[Tensor, Tensor, _Linear]:
    """Best ``T2`` (every candidate ``1..n`` at once) of ``y = b + osc 1[i <= T2] + e (i - T2)_+``.

    ``osc`` ``[R, n]`` is a fixed oscillation offset (zero up to ``T1``), applied on ``i <= T2``
    only; ``min_t2`` ``[R]`` the smallest ``T2`` allowed for a recency phase.
    """
    rows, n = yc.shape
    t2c = pos  # candidates T2 = 1..n; T2 = n is "no recency phase"
    m = n - t2c  # keys after T2
    sx = m * (m + 1) / 2
    sxx = m * (m + 1) * (2 * m + 1) / 6
    cy = yc.cumsum(-1)
    ciy = (yc * pos).cumsum(-1)
    total = cy[:, -1:]
    suf_y = total - cy  # sum_{i > T2} y_i
    suf_iy = ciy[:, -1:] - ciy
    sxy = suf_iy - t2c * suf_y  # sum_{i > T2} (i - T2) y_i (the offset is zero there)
    syy = yc.square().sum(-1, keepdim=True)
    s1 = total.expand(-1, n)
    if osc is not None:  # w = y - osc 1[i <= T2]: sums of w and w^2 from prefix sums
        s1 = s1 - osc.cumsum(-1)
        syy = syy - 2 * (yc * osc).cumsum(-1) + osc.square().cumsum(-1)
    det = n * sxx - sx.square()
    has_ramp = (m >= 1) & (det > 0)
    b, e = _solve(n, sx, sxx, s1, sxy, det, has_ramp)
    sse = (syy - b * s1 - e * sxy).clamp_min(0)
    sse0 = sse[:, -1]
    if n >= 2:
        allowed = sse[:, :-1] if min_t2 is None else torch.where(t2c[:-1] >= min_t2[:, None], sse[:, :-1], math.inf)
        best = allowed.argmin(-1)
        sse1 = sse.gather(-1, best[:, None])[:, 0]
        gain = n * torch.log((sse0 + eps) / (sse1 + eps))
        has_exp = (gain > 2 * math.log(n - 1) + _MARGIN) & torch.isfinite(allowed.gather(-1, best[:, None])[:, 0])
    else:
        best = torch.zeros(rows, dtype=torch.int64)
        has_exp = torch.zeros(rows, dtype=torch.bool)
    idx = torch.where(has_exp, best, n - 1)
    t2 = t2c[idx]
    lin = _Linear(
        n=n,
        sx=sx[idx],
        sxx=sxx[idx],
        sxy=sxy.gather(-1, idx[:, None])[:, 0],
        det=det[idx],
        has_ramp=has_ramp[idx],
        b=b.gather(-1, idx[:, None])[:, 0],
    )
    return t2, has_exp, lin


def _osc_reduction(s_rc: Tensor, s_cc: Tensor, valid: Tensor) -> Tensor:
    ok = valid & (s_cc > 1e-9)
    return torch.where(ok, s_rc.square() / torch.where(ok, s_cc, 1.0), 0.0)


def _fit_oscillation(resid: Tensor, pos: Tensor, t2: Tensor, n_omega: int, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    rows, n = resid.shape
    # coarse search: every omega of the grid, T1 on block boundaries (block sums by matmul)
    bs = max(1, -(-n // _COARSE_T1))
    nb = -(-n // bs)
    omegas = math.pi * torch.arange(1, n_omega + 1, dtype=torch.float64) / n_omega
    cos_tab = torch.cos(omegas[:, None] * pos)  # [W, n]
    q = F.pad(cos_tab.square().cumsum(-1), (1, 0))  # [W, n+1]: q[:, t] = sum_{i<=t} cos^2
    r_blocks = einops.rearrange(F.pad(resid, (0, nb * bs - n)), "r (b j) -> b r j", j=bs)
    c_blocks = einops.rearrange(F.pad(cos_tab, (0, nb * bs - n)), "w (b j) -> b j w", j=bs)
    block_sums = torch.bmm(r_blocks, c_blocks)  # [nb, R, W]
    p = F.pad(einops.rearrange(block_sums, "b r w -> r w b").cumsum(-1), (1, 0))  # [R, W, nb+1]
    t1_grid = torch.arange(0, nb + 1, dtype=torch.int64) * bs  # T1 candidates (positions)
    t1_grid = t1_grid.clamp_max(n)
    t2i = t2.to(torch.int64)
    s_rc = p[:, :, -1:] - p  # resid is zero after T2: the sum over (T1, n] is the sum over (T1, T2]
    s_cc = q[:, t2i].T[:, :, None] - q[:, t1_grid][None]  # [R, W, nb+1]
    valid = (t2i[:, None] - t1_grid >= MIN_OSC)[:, None, :]
    red = _osc_reduction(s_rc, s_cc, valid).flatten(1)
    arg = red.argmax(-1)
    omega = omegas[arg // (nb + 1)]
    # refine: T1 at full resolution for this omega, then omega locally, twice
    for _ in range(2):
        t1, red = _best_t1(resid, pos, t2, omega)
        omega = _refine_omega(resid, pos, t1, t2, omega, 2 * math.pi / n_omega)
    t1, red = _best_t1(resid, pos, t2, omega)
    sse0 = resid.square().sum(-1)
    n_cand = t2.clamp_min(1) * n_omega
    gain = t2 * torch.log((sse0 + eps) / ((sse0 - red).clamp_min(0) + eps))
    has_osc = (red > 0) & (gain > 2 * torch.log(n_cand) + _MARGIN)
    return t1, omega, has_osc


def _refine_omega(resid: Tensor, pos: Tensor, t1: Tensor, t2: Tensor, omega: Tensor, half_width: float) -> Tensor:
    """Best ``omega`` within ``+- half_width`` for fixed ``T1, T2``.

    The model has no phase, so the reduction oscillates in ``omega`` with period about
    ``2 pi / T2`` (a small change of ``omega`` shifts the phase at ``i ~ T2`` by ``T2 d omega``):
    the first round samples 81 points (steps of ``half_width / 40``, a fraction of that
    period for ``T2 ~ n``), then three rounds of 11 points zoom in. With offsets ``delta``
    shared by every profile, ``cos((omega + delta) i) = cos(omega i) cos(delta i) -
    sin(omega i) sin(delta i)`` turns the sums over ``i`` into matrix products.
    """
    seg = (pos > t1[:, None]) & (pos <= t2[:, None])
    n_seg = seg.sum(-1, keepdim=True).double()
    width = half_width
    for points in (81, 11, 11, 11):
        delta = width * torch.linspace(-1, 1, points, dtype=torch.float64)
        angle = delta[None, :] * pos[:, None]  # [n, points]
        cd, sd, c2d, s2d = angle.cos(), angle.sin(), (2 * angle).cos(), (2 * angle).sin()
        wi = omega[:, None] * pos
        rs = torch.where(seg, resid, 0.0)
        ones = seg.double()
        s_rc = (rs * wi.cos()) @ cd - (rs * wi.sin()) @ sd  # sum r cos((omega + delta) i)
        s_cc = 0.5 * (n_seg + (ones * (2 * wi).cos()) @ c2d - (ones * (2 * wi).sin()) @ s2d)
        cand = omega[:, None] + delta
        inside = (cand > 0) & (cand <= math.pi)
        red_all = torch.where(inside, _osc_reduction(s_rc, s_cc, inside), -1.0)
        omega = cand.gather(-1, red_all.argmax(-1, keepdim=True))[:, 0]
        width = 2 * width / (points - 1)
    return omega


def _best_t1(resid: Tensor, pos: Tensor, t2: Tensor, omega: Tensor) -> tuple[Tensor, Tensor]:
    """The ``T1`` (any position) of largest reduction for fixed ``omega, T2``, and that reduction."""
    n = resid.shape[-1]
    c = torch.cos(omega[:, None] * pos)
    p = F.pad((resid * c).cumsum(-1), (1, 0))
    q = F.pad(c.square().cumsum(-1), (1, 0))
    t2i = t2.to(torch.int64)[:, None]
    t1_all = torch.arange(0, n + 1, dtype=torch.float64)
    valid = t2[:, None] - t1_all >= MIN_OSC
    red = _osc_reduction(p.gather(-1, t2i) - p, q.gather(-1, t2i) - q, valid)
    val, arg = red.max(-1)
    return t1_all[arg], val


def _refit_exact(yc: Tensor, pos: Tensor, t2: Tensor, cosv: Tensor, lin: _Linear) -> tuple[Tensor, Tensor, Tensor]:
    """Search ``eta_osc`` on ``(-1, 1)``; ``(b, e)`` in closed form for each candidate."""
    total = yc.sum(-1)
    ramp = (pos - t2[:, None]).clamp_min(0)
    has_osc = (cosv != 0).any(-1)

    def evaluate(eta: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # eta [R, m]
        off = torch.log1p(eta[:, :, None] * cosv[:, None, :])  # [R, m, n]
        s1 = total[:, None] - off.sum(-1)
        col = lambda x: x[:, None]  # noqa: E731
        b, e = _solve(lin.n, col(lin.sx), col(lin.sxx), s1, col(lin.sxy), col(lin.det), col(lin.has_ramp))
        fit = b[..., None] + off + e[..., None] * ramp[:, None, :]
        return (yc[:, None, :] - fit).square().sum(-1), b, e

    lo, hi = -0.995, 0.995
    grid = torch.linspace(lo, hi, 25, dtype=torch.float64).expand(yc.shape[0], -1)
    width = (hi - lo) / 24
    for _ in range(4):
        sse, _, _ = evaluate(grid)
        eta = grid.gather(-1, sse.argmin(-1, keepdim=True))
        grid = (eta + width * torch.linspace(-1, 1, 11, dtype=torch.float64)).clamp(lo, hi)
        width /= 5
    eta = torch.where(has_osc, eta[:, 0], 0.0)
    _, b, e = evaluate(eta[:, None])
    return eta, b[:, 0], e[:, 0]
