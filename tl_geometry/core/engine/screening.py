"""Exact top-N counts and radii from a float32 screen (definitions §2, §7).

For every row, draw and size ``N``: ``r_max = max_{i in I_N} D_i``, ``r_min = min_{j not in I_N} D_j``,
``K_out = #{j not in I_N: D_j <= r_max}`` and ``K_in = #{i in I_N: D_i <= r_min}``, with ``D`` the
float64 distance. One float32 matrix product per block screens ``E_t = ||y_t||^2 - 2 <y_t, s>``
with a rounding band per key and size; every key too close to call is decided again from direct
float64 distances, so the counts are those of the float64 definition. The derivation of the bands
and decisions: docs/engine.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import einops
import torch
from torch import Tensor

from tl_geometry.core.engine import fused_rows
from tl_geometry.core.numerics import cosine_distance
from tl_geometry.runtime.workspace import WORKSPACE

#: Unit roundoff of the float64 direct distances.
_U64 = 2.0**-53
#: The screen's dtype: fast on CPUs and GPUs; the decisions do not depend on it.
SCREEN_DTYPE = torch.float32
#: Smallest cosine constant (at the rows' scale) for which the float32 cosine screen's bound holds
#: (float32 products of tiny norms underflow); below it the cosine screen runs in float64.
_MIN_COSINE_EPS = 2.0**-100
#: Largest float64 working set (bytes) of one chunk of the whole-cell recomputation.
_DIRECT_CHUNK_BYTES = 8 << 20
#: Width of the chunks of the two-level arg-max (a multiple of the vector width).
_ARG_CHUNK = 64
_GROUP_SPLIT = 4


@dataclass(frozen=True)
class Decided:
    """Counts and radii ``[B, G]`` (``B`` = rows x draws, row-major): ``k_out``, ``k_in`` (int64),
    ``r_max``, ``r_min`` (float64, at the rows' scale); the centres ``s(N)`` [B, G, d] (float64);
    how many cells needed direct distances."""

    k_out: Tensor
    k_in: Tensor
    r_max: Tensor
    r_min: Tensor
    centers: Tensor
    n_direct: int


def direct_distances(y: Tensor, s: Tensor, distance: str, eps: Tensor, overwrite: bool = False) -> Tensor:
    """Float64 distances of keys ``y`` [c, d] from centres ``s`` [c, d] (pairwise by row): [c].
    (Euclidean: any shapes that broadcast to ``y``'s, ``[..., d]`` -> ``[...]``.)

    The definitions' formulas, as the loop reference computes them: ``||y - s||``, or
    ``1 - <y, s> / (||y|| ||s|| + eps)`` with ``eps`` [c] the cosine constant at the rows' scale.
    With ``overwrite`` (Euclidean), ``y - s`` is written over ``y`` (a work tensor): the same numbers.
    """
    if distance == "euclidean":
        return torch.linalg.vector_norm(torch.sub(y, s, out=y) if overwrite else y - s, dim=-1)
    dot = einops.einsum(y, s, "c d, c d -> c")
    return cosine_distance(dot, torch.linalg.vector_norm(y, dim=-1), torch.linalg.vector_norm(s, dim=-1), eps)


def decide(
    y: Tensor,
    order: Tensor,
    ns: Tensor,
    distance: str,
    eps: Tensor,
    block_bytes: int,
    screen: torch.dtype | None = None,
    kernel: str = "torch",
) -> Decided:
    """``K_out``, ``K_in``, ``r_max``, ``r_min`` and ``s(N)`` of every row, draw and size.

    Parameters
    ----------
    y : [r, K, d] float64
        Contributions in key order.
    order : [r, draws, K] int64
        Each draw's keys in selection order (``I_N = order[..., :N]``).
    ns : [G] int64
        The sizes.
    distance : "euclidean" or "cosine"
    eps : [r] float64
        The cosine constant at each row's scale (unused for the Euclidean distance).
    block_bytes : int
        Size of one ``[B, sizes, K]`` screen block.
    screen : torch.dtype, optional
        The screen's dtype: :data:`SCREEN_DTYPE` by default (float64 where the cosine constant is
        too small for float32); another dtype only to check the decisions.
    kernel : "numba" or "torch", default "torch"
        ``"numba"``: the decisions of every cell in two compiled passes over the screen
        (:mod:`tl_geometry.core.engine.fused_rows`; CPU, float32 or float64 screens, else torch);
        ``"torch"``: tensor passes. The counts and radii are the same.
    """
    n_rows, n_draws, n_keys = order.shape
    eps = eps.repeat_interleave(n_draws)
    if screen is None:
        tiny = distance == "cosine" and bool((eps < _MIN_COSINE_EPS).any())
        screen = torch.float64 if tiny else SCREEN_DTYPE
    if (y.shape[-1] + 16) * torch.finfo(screen).eps / 2 > 0.1:  # the band (d + 16) u must stay small
        raise ValueError(f"a {screen} screen is too coarse for d = {y.shape[-1]}: its rounding bound does not hold")
    fused = kernel == "numba" and y.device.type == "cpu" and screen in (torch.float32, torch.float64)
    keys = _Keys.of(y, order, ns, distance, screen, fused)
    n_batch = keys.centers.shape[0]
    size_block = balanced_block(ns.shape[0], max(1, block_bytes // (n_batch * n_keys * torch.finfo(screen).bits // 8)))
    out = {name: torch.empty(n_batch, ns.shape[0], dtype=dtype, device=ns.device) for name, dtype in _RESULTS.items()}
    sigma = torch.empty(n_batch, ns.shape[0], dtype=keys.centers.dtype, device=ns.device)
    ranks = torch.argsort(ns, stable=True)  # sizes by value, so that a block's in-keys are a short prefix
    in_order = bool((ranks == torch.arange(ns.shape[0], device=ns.device)).all())
    unsure: list[_Cells] = []
    for g0 in range(0, ns.shape[0], size_block):
        sizes: slice | Tensor = slice(g0, g0 + size_block) if in_order else ranks[g0 : g0 + size_block]
        part, cells = _decide_sizes(keys, keys.centers[:, sizes], ns[sizes], eps, fused)
        for name in _RESULTS:
            out[name][:, sizes] = getattr(part, name)
        sigma[:, sizes] = part.sigma
        if cells is not None:  # block-local sizes -> the call's
            size = cells.size + g0 if in_order else ranks[g0 : g0 + size_block][cells.size]
            unsure.append(_Cells(cells.batch, size, cells.upper, cells.lower, cells.n))
    n_direct = sum(cells.batch.shape[0] for cells in unsure)
    if unsure:  # the cells no block could decide, all at once (the per-call overhead once per call)
        every = _Cells(*(torch.cat(x) for x in zip(*((c.batch, c.size, c.upper, c.lower, c.n) for c in unsure))))
        undecided = _refine(
            keys, keys.centers, sigma, eps, every, out["k_out"], out["k_in"], out["r_max"], out["r_min"]
        )
        if bool(undecided.any()):
            batch, size = every.batch[undecided], every.size[undecided]
            _recompute(keys, keys.centers, ns, eps, batch, size, out["k_out"], out["k_in"], out["r_max"], out["r_min"])
    return Decided(**out, centers=keys.centers, n_direct=n_direct)


def balanced_block(total: int, most: int) -> int:
    """The block size that splits ``total`` items into as few blocks of at most ``most`` as can be, evenly."""
    return -(-total // -(-total // most))


_RESULTS = {"k_out": torch.int64, "k_in": torch.int64, "r_max": torch.float64, "r_min": torch.float64}


@dataclass(frozen=True)
class _Keys:
    """A block of rows and draws in selection order, ready to screen.

    ``y`` [r, K, d] and ``order`` [r, draws, K] as given; ``centers`` [B, G, d] float64; the
    screen's operand [B, d (+2), K] (the contributions in selection order, feature-major, and for
    the Euclidean distance the band row ``2 c ||y_t||`` and the bias row); ``bias`` [B, 1, K]
    (``(1 + c) ||y_t||^2``, or ``||y_t||`` for the cosine); ``band_key``, ``band_sq`` [B, 1, K]
    (``2 c ||y_t||``, ``2 c ||y_t||^2``).

    With ``rank`` ([B, K], each key's selection position: the compiled kernel's draws) the keys
    stay in key order and the draws of a row share its operand, bias and bands ([r, ...]): one
    product of all the draws' centres against the row's keys.
    """

    y: Tensor
    order: Tensor
    centers: Tensor
    distance: str
    screen: torch.dtype
    coef: float  # the band's relative coefficient c (Euclidean) or the constant band (cosine)
    operand: Tensor
    bias: Tensor
    band_key: Tensor
    band_sq: Tensor
    rank: Tensor | None = None

    @classmethod
    def of(cls, y: Tensor, order: Tensor, ns: Tensor, distance: str, screen: torch.dtype, fused: bool) -> "_Keys":
        n_rows, n_draws, n_keys = order.shape
        dim, n_batch, device = y.shape[-1], n_rows * n_draws, y.device
        euclidean = distance == "euclidean"
        unit = torch.finfo(screen).eps / 2
        coef = (dim + 16) * unit + (2 * dim + 24) * _U64
        key_sq = einops.einsum(y, y, "r k d, r k d -> r k")
        if fused and n_draws > 1:  # the draws share their row's keys, in key order
            centers = torch.empty(n_batch, ns.shape[0], dim, dtype=y.dtype, device=device)
            rank = torch.empty(n_batch, n_keys, dtype=torch.int64, device=device)
            y_np, order_np = y.contiguous().numpy(), order.contiguous().numpy()
            fused_rows.ordered_rows(y_np, order_np, ns.numpy(), centers.numpy(), rank=rank.numpy())
            operand = WORKSPACE.get("operand", (n_rows, dim + 2 * int(euclidean), n_keys), screen, device)
            operand[:, :dim] = einops.rearrange(y, "r k d -> r d k")
            bias, band_key, band_sq = _bands(key_sq[:, None, :], coef, screen, euclidean)
            if euclidean:
                operand[:, dim], operand[:, dim + 1] = band_key[:, 0], bias[:, 0]
            return cls(y, order, centers, distance, screen, coef, operand, bias, band_key, band_sq, rank)
        if fused:  # one compiled walk of each order: the operand (key-major) and the centres
            operand = WORKSPACE.get("operand", (n_batch, n_keys, dim + 2 * int(euclidean)), screen, device)
            centers = torch.empty(n_batch, ns.shape[0], dim, dtype=y.dtype, device=device)
            y_np, order_np = y.contiguous().numpy(), order.contiguous().numpy()
            fused_rows.ordered_rows(y_np, order_np, ns.numpy(), centers.numpy(), operand=operand.numpy())
            operand = einops.rearrange(operand, "b k d -> d b k")  # a view, as the torch path's layout
        else:
            operand = WORKSPACE.get("operand", (dim + 2 * int(euclidean), n_batch, n_keys), screen, device)
            # the contributions in selection order, feature-major [d, B, K]: a fast running sum along K
            # (2-D transposes: much faster than a copy of the permuted 3-D tensor)
            source = y.reshape(-1, dim).t().contiguous().view(dim, n_rows, 1, n_keys)
            ordered = WORKSPACE.get("ordered", (dim, n_rows, n_draws, n_keys), y.dtype, device)
            torch.gather(source.expand(dim, -1, n_draws, -1), -1, order[None].expand(dim, -1, -1, -1), out=ordered)
            ordered = ordered.view(dim, n_batch, n_keys)
            operand[:dim] = ordered
            centers = ordered.cumsum_(dim=-1)[..., ns - 1].reshape(dim, -1).t().contiguous().view(n_batch, -1, dim)
        sq = torch.gather(key_sq[:, None, :].expand_as(order), -1, order).view(n_batch, 1, n_keys)
        bias, band_key, band_sq = _bands(sq, coef, screen, euclidean)
        if euclidean:
            operand[dim], operand[dim + 1] = band_key[:, 0], bias[:, 0]
        operand = einops.rearrange(operand, "d b k -> b d k")
        return cls(y, order, centers, distance, screen, coef, operand, bias, band_key, band_sq)

    def at(self, batch: Tensor, position: Tensor, out: Tensor | None = None) -> Tensor:
        """Contributions [c, d] at selection positions ``position`` [c] of batches ``batch`` [c]
        (written into ``out`` [c, d], a work tensor, if given)."""
        n_draws = self.order.shape[1]
        row = torch.div(batch, n_draws, rounding_mode="floor")
        key = self.order[row, batch % n_draws, position]
        if out is None:
            return self.y[row, key]
        n_keys, dim = self.y.shape[1:]
        return torch.index_select(self.y.reshape(-1, dim), 0, row * n_keys + key, out=out)

    def rows(self, batch: Tensor, out: Tensor | None = None) -> Tensor:
        """All contributions of batches ``batch`` [c] in selection order: [c, K, d] (written into
        ``out``, a work tensor, if given)."""
        n_draws = self.order.shape[1]
        row = torch.div(batch, n_draws, rounding_mode="floor")
        key = self.order[row, batch % n_draws]
        if out is None:
            return self.y[row[:, None], key]
        n_keys, dim = self.y.shape[1:]
        flat = (row[:, None] * n_keys + key).view(-1)
        return torch.index_select(self.y.reshape(-1, dim), 0, flat, out=out.view(-1, dim)).view(out.shape)


def _bands(sq: Tensor, coef: float, screen: torch.dtype, euclidean: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``bias``, ``band_key``, ``band_sq`` of :class:`_Keys` in the screen's dtype from the keys'
    ``||y_t||^2`` (float64): ``(1 + c) ||y_t||^2``, ``2 c ||y_t||``, ``2 c ||y_t||^2`` (Euclidean), or
    ``||y_t||`` for all three (cosine: a constant band, folded into the thresholds)."""
    if not euclidean:
        norm = sq.sqrt().to(screen)
        return norm, norm, norm
    return ((1 + coef) * sq).to(screen), (2 * coef * sq.sqrt()).to(screen), (2 * coef * sq).to(screen)


