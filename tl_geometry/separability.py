"""Precision, Recall and F-score of top-N selection in value space (SPEC §2; paper eq. 2-5).

For one attention row with weights ``alpha`` (K keys) and values ``v`` (K x d):

* contributions ``y_i = alpha_i v_i``; ``I_N`` = the N largest weights (stable, see
  :mod:`tl_geometry.selection`); representative ``s(N) = sum_{i in I_N} y_i``;
* distances ``D_i(N) = ||y_i - s(N)||``; ``r_max(N) = max_{i in I_N} D_i``;
  ``r_min(N) = min_{j not in I_N} D_j`` (``+inf`` when ``N = K``); balls are closed;
* ``precision(N) = P(r_max, N) = N / (N + K_out)``, ``K_out = #{j not in I_N: D_j <= r_max}``;
* ``recall(N) = R(r_min, N) = K_in / N``, ``K_in = #{i in I_N: D_i <= r_min}``;
* ``f_at_rmax = 2 precision / (1 + precision)``, ``f_at_rmin = 2 recall / (1 + recall)``
  (Corollary 1: ``R(r_max, N) = P(r_min, N) = 1``).

The fast path computes every ``N`` at once. For a fixed ``N`` the term ``||s(N)||^2`` is common
to all keys, so comparisons use ``E_i(N) = ||y_i||^2 - 2 <y_i, s(N)>`` (``= D_i^2 - ||s||^2``),
one batched matrix product per block of rows and sizes; the radii are then recomputed directly
as ``||y_{i*} - s(N)||`` at the arg-max / arg-min key, so they carry no cancellation error.
Everything is float64 unless the caller asks otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from ._typing import typechecked
from .errors import InputError
from .selection import NsLike, resolve_ns, sort_by_weight

#: Size in bytes of one block of the ``E`` matrix (rows x keys x sizes). About 4 MiB balances the
#: matrix product (faster in big blocks) against the masked reductions (faster in cache): on 2 CPU
#: cores, 9 rows of K = 1024, every N, it ran in 0.11 s against 0.18 s at 1 MiB and 0.24 s at 64 MiB.
DEFAULT_BLOCK_BYTES = 4 << 20


@dataclass(frozen=True)
class Separability:
    """Separability of top-N selection, per row and selection size (SPEC §2).

    Every field but ``ns`` has shape ``[*batch, len(ns)]``, the batch dimensions being those of the
    weights passed to :func:`separability`.

    Attributes
    ----------
    ns : [n] int64
        The selection sizes ``N``.
    precision : ``P(r_max(N), N) = N / (N + K_out)``.
    recall : ``R(r_min(N), N) = K_in / N``; 1 at ``N = K``.
    r_min : ``min_{j not in I_N} ||y_j - s(N)||``; ``+inf`` at ``N = K``.
    r_max : ``max_{i in I_N} ||y_i - s(N)||``; 0 at ``N = 1``.
    f_at_rmax : ``2 precision / (1 + precision)``, the F-score at ``r_max`` (Corollary 1).
    f_at_rmin : ``2 recall / (1 + recall)``, the F-score at ``r_min`` (Corollary 1).
    """

    ns: Int[Tensor, "n"]
    precision: Float[Tensor, "*batch n"]
    recall: Float[Tensor, "*batch n"]
    r_min: Float[Tensor, "*batch n"]
    r_max: Float[Tensor, "*batch n"]
    f_at_rmax: Float[Tensor, "*batch n"]
    f_at_rmin: Float[Tensor, "*batch n"]


@dataclass(frozen=True)
class PrecisionRecallAtRadius:
    """``P(r, N)`` and ``R(r, N)`` of eq. 2-3 at given radii (SPEC §2).

    ``precision`` and ``recall`` have shape ``[*batch, len(ns), n_radii]``; ``precision`` is NaN
    where the closed ball ``B_r(s(N))`` holds no contribution at all.
    """

    ns: Int[Tensor, "n"]
    radii: Float[Tensor, "*batch n r"]
    precision: Float[Tensor, "*batch n r"]
    recall: Float[Tensor, "*batch n r"]


def check_row_inputs(weights: Tensor, values: Tensor) -> None:
    """Raise :class:`InputError` for rows the definitions cannot be applied to."""
    if weights.shape[-1] < 1:
        raise InputError("attention rows must have at least one key (K >= 1), got K = 0")
    if not bool(torch.isfinite(weights).all()):
        raise InputError(
            "attention weights contain NaN or inf: check the model's dtype (fp16 overflow) or "
            "the pattern you passed; separability is undefined for non-finite weights"
        )
    if not bool(torch.isfinite(values).all()):
        raise InputError("value vectors contain NaN or inf: check the model's dtype or the values you passed")
    if bool((weights < 0).any()):
        raise InputError("attention weights must be non-negative (softmax outputs); got a negative weight")


@typechecked
def separability(
    weights: Float[Tensor, "*batch k"],
    values: Float[Tensor, "*batch k d"],
    ns: NsLike = None,
    *,
    dtype: torch.dtype = torch.float64,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Separability:
    """Precision, Recall, radii and F-scores of top-N selection for every row and ``N`` (SPEC §2).

    Parameters
    ----------
    weights : Tensor of shape [*batch, K]
        Attention weights ``alpha_i`` of each row over its ``K`` keys (non-negative; they need
        not sum to one). Any leading batch dimensions (sequence, head, query...).
    values : Tensor of shape [*batch, K, d]
        Value vectors ``v_i`` of the same keys, already mapped to the query head's key/value
        head (SPEC §1).
    ns : None, "all", "log", sequence of int or 1-D int tensor, default None
        Selection sizes ``N``; ``None`` means every ``N`` from 1 to ``K``. See
        :func:`tl_geometry.selection.resolve_ns`.
    dtype : torch.dtype, default torch.float64
        Precision of the computation. Counts are decided by comparisons of distances, so keep
        float64 unless you accept that near-ties may be counted differently.
    block_bytes : int, default 4 MiB
        Working-set size of one block of the distance computation; a tuning knob only.

    Returns
    -------
    Separability
        Fields ``ns`` ([n]) and ``precision, recall, r_min, r_max, f_at_rmax, f_at_rmin``
        ([*batch, n]), on the device of ``weights``.
    """
    check_row_inputs(weights, values)
    n_keys = weights.shape[-1]
    ns_t = resolve_ns(ns, n_keys, device=weights.device)
    w, packing = einops.pack([weights.to(dtype)], "* k")
    v, _ = einops.pack([values.to(dtype)], "* k d")
    precision, recall, r_min, r_max = _separability_rows(w, v, ns_t, block_bytes)

    def unpack(x: Tensor) -> Tensor:
        return einops.unpack(x, packing, "* n")[0]

    return Separability(
        ns=ns_t,
        precision=unpack(precision),
        recall=unpack(recall),
        r_min=unpack(r_min),
        r_max=unpack(r_max),
        f_at_rmax=unpack(2 * precision / (1 + precision)),
        f_at_rmin=unpack(2 * recall / (1 + recall)),
    )


def _separability_rows(
    weights: Tensor, values: Tensor, ns: Tensor, block_bytes: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The engine on flat rows: weights [R, K], values [R, K, d] -> four [R, G] tensors."""
    n_rows, n_keys, _ = values.shape
    n_sizes = ns.shape[0]
    _, contributions = sort_by_weight(weights, values)  # y in selection order, [R, K, d]
    centers = torch.cumsum(contributions, dim=-2)[:, ns - 1]  # s(N) for each requested N, [R, G, d]
    sq_norms = einops.einsum(contributions, contributions, "r k d, r k d -> r k")
    rank = torch.arange(n_keys, device=weights.device)

    k_out = torch.empty(n_rows, n_sizes, dtype=torch.int64, device=weights.device)
    k_in = torch.empty_like(k_out)
    arg_max = torch.empty_like(k_out)
    arg_min = torch.empty_like(k_out)
    bytes_per_cell = contributions.element_size()
    row_block = max(1, min(n_rows, 16))
    size_block = max(8, block_bytes // (row_block * n_keys * bytes_per_cell))
    for r0 in range(0, n_rows, row_block):
        rows = slice(r0, r0 + row_block)
        y = contributions[rows]
        for g0 in range(0, n_sizes, size_block):
            sizes = slice(g0, g0 + size_block)
            n_block = ns[sizes]
            # E[r, i, g] = ||y_i||^2 - 2 <y_i, s(N_g)>  (= D_i(N_g)^2 - ||s(N_g)||^2)
            e = torch.baddbmm(
                sq_norms[rows, :, None], y, einops.rearrange(centers[rows, sizes], "r g d -> r d g"), alpha=-2
            )
            inside = rank[:, None] < n_block[None, :]  # [K, g]: key at rank t is in I_N
            e_max, i_max = torch.where(inside, e, -torch.inf).max(dim=-2)
            e_min, j_min = torch.where(inside, torch.inf, e).min(dim=-2)
            # every selected key lies within r_max, so the ball's count minus N is K_out
            k_out[rows, sizes] = (e <= e_max[:, None, :]).sum(dim=-2) - n_block
            k_in[rows, sizes] = ((e <= e_min[:, None, :]) & inside).sum(dim=-2)
            arg_max[rows, sizes] = i_max
            arg_min[rows, sizes] = j_min

    n_float = ns.to(contributions.dtype)
    precision = n_float / (n_float + k_out)
    recall = k_in / n_float
    r_max = _distance_at(contributions, centers, arg_max)
    r_min = torch.where(ns == n_keys, torch.inf, _distance_at(contributions, centers, arg_min))
    return precision, recall, r_min, r_max


def _distance_at(contributions: Tensor, centers: Tensor, key_rank: Tensor) -> Tensor:
    """``||y_{key_rank[r, g]} - s_g||`` computed directly: contributions [R,K,d], centers [R,G,d]."""
    index = einops.repeat(key_rank, "r g -> r g d", d=contributions.shape[-1])
    return torch.linalg.vector_norm(torch.gather(contributions, 1, index) - centers, dim=-1)


@typechecked
def precision_recall_at_radius(
    weights: Float[Tensor, "*batch k"],
    values: Float[Tensor, "*batch k d"],
    radii: Float[Tensor, "r"] | Float[Tensor, "*batch n r"],
    ns: NsLike = None,
    *,
    dtype: torch.dtype = torch.float64,
    max_block_bytes: int = 64 << 20,
) -> PrecisionRecallAtRadius:
    """``P(r, N)`` and ``R(r, N)`` (eq. 2-3) at arbitrary radii: a precision-recall curve per ``N``.

    ``P(r, N) = |{i in I_N: D_i <= r}| / |{all i: D_i <= r}|`` (NaN for an empty ball) and
    ``R(r, N) = |{i in I_N: D_i <= r}| / N`` with ``D_i = ||alpha_i v_i - s(N)||`` computed
    directly (no Gram expansion), balls closed (SPEC §2).

    Parameters
    ----------
    weights : Tensor of shape [*batch, K]
        Attention weights of each row.
    values : Tensor of shape [*batch, K, d]
        Value vectors of the same keys.
    radii : Tensor of shape [r] or [*batch, len(ns), r]
        Radii, either common to all rows and sizes, or one set per row and ``N`` (for instance a
        sweep between each row's ``r_min`` and ``r_max`` from :func:`separability`).
    ns : as in :func:`separability`, default None (every ``N``).
    dtype : torch.dtype, default torch.float64
    max_block_bytes : int, default 64 MiB
        Largest ``[rows, K, sizes, d]`` block of differences formed at once.

    Returns
    -------
    PrecisionRecallAtRadius
        ``precision`` and ``recall`` of shape [*batch, len(ns), r].
    """
    check_row_inputs(weights, values)
    n_keys = weights.shape[-1]
    ns_t = resolve_ns(ns, n_keys, device=weights.device)
    w, packing = einops.pack([weights.to(dtype)], "* k")
    v, _ = einops.pack([values.to(dtype)], "* k d")
    n_rows, n_sizes = w.shape[0], ns_t.shape[0]
    if radii.ndim == 1:
        r = einops.repeat(radii.to(dtype), "r -> rows n r", rows=n_rows, n=n_sizes)
    else:
        r, _ = einops.pack([radii.to(dtype)], "* n r")
        if r.shape[:2] != (n_rows, n_sizes):
            raise InputError(
                f"radii of shape {tuple(radii.shape)} do not match the rows {tuple(weights.shape[:-1])} "
                f"and {n_sizes} sizes: give [r] or [*batch, len(ns), r]"
            )
    distances = _direct_distances(w, v, ns_t, max_block_bytes)  # [R, K, G] in selection order
    inside = torch.arange(n_keys, device=w.device)[:, None] < ns_t[None, :]  # [K, G]
    in_ball = distances[..., None] <= r[:, None, :, :]  # [R, K, G, r]
    n_selected_in_ball = (in_ball & inside[None, :, :, None]).sum(dim=1).to(dtype)
    n_in_ball = in_ball.sum(dim=1).to(dtype)
    precision = torch.where(n_in_ball > 0, n_selected_in_ball / n_in_ball.clamp(min=1), torch.nan)
    recall = n_selected_in_ball / ns_t.to(dtype)[:, None]
    radii_out = r

    def unpack(x: Tensor) -> Tensor:
        return einops.unpack(x, packing, "* n r")[0]

    return PrecisionRecallAtRadius(
        ns=ns_t, radii=unpack(radii_out), precision=unpack(precision), recall=unpack(recall)
    )


def _direct_distances(weights: Tensor, values: Tensor, ns: Tensor, max_block_bytes: int) -> Tensor:
    """``D[r, t, g] = ||y_(t) - s(N_g)||`` for keys in selection order ``t``: [R, K, G]."""
    _, contributions = sort_by_weight(weights, values)
    centers = torch.cumsum(contributions, dim=-2)[:, ns - 1]
    n_rows, n_keys, dim = contributions.shape
    per_size = n_rows * n_keys * dim * contributions.element_size()
    size_block = max(1, max_block_bytes // max(per_size, 1))
    blocks = [
        torch.linalg.vector_norm(
            contributions[:, :, None, :] - centers[:, None, g0 : g0 + size_block, :], dim=-1
        )
        for g0 in range(0, ns.shape[0], size_block)
    ]
    return torch.cat(blocks, dim=-1)
