"""Theoretical envelopes of Precision and Recall: Theorems 1-2 and Corollary 1 (definitions §4).

For one attention row and a selection size ``N`` (``M = K - N`` keys outside ``I_N``), with
``a_i = alpha_i ||v_i||`` and margins ``Delta`` (eq. 8), ``Delta_0`` (eq. 29), scale ``B``::

    t = exp(-kappa d (Delta / B)^2)           (1 if Delta <= 0; t_0 likewise from Delta_0)
    precision_lower = 1 / (1 + M t + (M / N) t_0),   recall_lower = 1 - M t - (M / N) t_0

The upper bounds use the pairwise ``p_ij`` of eq. 9-11, 13, 15; the F-score bounds are
``2x / (1 + x)`` of the matching bounds (Corollary 1). ``rho`` is the measured cosine or the
assumption model (:class:`SimilarityModel`). Every quantity, the choices where the paper is silent
(empty sets, ``sigma = 0``, the diagonal of ``rho``) and the ``O(K log K)`` computation:
docs/theory.md §1-4; columns: docs/columns.md#bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Union

import einops
import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.core.checks import all_finite, check_row_inputs, typechecked
from tl_geometry.core.compiled import AVAILABLE, use_compiled
from tl_geometry.core.engine.fused import grid_sums
from tl_geometry.core.layouts import causal_rows, pack_rows
from tl_geometry.core.rankings import selection_order
from tl_geometry.core.sizes import DEFAULT_NS, NsLike, resolve_ns
from tl_geometry.errors import InputError
from tl_geometry.theory.boundary_cosines import bucket_max_matrix, rho_out_from_buckets, rho_out_measured

if AVAILABLE:  # whether numba imports is decided once, in core/compiled.py; without it: torch.searchsorted
    import numba

#: Working-set size of one block of ``[rows, sizes, keys]`` tensors (a tuning knob only).
DEFAULT_BLOCK_BYTES = 64 << 20

#: Sizes with at most this many inside keys bracket their targets by one scan of the outside values
#: (``N (K - N)`` comparisons, compiled path) instead of sorting them (the fastest cut-off on SmolLM2's rows of 1024 keys).
SCAN_MAX_INSIDE = 16

#: Where ``phi(x) / (x + 1/x)`` peaks on ``x > 0``: the root of ``1 - 2 x^2 - x^4``.
XI_STAR = math.sqrt(math.sqrt(2.0) - 1.0)

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@dataclass(frozen=True)
class SimilarityModel:
    """The cosine model of Assumption 2 (paper §3.2), as a source of ``rho`` for :func:`bounds`.

    ``rho_jk = exp(-beta |j - k|)`` for keys ``j, k > 0``; ``rho_0`` between the sink (key 0) and
    any other key; 1 on the diagonal. Parameters are given by hand (or taken from the
    diagnostics of definitions §3).

    Attributes
    ----------
    beta : float, >= 0
        Decay rate of the cosine similarity with the key distance.
    rho_0 : float in [-1, 1]
        Cosine of the sink with every other key.
    """

    beta: float
    rho_0: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.beta) and self.beta >= 0):
            raise InputError(f"SimilarityModel.beta must be finite and >= 0, got {self.beta!r}")
        if not (math.isfinite(self.rho_0) and -1.0 <= self.rho_0 <= 1.0):
            raise InputError(f"SimilarityModel.rho_0 must lie in [-1, 1], got {self.rho_0!r}")

    def cosines(self, keys_a: Tensor, keys_b: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
        """``rho`` between key indices ``keys_a[..., :, None]`` and ``keys_b[..., None, :]``."""
        ka = keys_a[..., :, None]
        kb = keys_b[..., None, :]
        out = torch.exp(-self.beta * (ka - kb).abs().to(dtype))
        sink_pair = (ka == 0) ^ (kb == 0)
        out = torch.where(sink_pair, torch.as_tensor(self.rho_0, dtype=dtype, device=out.device), out)
        return torch.where(ka == kb, torch.ones((), dtype=dtype, device=out.device), out)


#: ``"measured"``, a :class:`SimilarityModel`, or ``("model", beta, rho_0)``.
RhoLike = Union[str, SimilarityModel, tuple]


def resolve_rho(rho: RhoLike) -> SimilarityModel | None:
    """``"measured"`` -> None (cosines of the values); a model or ``("model", beta, rho_0)``."""
    if isinstance(rho, str):
        if rho == "measured":
            return None
        raise InputError(
            f"rho={rho!r} is not understood: use 'measured', SimilarityModel(beta, rho_0) or ('model', beta, rho_0)"
        )
    if isinstance(rho, SimilarityModel):
        return rho
    if isinstance(rho, tuple) and len(rho) == 3 and rho[0] == "model":
        return SimilarityModel(float(rho[1]), float(rho[2]))
    raise InputError(
        f"rho={rho!r} is not understood: use 'measured', SimilarityModel(beta, rho_0) or ('model', beta, rho_0)"
    )


def f_bound(x: Tensor) -> Tensor:
    """Corollary 1: the F-score bound ``2x / (1 + x)`` matching a precision or recall bound ``x``."""
    return 2 * x / (1 + x)


@dataclass(frozen=True)
class Bounds:
    """Envelopes of Theorems 1-2 per row and selection size (definitions §4).

    Every field but ``ns`` has shape ``[*batch, len(ns)]``, the batch dimensions being those of
    the weights passed to :func:`bounds`. The Corollary 1 F-score bounds are properties.

    Attributes
    ----------
    ns : [n] int64
        The selection sizes ``N``.
    precision_lower : eq. 12, ``1 / (1 + M t + (M/N) t_0)`` clipped to [0, 1]; 1 at ``N in {1, K}``.
    precision_upper : eq. 13, ``1 - max_{i in I_N, j not in I_N} p_ij / (N + 1)``; 1 at ``N in {1, K}``.
    recall_lower : eq. 14, ``1 - M t - (M/N) t_0`` clipped to [0, 1]; 1 at ``N in {1, K}``.
    recall_upper : eq. 15, ``(1/N) sum_{i in I_N} (1 - max_{j not in I_N} p_ij)``; 1 at ``N in {1, K}``.
    delta : ``Delta = a_in_min^2 - 2 a_out_max S_in rho_out`` (NaN when ``I'`` is empty).
    delta0 : ``Delta_0 = a_0^2 - (S_in rho_out)^2`` (eq. 29), reported for every ``N``.
    scale : ``B = a_in_max + a_out_max + S_in``.
    """

    ns: Int[Tensor, " n"]
    precision_lower: Float[Tensor, "*batch n"]
    precision_upper: Float[Tensor, "*batch n"]
    recall_lower: Float[Tensor, "*batch n"]
    recall_upper: Float[Tensor, "*batch n"]
    delta: Float[Tensor, "*batch n"]
    delta0: Float[Tensor, "*batch n"]
    scale: Float[Tensor, "*batch n"]

    @property
    def f_at_rmax_lower(self) -> Tensor:
        """Corollary 1 (eq. 17): lower bound of ``E F(r_max, N)``, ``2 P_low / (1 + P_low)``."""
        return f_bound(self.precision_lower)

    @property
    def f_at_rmax_upper(self) -> Tensor:
        """Corollary 1 (eq. 17): upper bound of ``E F(r_max, N)``, ``2 P_up / (1 + P_up)``."""
        return f_bound(self.precision_upper)

    @property
    def f_at_rmin_lower(self) -> Tensor:
        """Corollary 1 (eq. 16): lower bound of ``E F(r_min, N)``, ``2 R_low / (1 + R_low)``."""
        return f_bound(self.recall_lower)

    @property
    def f_at_rmin_upper(self) -> Tensor:
        """Corollary 1 (eq. 16): upper bound of ``E F(r_min, N)``, ``2 R_up / (1 + R_up)``."""
        return f_bound(self.recall_upper)


#: Names of the per-row quantities of :class:`Bounds` and of its Corollary 1 properties.
BOUND_FIELDS = ["precision_lower", "precision_upper", "recall_lower", "recall_upper", "delta", "delta0", "scale"]
F_BOUND_FIELDS = ["f_at_rmax_lower", "f_at_rmax_upper", "f_at_rmin_lower", "f_at_rmin_upper"]


@typechecked
def bounds(
    weights: Float[Tensor, "*batch k"],
    values: Float[Tensor, "*batch k d"],
    ns: NsLike = DEFAULT_NS,
    kappa: float | int = 0.5,
    *,
    rho: RhoLike = "measured",
    dtype: torch.dtype = torch.float64,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    query_positions: Any = None,
) -> Bounds:
    """Lower and upper envelopes of Precision and Recall (Theorems 1-2) for every row and ``N``.

    Follows definitions §4 to the letter; see the module docstring for every choice the paper leaves open
    (empty ``I'``, ``N = K``, the diagonal of ``rho``, ``B = 0``).

    Parameters
    ----------
    weights : Tensor of shape [*batch, K]
        Attention weights ``alpha_i`` of each row (non-negative), any leading batch dimensions.
    values : Tensor of shape [*batch, K, d]
        Value vectors of the same keys; ``d = values.shape[-1]`` is the theory's dimension.
    ns : None, "all", "log", sequence of int or 1-D int tensor, default "log"
        Selection sizes ``N`` (see :func:`tl_geometry.core.sizes.resolve_ns`); None = every N.
    kappa : float, default 0.5
        The paper's universal concentration constant ``kappa > 0`` (definitions §4).
    rho : "measured", SimilarityModel or ("model", beta, rho_0), default "measured"
        Source of the cosines ``rho_jk``: measured from ``values``, or the Assumption 2 model
        ``exp(-beta |j-k|)`` (``j, k > 0``) and ``rho_0`` against the sink, with ``j, k`` the
        key indices (positions), not the ranks.
    dtype : torch.dtype, default torch.float64
    block_bytes : int, default 64 MiB
        Working-set size of one block of rows; a tuning knob only.
    query_positions : int, optional
        The position ``q`` of every row's query: the rows are cut to their causal keys ``0..q``
        (negative counts from ``K``). None: the rows are taken as they are, and a row whose last
        weight is exactly 0 (the full causal row of an earlier query) is refused, as in
        :func:`tl_geometry.separability`; pass ``-1`` if such zeros are real weights.

    Returns
    -------
    Bounds
        ``ns`` and seven ``[*batch, len(ns)]`` tensors; F bounds as properties.
    """
    check_row_inputs(weights, values)
    weights, values = causal_rows(weights, values, query_positions)
    if not (isinstance(kappa, (int, float)) and math.isfinite(kappa) and kappa > 0):
        raise InputError(f"kappa must be a finite number > 0, got {kappa!r}")
    model = resolve_rho(rho)
    n_keys = weights.shape[-1]
    ns_t = resolve_ns(ns, n_keys, device=weights.device)
    w, packing = pack_rows(weights.to(dtype), 1)
    v, _ = pack_rows(values.to(dtype), 2)
    out = _bounds_rows(w, v, ns_t, float(kappa), model, block_bytes)
    return Bounds(ns=ns_t, **{name: einops.unpack(x, packing, "* n")[0] for name, x in out.items()})


def _bounds_rows(
    weights: Tensor, values: Tensor, ns: Tensor, kappa: float, model: SimilarityModel | None, block_bytes: int
) -> dict[str, Tensor]:
    """The engine on flat rows: weights [R, K], values [R, K, d] -> seven [R, G] tensors.

    The sizes are computed once each, in increasing order (``ns`` may repeat or be unordered)."""
    n_rows, n_keys, dim = values.shape
    grid, back = torch.unique(ns, sorted=True, return_inverse=True)
    dtype, device = values.dtype, values.device
    out = {name: torch.empty(n_rows, grid.shape[0], dtype=dtype, device=device) for name in BOUND_FIELDS}
    cell = torch.finfo(dtype).bits // 8
    inside_keys = int(grid.clamp(max=n_keys - 1).sum())  # L: the inside keys of every N, one after the other
    per_row = cell * (6 * grid.shape[0] * n_keys + 12 * inside_keys + 2 * n_keys * dim)
    if device.type != "cpu":  # one bucket's cosines for every row at once (the CPU forms PRODUCT_ELEMENTS at a time)
        per_row += cell * (n_keys * n_keys // 4)
    if model is not None:
        per_row += 2 * cell * n_keys * n_keys  # the model's [K, K] cosine matrix
    row_block = max(1, min(n_rows, block_bytes // max(1, per_row)))
    for r0 in range(0, n_rows, row_block):
        rows = slice(r0, r0 + row_block)
        block = _RowBlock(weights[rows], values[rows], grid, model).bounds(kappa, dim)
        for name, x in block.items():
            out[name][rows] = x
    return {name: x[:, back] for name, x in out.items()}


class _RowBlock:
    """A block of rows in selection order, with the per-size quantities of the sorted ``grid``."""

    def __init__(self, weights: Tensor, values: Tensor, grid: Tensor, model: SimilarityModel | None) -> None:
        _, n_keys, dim = values.shape
        self.n_keys, self.grid = n_keys, grid
        order = selection_order(weights)  # the selection order of definitions §2
        alpha = torch.gather(weights, -1, order)
        fused = AVAILABLE and values.device.type == "cpu" and values.stride(-1) == 1 and model is None
        if fused:  # the norms of the values in place, then units gathered and divided in one pass
            norms = torch.linalg.vector_norm(values, dim=-1).gather(-1, order)
        else:
            v = values[torch.arange(order.shape[0], device=order.device)[:, None], order]  # [r, K, d]
            norms = torch.linalg.vector_norm(v, dim=-1)
        a = alpha * norms  # a_t in selection order, [r, K]
        self.a = a
        sink = order == 0  # [r, K], one True per row
        self.sink_rank = sink.to(torch.int64).argmax(dim=-1)  # [r]
        self.a0 = a.gather(-1, self.sink_rank[:, None])[:, 0]  # [r]
        a_ns = torch.where(sink, 0.0, a)  # a_l for l in I' (sink removed), [r, K]
        last = grid - 1  # prefix quantities at rank N - 1 describe I_N
        self.s_in = torch.cumsum(a_ns, dim=-1)[:, last]
        self.a_in_min = torch.cummin(torch.where(sink, torch.inf, a), dim=-1).values[:, last]
        self.a_in_max = torch.cummax(torch.where(sink, -torch.inf, a), dim=-1).values[:, last]
        self.a_out_max = _pad_last(_suffix_max(a, dim=-1), 0.0)[:, grid]  # empty outside (N = K): 0
        if model is None:
            units = sorted_units(values, order, norms) if fused else v / torch.where(norms > 0, norms, 1.0)[..., None]
            self.rho_out = rho_out_measured(units, grid, self.sink_rank, values.dtype)
            # M_j(N) = sum_{l in I'} a_l <u_l, u_j> = <u_j, S(N)>, S(N) = sum_{l in I'} a_l u_l
            prefix = grid_sums(units, a_ns, grid)  # S(N) [r, G, d]: running sums along the ranks
            self.m = torch.matmul(prefix, units.transpose(1, 2))  # [r, G, K]
        else:
            rho = model.cosines(order, order, dtype=values.dtype)  # [r, K, K], symmetric
            self.rho_out = rho_out_from_buckets(bucket_max_matrix(rho, grid, self.sink_rank), grid)
            inside = torch.arange(n_keys, device=grid.device)[None, :] < grid[:, None]  # [G, K]
            weight_in = torch.where(inside[None], a_ns[:, None, :], 0.0)  # [r, G, K]
            self.m = einops.einsum(weight_in, rho, "r g l, r l k -> r g k")

    def bounds(self, kappa: float, dim: int) -> dict[str, Tensor]:
        ns, n_keys = self.grid, self.n_keys
        n_rows = self.a.shape[0]
        dtype = self.a.dtype
        n_f = ns.to(dtype)
        m_out = (n_keys - ns).to(dtype)  # M = K - N

        s_in = self.s_in
        a_in_min = torch.where(torch.isinf(self.a_in_min), torch.nan, self.a_in_min)  # I' empty: undefined
        a_in_max = self.a_in_max.clamp(min=0.0)  # I' empty: 0
        a_out_max = self.a_out_max
        rho_out = torch.where(torch.isinf(self.rho_out) | (ns == n_keys)[None, :], 0.0, self.rho_out)

        delta = a_in_min**2 - 2 * a_out_max * s_in * rho_out
        delta0 = self.a0[:, None] ** 2 - (s_in * rho_out) ** 2
        scale = a_in_max + a_out_max + s_in
        sink_in = self.sink_rank[:, None] < ns[None, :]  # [r, g]

        t = _tail(delta, scale, kappa, dim)
        t0 = torch.where(sink_in, _tail(delta0, scale, kappa, dim), 0.0)
        union = m_out * t + (m_out / n_f) * t0
        precision_lower = (1.0 / (1.0 + union)).clamp(0.0, 1.0)
        recall_lower = (1.0 - union).clamp(0.0, 1.0)

        # upper bounds: mu_ij = c_j - c_i, c_t = a_t^2 - 2 a_t M_t(N)
        c = _c_terms(self.a, self.m)  # [r, G, K]
        sigma = scale / math.sqrt(2.0 * kappa * dim)  # [r, g]
        p_max, size_of = max_p_over_outside(c, ns, sigma)  # [r, L]: every inside key of every nontrivial N
        index = size_of[None, :].expand_as(p_max)
        recall_upper = torch.zeros_like(scale).scatter_add_(1, index, 1.0 - p_max) / n_f
        precision_upper = 1.0 - torch.zeros_like(scale).scatter_reduce_(1, index, p_max, "amax") / (n_f + 1.0)
        nontrivial = (ns > 1) & (ns < n_keys)
        recall_upper = torch.where(nontrivial, recall_upper, 1.0)
        precision_upper = torch.where(nontrivial, precision_upper, 1.0)

        trivial = ((ns == 1) | (ns == n_keys))[None, :].expand(n_rows, -1)
        one = torch.ones((), dtype=dtype, device=ns.device)
        return {
            "precision_lower": torch.where(trivial, one, precision_lower),
            "precision_upper": precision_upper,
            "recall_lower": torch.where(trivial, one, recall_lower),
            "recall_upper": recall_upper,
            "delta": delta,
            "delta0": delta0,
            "scale": scale,
        }


def _c_terms(a: Tensor, m: Tensor) -> Tensor:
    """``c_t = a_t^2 - 2 a_t M_t(N)`` ``[r, G, K]`` from ``a [r, K]`` and ``M [r, G, K]``: one compiled
    pass for float64 on the CPU (the same operations as the tensor expression, which broadcasts
    slowly); the tensor expression elsewhere."""
    if not (use_compiled(None, a, float64=True) and m.dtype == a.dtype):
        return a[:, None, :] ** 2 - 2 * a[:, None, :] * m
    out = torch.empty(m.shape, dtype=m.dtype)
    _c_kernel(a.detach().contiguous().numpy(), m.detach().contiguous().numpy(), out.numpy())
    return out


def _c_pass(a, m, out):  # pragma: no cover - compiled
    """``out[r, g, t] = a[r, t] * a[r, t] - (2 * a[r, t]) * m[r, g, t]``, as torch evaluates it."""
    for r in range(m.shape[0]):
        for g in range(m.shape[1]):
            for t in range(m.shape[2]):
                out[r, g, t] = a[r, t] * a[r, t] - (2.0 * a[r, t]) * m[r, g, t]


def sorted_units(
    values: Float[Tensor, "r k d"], order: Int[Tensor, "r k"], norms: Float[Tensor, "r k"]
) -> Float[Tensor, "r k d"]:
    """``values`` in selection ``order`` divided by their ``norms`` (1 for a zero norm), in one compiled pass.

    The same values as ``values[rows, order] / norms`` in torch (one IEEE division per entry).

    >>> import torch
    >>> values, order = torch.randn(2, 5, 3, dtype=torch.float64), torch.tensor([[4, 0, 1, 3, 2], [0, 1, 2, 3, 4]])
    >>> norms = values.norm(dim=-1).gather(-1, order)
    >>> torch.equal(sorted_units(values, order, norms), values[torch.arange(2)[:, None], order] / norms[..., None])
    True
    """
    out = np.empty((*order.shape, values.shape[-1]), dtype=values.detach().numpy().dtype)
    _units_kernel(values.detach().numpy(), order.numpy(), norms.detach().numpy(), out)
    return torch.from_numpy(out)


def _units(values, order, norms, out):  # pragma: no cover - compiled
    """``out[r, t] = values[r, order[r, t]] / norms[r, t]`` (``/ 1`` where the norm is 0)."""
    for r in range(order.shape[0]):
        for t in range(order.shape[1]):
            norm = norms[r, t]
            if not norm > 0:
                norm = 1.0
            src = order[r, t]
            for i in range(values.shape[2]):
                out[r, t, i] = values[r, src, i] / norm


if AVAILABLE:
    _units_kernel = numba.njit(cache=True, nogil=True)(_units)
    _c_kernel = numba.njit(cache=True, nogil=True)(_c_pass)


def _suffix_max(x: Tensor, dim: int) -> Tensor:
    """``out[..., t, ...] = max_{t' >= t} x[..., t', ...]`` along ``dim``."""
    return torch.flip(torch.cummax(torch.flip(x, (dim,)), dim=dim).values, (dim,))


def _pad_last(x: Tensor, value: float) -> Tensor:
    return torch.cat([x, torch.full_like(x[..., :1], value)], dim=-1)


def _tail(margin: Tensor, scale: Tensor, kappa: float, dim: int) -> Tensor:
    """``exp(-kappa d (margin / B)^2)`` where ``margin > 0``, else 1 (no guarantee); NaN -> 1."""
    positive = margin > 0
    ratio = torch.where(positive, margin / torch.where(scale > 0, scale, 0.0), 0.0)  # margin > 0, B = 0 -> inf
    return torch.where(positive, torch.exp(-kappa * dim * ratio**2), 1.0)


def p_of_xi(xi: Tensor) -> Tensor:
    """Eq. 9: ``phi(xi) / (xi + 1/xi)`` for ``xi > 0``, 0 at ``xi = 0``, 1/2 for ``xi < 0``.

    ``xi = +inf`` gives 0. This is the Mills-ratio lower bound of the Gaussian tail
    ``P(Z >= xi)``, unimodal on ``xi > 0`` with its peak at :data:`XI_STAR`.
    """
    pos = xi > 0
    safe = torch.where(pos, xi, 1.0)
    body = _INV_SQRT_2PI * torch.exp(-0.5 * safe**2) / (safe + 1.0 / safe)
    body = torch.where(torch.isinf(safe), 0.0, body)
    return torch.where(pos, body, torch.where(xi < 0, 0.5, 0.0))


def _xi(diff: Tensor, sigma: Tensor) -> Tensor:
    """``diff / sigma`` with ``sigma = 0`` read as ``sign(diff) * inf`` (and 0 for ``diff = 0``)."""
    return torch.where(sigma > 0, diff / torch.where(sigma > 0, sigma, 1.0), torch.sign(diff) * torch.inf).nan_to_num(
        nan=0.0, posinf=torch.inf, neginf=-torch.inf
    )


def max_p_over_outside(c: Tensor, ns: Tensor, sigma: Tensor, *, compiled: bool | None = None) -> tuple[Tensor, Tensor]:
    """``max_{j not in I_N} p((c_j - c_i) / sigma)`` for every inside key ``i`` of every ``1 < N < K``.

    ``c [r, G, K]`` in selection order (ranks ``< N`` inside), ``sigma [r, G]``. Returns the
    maxima ``[r, L]`` of the inside keys of all those sizes one after the other, and the size index
    of each ``[L]``. ``p`` is 1/2 as soon as one outside ``c_j < c_i``; otherwise every
    ``xi >= 0`` and, ``p`` being 0 at 0 and unimodal on ``xi > 0`` with its peak at ``XI_STAR``,
    the maximum is at one of the two outside values bracketing ``c_i + XI_STAR sigma``: one sort
    of the outside values per ``N`` and a binary search per inside key.

    ``compiled``: the searches and the arithmetic around them in two numba passes, with torch's
    ``exp`` between them (None: where numba imports and ``c`` is a float64 CPU tensor), or
    ``torch.searchsorted`` and tensor operations; the results are the same, bit for bit. The
    compiled path brackets the targets of a size with at most :data:`SCAN_MAX_INSIDE` inside keys by
    one scan of its outside values, unsorted (the same neighbours where every ``c`` and ``sigma``
    is finite; otherwise every size is sorted).
    """
    compiled = use_compiled(compiled, c, float64=True, reference="torch.searchsorted")
    n_rows, n_sizes, n_keys = c.shape
    sizes = [(g, int(n)) for g, n in enumerate(ns.tolist()) if 1 < n < n_keys]
    counts = np.array([n for _, n in sizes], dtype=np.int64)
    size_of_np = np.repeat(np.array([g for g, _ in sizes], dtype=np.int64), counts)
    if compiled:
        scan = (ns <= SCAN_MAX_INSIDE).numpy() & (all_finite(c) and all_finite(sigma))
        outside_sorted = sorted_outside(c, ns, skip=scan)  # [G, r, K]: the scanned sizes left unsorted
        return _max_p_compiled(c, outside_sorted, ns, sigma, size_of_np, counts, scan), torch.from_numpy(size_of_np)
    outside_sorted = sorted_outside(c, ns)  # [G, r, K]
    size_of = torch.from_numpy(size_of_np).to(c.device)
    rank_of = torch.from_numpy(np.arange(size_of_np.shape[0]) - np.repeat(np.cumsum(counts) - counts, counts))
    c_in = c[:, size_of, rank_of.to(c.device)]  # [r, L]
    sig = sigma[:, size_of]
    target = c_in + XI_STAR * sig
    n_out = (n_keys - ns)[size_of]  # [L]
    hi, hi_ok, lo, lo_ok, below = _bracket_torch(outside_sorted, n_out, sizes, size_of, c_in, target)
    p_hi = torch.where(hi_ok, p_of_xi(_xi(torch.where(hi_ok, hi - c_in, 0.0), sig)), 0.0)
    p_lo = torch.where(lo_ok, p_of_xi(_xi(torch.where(lo_ok, lo - c_in, 0.0), sig)), 0.0)
    return torch.where(below, 0.5, torch.maximum(p_hi, p_lo)), size_of


def _bracket_torch(
    outside_sorted: Tensor, n_out: Tensor, sizes: list[tuple[int, int]], size_of: Tensor, c_in: Tensor, target: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The outside values bracketing ``target`` (and whether they count), and ``min outside < c_in``.

    ``outside_sorted [G, r, K]`` (each size's outside values sorted, +inf after them), ``n_out``,
    ``size_of [L]``, ``c_in`` and ``target [r, L]``. Returns ``hi`` (the first outside value
    ``>= target``; ``hi_ok`` where there is one), ``lo`` (the one before it; ``lo_ok`` where there is
    one and it is above ``c_in``) and ``below``, each ``[r, L]``. The reference of the compiled
    search (:func:`_max_p_compiled`)."""
    n_rows, n_keys = outside_sorted.shape[1], outside_sorted.shape[2]
    idx = torch.empty(c_in.shape, dtype=torch.int64, device=c_in.device)
    start = 0
    for g, n in sizes:  # first outside value >= target, within size g's own sorted outside values
        idx[:, start : start + n] = torch.searchsorted(
            outside_sorted[g], target[:, start : start + n].contiguous(), right=False
        )
        start += n
    base = (size_of[None, :] * n_rows + torch.arange(n_rows, device=c_in.device)[:, None]) * n_keys  # [r, L]
    hi = outside_sorted.take(base + idx.clamp(max=n_out - 1))
    hi_ok = idx < n_out
    lo_idx = idx - 1
    lo = outside_sorted.take(base + lo_idx.clamp(min=0))
    lo_ok = (lo_idx >= 0) & (lo > c_in)
    below = outside_sorted.take(base) < c_in  # some outside c_j < c_i: xi < 0
    return hi, hi_ok, lo, lo_ok, below


def _max_p_compiled(
    c: Tensor,
    outside_sorted: Tensor,
    ns: Tensor,
    sigma: Tensor,
    size_of: np.ndarray,
    counts: np.ndarray,
    scan: np.ndarray,
) -> Tensor:
    """The compiled path of :func:`max_p_over_outside`: the searches (or scans, for the sizes
    ``scan``) and ``xi`` (one pass), torch's ``exp`` of ``-xi^2 / 2`` for the upper and the lower
    neighbours (each a ``[r, L]`` array, as the torch path lays them out), then ``p`` and the
    maxima (one pass)."""
    n_rows = c.shape[0]
    shape = (2, n_rows, size_of.shape[0])  # [neighbour above, below the target; r; L]
    safe, exponent = np.empty(shape), np.empty(shape)
    case = np.empty(shape, dtype=np.int8)
    below = np.empty(shape[1:], dtype=np.bool_)
    _xi_kernel(
        c.detach().contiguous().numpy(),
        outside_sorted.detach().numpy(),
        ns.numpy(),
        sigma.detach().contiguous().numpy(),
        size_of,
        counts,
        np.ascontiguousarray(scan, dtype=np.bool_),
        safe,
        exponent,
        case,
        below,
    )
    decay = np.stack([torch.exp(torch.from_numpy(exponent[h])).numpy() for h in range(2)])
    out = np.empty(shape[1:])
    _p_kernel(safe, decay, case, below, out)
    return torch.from_numpy(out)


#: The cases of one neighbour in the compiled path: ``p`` from ``xi > 0``, 1/2 (``xi < 0``), 0.
_P_OF_XI, _HALF, _ZERO = 0, 1, 2


def _scan_outside(c_row, n_in, sig, above, below):  # pragma: no cover - compiled
    """For each inside key ``i < n_in`` of one row and size, over the outside values ``c_row[n_in:]``
    (all finite, unsorted): the smallest ``>= c_i + XI_STAR sig`` (``above``; +inf where none) and
    the largest below it (``below``; -inf where none), the neighbours a search of the sorted values
    finds; returns the smallest outside value."""
    low = np.inf
    for j in range(n_in, c_row.shape[0]):
        low = c_row[j] if c_row[j] < low else low
    for i in range(n_in):
        target = c_row[i] + XI_STAR * sig
        up, down = np.inf, -np.inf
        for j in range(n_in, c_row.shape[0]):
            v = c_row[j]
            if v >= target:
                up = v if v < up else up
            else:
                down = v if v > down else down
        above[i], below[i] = up, down
    return low


def _xi_pass(c, outside_sorted, ns, sigma, size_of, counts, scan, safe, exponent, case, below):  # pragma: no cover
    """Per row and inside key: :func:`_bracket_torch`'s search (torch.searchsorted's lower bound; for
    the sizes ``scan``, the same neighbours by :func:`_scan_outside`), then for each neighbour ``xi``
    as :func:`_xi`, and the argument ``-0.5 xi^2`` of :func:`p_of_xi`'s ``exp`` in the same
    operations (``safe`` is ``xi`` where ``xi > 0``, else 1)."""
    n_keys = outside_sorted.shape[2]
    above, beneath = np.empty(n_keys), np.empty(n_keys)  # per inside key of a scanned size
    lowest = np.inf
    for r in range(c.shape[0]):
        key = 0
        for s in range(counts.shape[0]):
            g = size_of[key]
            n = n_keys - ns[g]
            row = outside_sorted[g, r]
            sig = sigma[r, g]
            if scan[g]:
                lowest = _scan_outside(c[r, g], ns[g], sig, above, beneath)
            for rank in range(counts[s]):
                c_in = c[r, g, rank]
                if scan[g]:  # the neighbours the search below finds, among the same (finite) values
                    up, up_ok = above[rank], above[rank] < np.inf
                    down, down_ok = beneath[rank], beneath[rank] > -np.inf
                    below[r, key] = lowest < c_in
                else:
                    value = c_in + XI_STAR * sig
                    start, end = 0, n_keys
                    while start < end:
                        mid = start + ((end - start) >> 1)
                        if not (row[mid] >= value):
                            start = mid + 1
                        else:
                            end = mid
                    up, up_ok = row[min(start, n - 1)], start < n
                    down, down_ok = row[max(start - 1, 0)], start >= 1
                    below[r, key] = row[0] < c_in
                for h in range(2):
                    if h == 0:
                        neighbour, ok = up, up_ok
                    else:
                        neighbour = down
                        ok = down_ok and neighbour > c_in
                    diff = neighbour - c_in if ok else 0.0
                    if sig > 0:
                        xi = diff / sig
                    elif diff > 0:
                        xi = np.inf
                    elif diff < 0:
                        xi = -np.inf
                    else:
                        xi = 0.0
                    if xi != xi:
                        xi = 0.0
                    x = xi if xi > 0 else 1.0
                    safe[h, r, key] = x
                    exponent[h, r, key] = -0.5 * (x * x)
                    if not ok:
                        case[h, r, key] = _ZERO
                    elif xi > 0:
                        case[h, r, key] = _P_OF_XI
                    elif xi < 0:
                        case[h, r, key] = _HALF
                    else:
                        case[h, r, key] = _ZERO
                key += 1


def _p_pass(safe, decay, case, below, out):  # pragma: no cover - compiled
    """``p`` of each neighbour (:func:`p_of_xi`, from the ``exp`` it was given), the larger of the two
    (``xi`` is never NaN, so neither is ``p``), 1/2 where ``below``."""
    for r in range(out.shape[0]):
        for key in range(out.shape[1]):
            best = 0.0
            for h in range(2):
                if case[h, r, key] == _P_OF_XI:
                    x = safe[h, r, key]
                    p = 0.0 if np.isinf(x) else _INV_SQRT_2PI * decay[h, r, key] / (x + 1.0 / x)
                elif case[h, r, key] == _HALF:
                    p = 0.5
                else:
                    p = 0.0
                best = max(best, p)
            out[r, key] = 0.5 if below[r, key] else best


if AVAILABLE:
    _scan_outside = numba.njit(cache=True, nogil=True)(_scan_outside)
    _xi_kernel = numba.njit(cache=True, nogil=True)(_xi_pass)
    _p_kernel = numba.njit(cache=True, nogil=True)(_p_pass)


def sorted_outside(
    c: Float[Tensor, "r g k"], ns: Int[Tensor, " g"], skip: np.ndarray | None = None
) -> Float[Tensor, "g r k"]:
    """Per size ``N_g`` and row, the outside values ``c[r, g, N_g:]`` sorted, then ``+inf`` up to ``K``.

    On the CPU each size's outside values are copied and sorted in place with numpy (the inside
    ones are never sorted), except the sizes where ``skip`` [g] (bool) is true: left unwritten;
    elsewhere one masked :func:`sort_last`.

    >>> import torch
    >>> sorted_outside(torch.tensor([[[3.0, 1.0, 2.0], [3.0, 1.0, 2.0]]]), torch.tensor([1, 2])).tolist()
    [[[1.0, 2.0, inf]], [[2.0, inf, inf]]]
    """
    n_rows, _, n_keys = c.shape
    if c.device.type != "cpu" or c.dtype not in (torch.float32, torch.float64):
        inside = torch.arange(n_keys, device=c.device)[None, :] < ns[:, None]  # [G, K]
        return sort_last(torch.where(inside[:, None], torch.inf, c.transpose(0, 1)))
    values = c.detach().numpy()
    out = np.empty((ns.shape[0], n_rows, n_keys), dtype=values.dtype)
    for g, n in enumerate(ns.tolist()):
        if skip is not None and skip[g]:
            continue
        out[g, :, : n_keys - n] = values[:, g, n:]
        out[g, :, n_keys - n :] = np.inf
        out[g, :, : n_keys - n].sort(axis=-1)
    return torch.from_numpy(out)


def sort_last(x: Tensor) -> Tensor:
    """Values sorted along the last dimension (numpy's vectorised sort on the CPU, torch elsewhere).

    >>> import torch
    >>> sort_last(torch.tensor([[3.0, 1.0, 2.0]])).tolist()
    [[1.0, 2.0, 3.0]]
    """
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(np.sort(np.ascontiguousarray(x.detach().numpy()), axis=-1))
    return torch.sort(x, dim=-1).values.contiguous()