@dataclass(frozen=True)
class _Block:
    """The screen's decisions for one block of sizes, before the unsure cells are re-checked
    (``k_out``, ``k_in``, ``r_max``, ``r_min`` [B, g]) and the centres' norms ``sigma`` [B, g]."""

    k_out: Tensor
    k_in: Tensor
    r_max: Tensor
    r_min: Tensor
    sigma: Tensor


def _decide_sizes(keys: _Keys, s: Tensor, ns: Tensor, eps: Tensor, fused: bool) -> tuple[_Block, "_Cells | None"]:
    """The decisions for one block of sizes (``ns`` [g] increasing): ``s`` [B, g, d] float64; the
    cells the screen leaves unsure (block-local sizes, their bounds in selection order), or None."""
    sigma = torch.linalg.vector_norm(s, dim=-1)  # [B, g] float64
    upper = _upper(keys, s, sigma, eps)  # P [B, g, K]
    if fused:
        k_out, k_in, r_max, r_min, unsure = _decide_fused(keys, s, sigma, eps, upper, ns)
    else:
        lower = _lower(keys, upper, sigma)  # M [B, g, K] (the same tensor for the cosine)
        parts = [_decide_group(keys, s, sigma, eps, upper, lower, ns, a, b) for a, b in _groups(ns, upper.shape[-1])]
        k_out, k_in, r_max, r_min, unsure = (torch.cat(x, dim=-1) for x in zip(*parts))
    block = _Block(k_out, k_in, r_max, r_min, sigma)
    if not bool(unsure.any()):
        return block, None
    batch, size = unsure.nonzero(as_tuple=True)
    cell_upper = upper[batch, size]  # a copy: the work tensor is reused by the next block
    cell_lower = lower[batch, size] if not fused else _lower(keys, cell_upper, sigma[batch, size], batch)
    if keys.rank is not None:  # key order -> selection order
        position = keys.order.view(-1, keys.order.shape[-1])[batch]
        cell_upper, cell_lower = cell_upper.gather(-1, position), cell_lower.gather(-1, position)
    return block, _Cells(batch, size, cell_upper, cell_lower, ns[size])


def _groups(ns: Tensor, n_keys: int) -> list[tuple[int, int]]:
    """Ranges ``[a, b)`` of the (increasing) sizes over which ``N`` grows by at most ``K / 4``."""
    values, starts = ns.tolist(), [0]
    for i, n in enumerate(values):
        if n - values[starts[-1]] > n_keys // _GROUP_SPLIT:
            starts.append(i)
    return list(zip(starts, starts[1:] + [len(values)]))


def _decide_group(
    keys: _Keys, s: Tensor, sigma: Tensor, eps: Tensor, upper: Tensor, lower: Tensor, ns: Tensor, a: int, b: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``K_out``, ``K_in``, ``r_max``, ``r_min`` and the cells left unsure, for the sizes ``a:b`` of a block.

    Only the positions that can matter are counted. With ``n_lo``, ``n_hi`` the group's smallest
    and largest ``N``: the keys ``t < n_lo`` are in-keys of every size, surely nearer than
    ``r_max`` or ambiguous (never surely farther), so ``K_out`` is counted over ``t >= n_lo`` once
    their largest ``P`` (``i*`` left out) shows that none but ``i*`` is ambiguous; the keys
    ``t >= n_hi`` are out-keys, never surely nearer than ``r_min``, so ``K_in`` is counted over
    ``t < n_hi`` once their smallest ``M`` (``j*`` left out) shows that none but ``j*`` is.
    """
    n_keys = upper.shape[-1]
    group, sizes = ns[a:b], slice(a, b)
    n_lo, n_hi = int(group[0]), int(group[-1])
    p, m, s, sigma = upper[:, sizes], lower[:, sizes], s[:, sizes], sigma[:, sizes]
    full = group == n_keys  # no out-key: r_min = inf, K_in = N
    # i*: the in-key (t < N) of largest M; j*: the out-key (t >= N) of smallest P
    stop = min(n_keys, _round_up(n_hi, _ARG_CHUNK))
    i_star = _arg_masked(m[..., :stop], group, 0, largest=True)
    if n_lo < n_keys:
        start = max(0, n_keys - _round_up(n_keys - n_lo, _ARG_CHUNK))
        j_star = _arg_masked(p[..., start:], group, start, largest=False)
    else:
        j_star = torch.zeros_like(i_star)
    r_max, r_min = _at(keys, torch.cat([s, s], dim=1), torch.cat([i_star, j_star], dim=-1), eps).chunk(2, dim=-1)
    r_min = torch.where(full, torch.inf, r_min)
    lo, hi = _thresholds(keys, torch.cat([r_max, r_min], dim=-1), torch.cat([sigma, sigma], dim=-1))
    (lo, lo_inner), (hi, hi_inner) = lo.chunk(2, dim=-1), hi.chunk(2, dim=-1)
    lo_max = n_lo - (i_star < n_lo).to(torch.int64) + _count_below(p[..., n_lo:], lo)
    hi_max = n_lo + _count_below(m[..., n_lo:], hi)
    unsure = hi_max - lo_max != 1
    if n_lo > 0:  # the keys t < n_lo but i*: surely nearer than r_max unless their P says otherwise
        unsure |= _extreme_but(p[..., :n_lo], i_star, largest=True) >= lo
    lo, hi = lo_inner, hi_inner
    lo_min = _count_below(p[..., :n_hi], lo)
    hi_min = (j_star >= n_hi).to(torch.int64) + _count_below(m[..., :n_hi], hi)
    unsure_min = hi_min - lo_min != 1
    if n_hi < n_keys:  # the keys t >= n_hi but j*: surely farther than r_min unless their M says otherwise
        unsure_min |= _extreme_but(m[..., n_hi:], j_star - n_hi, largest=False) <= hi
    n = group.expand_as(r_max)
    return hi_max - n, torch.where(full, n, lo_min), r_max, r_min, unsure | (unsure_min & ~full)


def _extreme_but(values: Tensor, position: Tensor, largest: bool) -> Tensor:
    """Largest (or smallest) of ``values`` [B, g, L] over the last dimension leaving out the position
    ``position`` [B, g] (ignored where outside ``0..L-1``): [B, g]. The value there is set aside
    and put back, so ``values`` is unchanged on return."""
    inside = (position >= 0) & (position < values.shape[-1])
    index = torch.where(inside, position, 0)[..., None]
    kept = values.gather(-1, index)
    fill = torch.where(inside[..., None], -torch.inf if largest else torch.inf, kept)
    values.scatter_(-1, index, fill)
    extreme = values.amax(dim=-1) if largest else values.amin(dim=-1)
    values.scatter_(-1, index, kept)
    return extreme


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _upper(keys: _Keys, s: Tensor, sigma: Tensor, eps: Tensor) -> Tensor:
    """The upper bounds ``P`` [B, g, K] of every key's screen value (a work tensor)."""
    shape = (s.shape[0], s.shape[1], keys.operand.shape[-1])
    upper = WORKSPACE.get("upper", shape, keys.screen, s.device)
    # [r, draws x g, ...] where the draws share their row's operand (keys.rank), else [B, g, ...]
    n_operands = keys.operand.shape[0]
    per_operand = upper.view(n_operands, -1, shape[-1])
    if keys.distance == "euclidean":
        # against the operand's rows y, 2 c ||y|| and (1 + c) ||y||^2: E + c ||y||^2 + 2 c ||y|| ||s||
        # (the bias as one more term of the product: baddbmm's broadcast bias took a third longer)
        one = torch.ones_like(sigma, dtype=keys.screen)[..., None]
        s_screen = torch.cat([(-2 * s).to(keys.screen), sigma.to(keys.screen)[..., None], one], dim=-1)
        torch.bmm(s_screen.view(n_operands, -1, s_screen.shape[-1]), keys.operand, out=per_operand)
        return upper
    torch.bmm((-s).to(keys.screen).view(n_operands, -1, s.shape[-1]), keys.operand, out=per_operand)  # -<y, s>
    norm = sigma.to(keys.screen).view(n_operands, -1)[..., None]
    constant = eps.to(keys.screen)[:, None].expand_as(sigma).reshape(n_operands, -1)[..., None]
    denominator = torch.addcmul(constant, norm, keys.bias)
    # the cosine distance - 1 (0 where the denominator is 0)
    per_operand.div_(torch.where(denominator > 0, denominator, 1.0))
    return upper


def _lower(keys: _Keys, upper: Tensor, sigma: Tensor, batch: Tensor | None = None) -> Tensor:
    """The lower bounds ``M`` of the screen values ``upper`` ([B, g, K], or [c, K] of the batches
    ``batch`` [c] with ``sigma`` [c]): ``upper`` itself for the cosine distance."""
    if keys.distance != "euclidean":
        return upper
    band_key, band_sq = keys.band_key, keys.band_sq  # [B, 1, K]
    if batch is None:
        lower = WORKSPACE.get("lower", tuple(upper.shape), keys.screen, upper.device)
        torch.addcmul(upper, sigma.to(keys.screen)[..., None], band_key, value=-2, out=lower)
        return lower.sub_(band_sq)  # E - c ||y||^2 - 2 c ||y|| ||s||
    row = batch if keys.rank is None else torch.div(batch, keys.order.shape[1], rounding_mode="floor")
    lower = torch.addcmul(upper, sigma.to(keys.screen)[..., None], band_key[row, 0], value=-2)
    return lower.sub_(band_sq[row, 0])


def _decide_fused(
    keys: _Keys, s: Tensor, sigma: Tensor, eps: Tensor, upper: Tensor, ns: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """:func:`_decide_group` for every size of the block at once, in the compiled passes of
    :mod:`tl_geometry.core.engine.fused_rows` (the same decisions; the direct distances and thresholds
    between the two passes in torch, as the torch path forms them)."""
    n_keys = upper.shape[-1]
    cosine = keys.distance != "euclidean"
    p = upper.numpy()
    band_key, band_sq = keys.band_key[:, 0].numpy(), keys.band_sq[:, 0].numpy()
    sigma_screen, sizes = sigma.to(keys.screen).numpy(), ns.contiguous().numpy()
    rank = None if keys.rank is None else keys.rank.numpy()
    i_star, j_star = (
        torch.from_numpy(x)
        for x in fused_rows.extremes(p, band_key, band_sq, sigma_screen, sizes, cosine=cosine, rank=rank)
    )
    r_max, r_min = _extreme_distances(keys, s, torch.stack([i_star, j_star]), eps)
    r_min = torch.where(ns == n_keys, torch.inf, r_min)
    lo, hi = _thresholds(keys, torch.cat([r_max, r_min], dim=-1), torch.cat([sigma, sigma], dim=-1))
    (lo_max, lo_min), (hi_max, hi_min) = lo.chunk(2, dim=-1), hi.chunk(2, dim=-1)
    thresholds = torch.stack([lo_max, hi_max, lo_min, hi_min]).numpy()
    k_out, k_in, unsure = fused_rows.counts(p, band_key, band_sq, sigma_screen, sizes, thresholds, cosine=cosine)
    return torch.from_numpy(k_out), torch.from_numpy(k_in), r_max, r_min, torch.from_numpy(unsure)


def _arg_masked(values: Tensor, group: Tensor, start: int, largest: bool) -> Tensor:
    """Position of the largest of ``values`` [B, g, L] (positions ``start..start+L-1``) among
    ``t < N`` (``largest``), or of the smallest among ``t >= N``, for each size ``N`` of ``group``
    [g]: [B, g]. Where no position qualifies (``N = K``, smallest) the result is arbitrary."""
    position = torch.arange(start, start + values.shape[-1], device=values.device)
    if largest:
        mask = torch.where(position < group[:, None], 0.0, -torch.inf).to(values.dtype)
    else:
        mask = torch.where(position >= group[:, None], 0.0, torch.inf).to(values.dtype)
    work = WORKSPACE.get("arg", tuple(values.shape), values.dtype, values.device)
    return _arg(torch.add(values, mask, out=work), largest) + start


def _arg(values: Tensor, largest: bool) -> Tensor:
    """``values.argmax(-1)`` (or ``argmin``), through chunks where the length allows: a fast
    ``amax`` per chunk, then the arg-max of the chunks and within the best one (the same index)."""
    length = values.shape[-1]
    if length % _ARG_CHUNK or length == _ARG_CHUNK:
        return values.argmax(dim=-1) if largest else values.argmin(dim=-1)
    chunks = values.view(*values.shape[:-1], length // _ARG_CHUNK, _ARG_CHUNK)
    if largest:
        best = chunks.amax(dim=-1).argmax(dim=-1)  # the first chunk holding the maximum
    else:
        best = chunks.amin(dim=-1).argmin(dim=-1)
    within = torch.gather(chunks, -2, best[..., None, None].expand(*best.shape, 1, _ARG_CHUNK))[..., 0, :]
    return best * _ARG_CHUNK + (within.argmax(dim=-1) if largest else within.argmin(dim=-1))


def _at(keys: _Keys, s: Tensor, position: Tensor, eps: Tensor) -> Tensor:
    """Direct float64 distance of the key at ``position[b, g]`` from ``s[b, g]``: [B, g]."""
    n_batch, n_sizes = position.shape
    batch = torch.arange(n_batch, device=position.device)[:, None].expand_as(position).reshape(-1)
    y = keys.at(batch, position.reshape(-1))
    return direct_distances(y, s.reshape(-1, s.shape[-1]), keys.distance, eps[batch]).view(position.shape)


def _extreme_distances(keys: _Keys, s: Tensor, position: Tensor, eps: Tensor) -> Tensor:
    """:func:`_at` of the positions ``position`` [2, B, g] (``i*`` and ``j*``): [2, B, g], the
    contributions gathered in one compiled walk and measured in one call (the same numbers)."""
    y = WORKSPACE.get("extreme_keys", (*position.shape, s.shape[-1]), keys.y.dtype, s.device)
    fused_rows.contributions_at(
        keys.y.contiguous().numpy(), keys.order.contiguous().numpy(), position.numpy(), out=y.numpy()
    )
    if keys.distance == "euclidean":  # ||y - s||, s broadcast over i* and j*: no copy of the centres
        return direct_distances(y, s, keys.distance, eps, overwrite=True)
    dim, shape = s.shape[-1], position.shape
    return direct_distances(
        y.view(-1, dim),
        s.expand(*y.shape).reshape(-1, dim),
        keys.distance,
        eps[None, :, None].expand(shape).reshape(-1),
    ).view(shape)


def _thresholds(keys: _Keys, radius: Tensor, sigma: Tensor) -> tuple[Tensor, Tensor]:
    """``T - eps`` and ``T + eps`` for the radius ``radius`` [B, g], rounded outwards to the screen's dtype.

    ``T`` is ``radius`` in screen units. The float64 rounding of a direct distance is at most
    ``(d + 7) u (||y|| + ||s||)^2`` in screen units: its ``||y||^2 + 2 ||y|| ||s||`` part is in the
    key's band (``c`` holds ``(2 d + 24) u``), its ``||s||^2`` part in ``eps``, with the rounding
    of ``T`` itself (``(d + 8) u (r^2 + ||s||^2)``) and the float32 underflow of tiny contributions
    (``2^-120``), with room to spare, so that a key at ``T - eps`` or ``T + eps`` exactly is still
    decided. An infinite radius gives infinite thresholds (every key counts).
    """
    if keys.distance == "euclidean":
        threshold = radius * radius - sigma * sigma
        square = torch.where(torch.isinf(radius), 0.0, radius * radius) + 2 * sigma * sigma
        margin = (2 * (keys.y.shape[-1] + 1) + 24) * _U64 * square + 2.0**-120
    else:
        threshold = radius - 1
        margin = torch.full_like(radius, keys.coef)
    return _round(threshold - margin, keys.screen, down=True), _round(threshold + margin, keys.screen, down=False)


def _round(x: Tensor, dtype: torch.dtype, down: bool) -> Tensor:
    """``x`` (float64) in ``dtype``, rounded down (or up) so that comparisons stay on the safe side."""
    if dtype == torch.float64:
        return x
    rounded = x.to(dtype)
    wrong = rounded.double() > x if down else rounded.double() < x
    toward = torch.full_like(rounded, -torch.inf if down else torch.inf)
    return torch.where(wrong, torch.nextafter(rounded, toward), rounded)


def _count_below(values: Tensor, threshold: Tensor) -> Tensor:
    """``#{t: values[b, g, t] < threshold[b, g]}`` as int64 [B, g], up to the keys equal to it.

    Counted from the sign bit of ``values - threshold`` (one subtraction, a shift and an integer
    sum: much faster on CPUs than a boolean comparison): a value equal to the threshold may or may
    not count (``-0.0``), which the margins of :func:`_thresholds` make harmless. A threshold of
    ``+inf`` counts every (finite) value.
    """
    difference = WORKSPACE.get("difference", tuple(values.shape), values.dtype, values.device)
    torch.sub(values, threshold[..., None], out=difference)
    bits = _SAME_WIDTH_INT[values.dtype]
    negative = difference.view(bits).bitwise_right_shift_(torch.iinfo(bits).bits - 1)  # -1 where the sign bit is set
    return -negative.sum(dim=-1, dtype=torch.int64 if bits == torch.int64 else torch.int32).to(torch.int64)


_SAME_WIDTH_INT = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


@dataclass(frozen=True)
class _Cells:
    """Some cells ``(batch, size)`` [c] of a block, with their bounds ``upper``, ``lower`` [c, K] and sizes ``n`` [c]."""

    batch: Tensor
    size: Tensor
    upper: Tensor
    lower: Tensor
    n: Tensor

    def around(self, keys: _Keys, radius: Tensor, sigma: Tensor) -> tuple[Tensor, Tensor]:
        """[c, K] twice: the keys surely nearer than ``radius`` [c], and those neither surely
        nearer nor surely farther (the tests of :func:`_count_below`)."""
        lo, hi = _thresholds(keys, radius, sigma)
        nearer = torch.signbit(self.upper - lo[:, None])
        return nearer, torch.signbit(self.lower - hi[:, None]) & ~nearer


def _refine(
    keys: _Keys,
    s: Tensor,
    sigma: Tensor,
    eps: Tensor,
    cells: _Cells,
    k_out: Tensor,
    k_in: Tensor,
    r_max: Tensor,
    r_min: Tensor,
) -> Tensor:
    """Decide ``cells`` from direct distances of their ambiguous keys only; [c] True where that
    is not enough (a key other than ``i*`` / ``j*`` holds the extreme), left for :func:`_recompute`.

    A key is ambiguous around ``r`` if it is neither surely nearer (``P < T - eps``) nor surely
    farther (``M >= T + eps``). Every in-key but the ambiguous ones is surely nearer than ``i*``,
    so ``r_max`` is the largest direct distance of the ambiguous in-keys; if that is ``i*``'s, the
    surely-nearer out-keys and the ambiguous ones within ``r_max`` make ``K_out``. Likewise
    ``r_min`` and ``K_in`` (no out-key is surely nearer than ``j*``).
    """
    b, g = cells.batch, cells.size
    inside = torch.arange(cells.upper.shape[-1], device=b.device) < cells.n[:, None]
    nearer, ambiguous = cells.around(keys, r_max[b, g], sigma[b, g])
    far, far_cell = _pair_distances(keys, s, eps, cells, ambiguous & inside)
    far_max = torch.full_like(r_max[b, g], -torch.inf).scatter_reduce_(0, far_cell, far, "amax")
    out, out_cell = _pair_distances(keys, s, eps, cells, ambiguous & ~inside)
    out_count = torch.zeros_like(b).index_add_(0, out_cell, (out <= far_max[out_cell]).to(torch.int64))
    new_k_out = (nearer & ~inside).sum(dim=-1) + out_count
    decided = far_max == r_max[b, g]
    full = cells.n == cells.upper.shape[-1]
    nearer, ambiguous = cells.around(keys, r_min[b, g], sigma[b, g])
    near, near_cell = _pair_distances(keys, s, eps, cells, ambiguous & ~inside)
    near_value = torch.full_like(r_min[b, g], torch.inf).scatter_reduce_(0, near_cell, near, "amin")
    within, within_cell = _pair_distances(keys, s, eps, cells, ambiguous & inside)
    in_count = torch.zeros_like(b).index_add_(0, within_cell, (within <= near_value[within_cell]).to(torch.int64))
    new_k_in = torch.where(full, cells.n, (nearer & inside).sum(dim=-1) + in_count)
    decided &= full | ((near_value == r_min[b, g]) & ~(nearer & ~inside).any(dim=-1))
    k_out[b, g] = torch.where(decided, new_k_out, k_out[b, g])
    k_in[b, g] = torch.where(decided, new_k_in, k_in[b, g])
    return ~decided


def _pair_distances(keys: _Keys, s: Tensor, eps: Tensor, cells: _Cells, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Direct float64 distances of the keys ``mask`` [c, K] of ``cells``, and the cell of each.

    The keys and centres are gathered into work tensors (thousands of pairs per call: fresh
    tensors would fault their pages in on every call)."""
    cell, position = mask.nonzero(as_tuple=True)
    b, g = cells.batch[cell], cells.size[cell]
    n_sizes, dim = s.shape[-2:]
    shape = (cell.shape[0], dim)
    y = keys.at(b, position, out=WORKSPACE.get("pair_keys", shape, keys.y.dtype, s.device))
    centers = WORKSPACE.get("pair_centers", shape, s.dtype, s.device)
    torch.index_select(s.reshape(-1, dim), 0, b * n_sizes + g, out=centers)
    return direct_distances(y, centers, keys.distance, eps[b], overwrite=True), cell


def _recompute(
    keys: _Keys,
    s: Tensor,
    ns: Tensor,
    eps: Tensor,
    batch: Tensor,
    size: Tensor,
    k_out: Tensor,
    k_in: Tensor,
    r_max: Tensor,
    r_min: Tensor,
) -> None:
    """Overwrite the cells ``(batch, size)`` from direct float64 distances of every key (the definitions)."""
    n_keys, dim = keys.y.shape[1:]
    chunk = max(1, _DIRECT_CHUNK_BYTES // (n_keys * dim * 8))
    position = torch.arange(n_keys, device=s.device)
    for c0 in range(0, batch.shape[0], chunk):
        b, g = batch[c0 : c0 + chunk], size[c0 : c0 + chunk]
        y = keys.rows(b, out=WORKSPACE.get("rows", (b.shape[0], n_keys, dim), keys.y.dtype, s.device))  # [c, K, d]
        if keys.distance == "euclidean":  # y - s written over the work tensor, s broadcast: no copies
            dist = direct_distances(y, s[b, g][:, None, :], keys.distance, eps, overwrite=True)
        else:
            centre = s[b, g][:, None, :].expand_as(y)
            dist = direct_distances(
                y.reshape(-1, dim), centre.reshape(-1, dim), keys.distance, eps[b].repeat_interleave(n_keys)
            )
            dist = dist.view(-1, n_keys)
        inside = position < ns[g][:, None]
        high = torch.where(inside, dist, -torch.inf).amax(dim=-1)
        low = torch.where(inside, torch.inf, dist).amin(dim=-1)
        r_max[b, g], r_min[b, g] = high, low
        k_out[b, g] = (~inside & (dist <= high[:, None])).sum(dim=-1)
        k_in[b, g] = (inside & (dist <= low[:, None])).sum(dim=-1)
