"""Precision, Recall and F-score of top-N selection in value space (definitions §2; paper eq. 2-5).

For one attention row with weights ``alpha`` (K keys) and values ``v`` (K x d):

* contributions ``y_i = alpha_i v_i``; ``I_N`` = the N largest weights (stable, see
  :mod:`tl_geometry.core.sizes`); representative ``s(N) = sum_{i in I_N} y_i``;
* distances ``D_i(N) = ||y_i - s(N)||``; ``r_max(N) = max_{i in I_N} D_i``;
  ``r_min(N) = min_{j not in I_N} D_j`` (``+inf`` when ``N = K``); balls are closed;
* ``precision(N) = P(r_max, N) = N / (N + K_out)``, ``K_out = #{j not in I_N: D_j <= r_max}``;
* ``recall(N) = R(r_min, N) = K_in / N``, ``K_in = #{i in I_N: D_i <= r_min}``;
* ``f_at_rmax = 2 precision / (1 + precision)``, ``f_at_rmin = 2 recall / (1 + recall)``
  (Corollary 1: ``R(r_max, N) = P(r_min, N) = 1``).

The fast path computes every ``N`` at once. Each row (and random draw) is put in its selection
order once; ``s(N)`` is a running sum along it. For a fixed ``N`` the term ``||s(N)||^2`` is
common to all keys, so keys are screened with ``E_i(N) = ||y_i||^2 - 2 <y_i, s(N)>``
(``= D_i^2 - ||s||^2``), one float32 matrix product per block of rows and sizes, with a rounding
bound per key; every key the screen cannot call is decided by its direct float64 distance, and the
radii are direct float64 distances ``||y_{i*} - s(N)||``. So the counts are those of float64
distances (:mod:`tl_geometry.core.screening`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.core.budget import check_memory
from tl_geometry.core.checks import typechecked
from tl_geometry.core.metrics import METRICS, SeparabilityMetrics
from tl_geometry.core.numerics import local_errors, pow2, times_pow2
from tl_geometry.core.rankings import (
    COSINE_EPS,
    DEFAULT_N_RANDOM,
    check_distance,
    check_n_random,
    check_rank_by,
    check_seed,
    default_row_keys,
    ranking_scores,
    selection_order,
    uniform_scores,
)
from tl_geometry.core.screening import balanced_block, decide
from tl_geometry.core.sizes import NsLike, resolve_ns, sort_by_weight
from tl_geometry.errors import InputError

#: Size in bytes of one block of the screen (rows x draws x sizes x keys, float32). About 8 MiB
#: balances the matrix product and the per-block Python work (fewer, bigger blocks) against the
#: passes over the block (faster in cache): on 2 CPU cores, SmolLM2's rows of K = 1024, 1 thread,
#: every N: 9.7 ms per row against 12.1 at 4 MiB and 10.7 at 16 MiB.
DEFAULT_BLOCK_BYTES = 8 << 20
#: Bytes held per (row, draw, key) whatever the blocks: the random scores (float64) and the order (int64).
ORDER_BYTES_PER_KEY = 16
#: Bytes held per (row, draw, size): the metrics of every size, float64.
METRIC_BYTES_PER_SIZE = 8 * 12


@dataclass(frozen=True, kw_only=True)
class Separability(SeparabilityMetrics):
    """Separability of top-N selection, per row and selection size (definitions §2 and §7).

    The metrics of :class:`~tl_geometry.core.metrics.SeparabilityMetrics`, each of shape
    ``[*batch, len(ns)]``, the batch dimensions being those of the weights passed to
    :func:`separability`.

    Attributes
    ----------
    ns : [n] int64
        The selection sizes ``N``.
    """

    ns: Int[Tensor, " n"]


@dataclass(frozen=True)
class PrecisionRecallAtRadius:
    """``P(r, N)`` and ``R(r, N)`` of eq. 2-3 at given radii (definitions §2).

    ``precision`` and ``recall`` have shape ``[*batch, len(ns), n_radii]``; ``precision`` is NaN
    where the closed ball ``B_r(s(N))`` holds no contribution at all.
    """

    ns: Int[Tensor, " n"]
    radii: Float[Tensor, "*batch n r"]
    precision: Float[Tensor, "*batch n r"]
    recall: Float[Tensor, "*batch n r"]


def check_row_inputs(weights: Tensor, values: Tensor) -> None:
    """Raise :class:`InputError` for rows the definitions cannot be applied to."""
    if weights.shape[-1] < 1:
        raise InputError("attention rows must have at least one key (K >= 1), got K = 0")
    if weights.numel() == 0:
        raise InputError(
            f"no attention rows to measure: weights of shape {tuple(weights.shape)} have an empty batch dimension"
        )
    if values.shape[-1] < 1:
        raise InputError("value vectors must have at least one dimension (d_head >= 1), got d_head = 0")
    if not bool(torch.isfinite(weights.abs().amax())):  # amax keeps NaN and inf; faster than isfinite().all()
        raise InputError(
            "attention weights contain NaN or inf: check the model's dtype (fp16 overflow) or "
            "the pattern you passed; separability is undefined for non-finite weights"
        )
    if not bool(torch.isfinite(values.abs().amax())):
        raise InputError("value vectors contain NaN or inf: check the model's dtype or the values you passed")
    if bool((weights < 0).any()):
        raise InputError("attention weights must be non-negative (softmax outputs); got a negative weight")


def _check_row_keys(row_keys: Tensor | None, batch: tuple[int, ...]) -> None:
    if row_keys is None:
        return
    if not isinstance(row_keys, Tensor) or row_keys.is_floating_point() or row_keys.dtype == torch.bool:
        raise InputError("row_keys must be an integer tensor, one key per row (see tl_geometry.core.rankings.row_keys)")
    if tuple(row_keys.shape) != tuple(batch):
        raise InputError(
            f"row_keys of shape {tuple(row_keys.shape)} do not match the rows {tuple(batch)}: give one key per row"
        )


@typechecked
def separability(
    weights: Float[Tensor, "*batch k"],
    values: Float[Tensor, "*batch k d"],
    ns: NsLike = None,
    *,
    rank_by: str = "attention",
    distance: str = "euclidean",
    n_random: int = DEFAULT_N_RANDOM,
    seed: int = 0,
    row_keys: Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Separability:
    """Precision, Recall, radii, F-scores and local output errors of top-N selection (definitions §2, §7).

    Parameters
    ----------
    weights : Tensor of shape [*batch, K]
        Attention weights ``alpha_i`` of each row over its ``K`` keys (non-negative; they need
        not sum to one). Any leading batch dimensions (sequence, head, query...).
    values : Tensor of shape [*batch, K, d]
        Value vectors ``v_i`` of the same keys, already mapped to the query head's key/value
        head (definitions §1).
    ns : None, "all", "log", sequence of int or 1-D int tensor, default None
        Selection sizes ``N``; ``None`` means every ``N`` from 1 to ``K``. See
        :func:`tl_geometry.core.sizes.resolve_ns`.
    rank_by : "attention", "contribution", "random" or "sink_window", default "attention"
        The order that defines ``I_N`` (:mod:`tl_geometry.core.rankings`). ``"random"`` is the control:
        ``n_random`` uniform permutations per row, nested sets within each, each set measured
        around its own ``s(N)``, every metric averaged over the draws.
    distance : "euclidean" or "cosine", default "euclidean"
        ``D_i = ||y_i - s||`` or ``1 - <y_i, s> / (||y_i|| ||s|| + 1e-12)``; balls closed.
    n_random : int, default 16
        Draws per row for ``rank_by="random"`` (checked always, used only there).
    seed : int, default 0
        Seed of the random draws.
    row_keys : int tensor [*batch], optional
        One key per row (:func:`tl_geometry.core.rankings.row_keys`) so that a row's draws do not depend
        on its batch; default: the row's index in the flattened batch.
    dtype : torch.dtype, default torch.float64
        Precision of the decisions: every count and radius is that of float64 distances whatever
        ``dtype`` (float32 or float16 give the same numbers). The engine screens in float32 and
        decides in float64 every key too close to a threshold for float32 to call.
    block_bytes : int, default 8 MiB
        Working-set size of one block of the distance computation; a tuning knob only.

    Returns
    -------
    Separability
        ``ns`` ([n]) and ``precision, recall, r_min, r_max, f_at_rmax, f_at_rmin, retained_mass,
        local_error_del, local_error_ren`` ([*batch, n]), on the device of ``weights``.

    Notes
    -----
    Every row is first multiplied by powers of two (exact in floating point) so that its weights
    sum to at most 1 and its largest value component lies in ``[1/2, 1)``; precision, recall and
    the error ratios do not change under that scaling and the radii are scaled back, so rows of
    any finite magnitude (``weights * 1e200``, float16 values) give the numbers of the definitions.

    Examples
    --------
    >>> import torch
    >>> w = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    >>> v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    >>> res = separability(w, v, [1, 2, 3])
    >>> res.precision.tolist(), res.retained_mass.tolist()
    ([1.0, 0.6666666666666666, 1.0], [0.5, 0.75, 1.0])
    >>> separability(w, v, [1, 2, 3], rank_by="contribution").precision.tolist()
    [1.0, 1.0, 1.0]
    >>> ctrl = separability(w, v, [1, 2], rank_by="random", n_random=4, seed=0)
    >>> ctrl.n_draws, ctrl.precision.shape
    (4, torch.Size([2]))
    """
    rank_by, distance = check_rank_by(rank_by), check_distance(distance)
    n_random, seed = check_n_random(n_random), check_seed(seed)
    check_row_inputs(weights, values)
    _check_row_keys(row_keys, tuple(weights.shape[:-1]))
    n_keys = weights.shape[-1]
    ns_t = resolve_ns(ns, n_keys, device=weights.device)
    n_rows, n_draws = weights.numel() // n_keys, n_random if rank_by == "random" else 1
    check_memory(
        n_rows * n_draws * (n_keys * ORDER_BYTES_PER_KEY + ns_t.shape[0] * METRIC_BYTES_PER_SIZE),
        f"the selection orders and metrics of {n_rows} rows x {n_draws} draws x {n_keys} keys",
        "lower n_random, or pass fewer rows per call" if n_draws > 1 else "pass fewer rows per call",
    )
    w, packing = einops.pack([weights], "* k")
    v, _ = einops.pack([values], "* k d")
    keys = None if row_keys is None else row_keys.reshape(-1).to(device=weights.device, dtype=torch.int64)
    rows = _ScaledRows.of(w, v)
    order = _orders(rows, rank_by, n_draws, seed, keys)  # [R, draws, K]
    metrics = _separability_rows(rows, order, ns_t, distance, dtype, block_bytes)

    def unpack(x: Tensor) -> Tensor:
        mean = einops.reduce(x, "r draw n -> r n", "mean")
        return einops.unpack(mean, packing, "* n")[0]

    return Separability(
        ns=ns_t, **{name: unpack(x) for name, x in metrics.items()}, rank_by=rank_by, distance=distance, n_draws=n_draws
    )


@dataclass(frozen=True)
class _ScaledRows:
    """Rows multiplied by powers of two, exactly: ``weights = 2^-e_w alpha`` (sum <= 1) and
    ``values = 2^-e_v v`` (largest component in ``[1/2, 1)``), both float64; undone by
    ``2^(e_w + e_v)`` for lengths and ``2^e_w`` for masses."""

    weights: Tensor  # [R, K] float64
    values: Tensor  # [R, K, d] float64
    weight_exp: Tensor  # [R] int
    value_exp: Tensor  # [R] int

    @classmethod
    def of(cls, weights: Tensor, values: Tensor) -> "_ScaledRows":
        n_keys = weights.shape[-1]
        w, v = weights.to(torch.float64), values.to(torch.float64)
        weight_exp = torch.frexp(w.amax(dim=-1)).exponent + math.ceil(math.log2(n_keys))
        v_max = v.abs().amax(dim=(-2, -1)) if v.shape[-1] else w.new_zeros(w.shape[0])
        value_exp = torch.frexp(v_max).exponent
        return cls(times_pow2(w, -weight_exp[:, None]), times_pow2(v, -value_exp[:, None, None]), weight_exp, value_exp)

    def length_exp(self) -> Tensor:
        return self.weight_exp + self.value_exp


def _orders(rows: _ScaledRows, rank_by: str, n_draws: int, seed: int, keys: Tensor | None) -> Tensor:
    """The selection order of every row and draw: [R, draws, K]."""
    n_rows, n_keys = rows.weights.shape
    if rank_by != "random":
        return selection_order(ranking_scores(rows.weights, rows.values, rank_by))[:, None, :]
    keys = default_row_keys((n_rows,), rows.weights.device) if keys is None else keys
    return selection_order(uniform_scores(keys, n_keys, draws=n_draws, seed=seed))


@torch.no_grad()
def _separability_rows(
    rows: _ScaledRows, order: Tensor, ns: Tensor, distance: str, dtype: torch.dtype, block_bytes: int
) -> dict[str, Tensor]:
    """The engine on flat rows and their draws (``order``: [R, draws, K]): one [R, draws, G] float64
    tensor per metric.

    Each (row, draw) is put in its selection order once (contributions and weights gathered by
    the order), its centres ``s(N)`` are a running sum along it, and
    :func:`tl_geometry.core.screening.decide` gives the counts and radii of every size with float32
    matrix products shared by all sizes of a block and exact float64 decisions.
    """
    n_rows, n_draws, n_keys = order.shape
    dim = rows.values.shape[-1]
    device = order.device
    out = {name: torch.empty(n_rows, n_draws, ns.shape[0], dtype=torch.float64, device=device) for name in METRICS}
    row_block = balanced_block(n_rows, max(1, 4 * block_bytes // max(1, n_draws * n_keys * dim * 8)))
    n_float = ns.to(torch.float64)
    cosine_eps = COSINE_EPS * pow2(-2 * rows.length_exp())
    for r0 in range(0, n_rows, row_block):
        block = slice(r0, r0 + row_block)
        keys = order[block]  # [r, draw, K]
        n_block = keys.shape[0]
        weights, values = rows.weights[block], rows.values[block]
        y = weights[..., None] * values  # contributions in key order [r, K, d], float64
        decided = decide(y, keys, ns, distance, cosine_eps[block], block_bytes)
        shape = (n_block, n_draws, ns.shape[0])
        k_out, k_in = decided.k_out.view(shape), decided.k_in.view(shape)
        out["precision"][block] = n_float / (n_float + k_out)
        out["recall"][block] = k_in / n_float
        scale = pow2(rows.length_exp()[block])[:, None, None] if distance == "euclidean" else 1.0
        out["r_max"][block] = decided.r_max.view(shape) * scale
        out["r_min"][block] = decided.r_min.view(shape) * scale
        local = _local_columns(weights, keys, ns, rows.weight_exp[block], y, decided.centers.reshape(*shape, dim))
        out["retained_mass"][block], out["local_error_del"][block], out["local_error_ren"][block] = local
    out["f_at_rmax"] = 2 * out["precision"] / (1 + out["precision"])
    out["f_at_rmin"] = 2 * out["recall"] / (1 + out["recall"])
    return out


def _centers(sorted_y: Tensor, ns: Tensor) -> Tensor:
    """``s(N) = sum_{t < N} sorted_y[..., t, :]`` for each ``N`` of ``ns``: [..., K, d] -> [..., G, d].

    A running sum in selection order, so ``s(N)`` does not depend on the other sizes or the batch.
    """
    return torch.cumsum(sorted_y, dim=-2)[..., ns - 1, :]


def _local_columns(
    weights: Tensor, order: Tensor, ns: Tensor, weight_exp: Tensor, y: Tensor, centers: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """``retained_mass``, ``local_error_del``, ``local_error_ren`` [r, draw, G] (definitions §7) of
    rows ``weights`` [r, K] (scaled), orders [r, draw, K], contributions ``y`` [r, K, d] and
    centres [r, draw, G, d]: a running sum of the sorted weights, and the output ``z`` once per row."""
    alpha = torch.gather(weights[:, None, :].expand_as(order), -1, order)  # sorted weights [r, draw, K]
    mass = torch.cumsum(alpha, dim=-1)[..., ns - 1] * pow2(weight_exp)[:, None, None]
    z = y.sum(dim=1)[:, None, None, :]  # the head's output, [r, 1, 1, d]
    return mass, *local_errors(z, centers, mass)


@typechecked
def precision_recall_at_radius(
    weights: Float[Tensor, "*batch k"],
    values: Float[Tensor, "*batch k d"],
    radii: Float[Tensor, " r"] | Float[Tensor, "*batch n r"],
    ns: NsLike = None,
    *,
    dtype: torch.dtype = torch.float64,
    max_block_bytes: int = 64 << 20,
) -> PrecisionRecallAtRadius:
    """``P(r, N)`` and ``R(r, N)`` (eq. 2-3) at arbitrary radii: a precision-recall curve per ``N``.

    ``P(r, N) = |{i in I_N: D_i <= r}| / |{all i: D_i <= r}|`` (NaN for an empty ball) and
    ``R(r, N) = |{i in I_N: D_i <= r}| / N`` with ``D_i = ||alpha_i v_i - s(N)||`` computed
    directly (no Gram expansion), balls closed (definitions §2).

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
    if radii.numel() and not bool((radii >= 0).all()):  # NaN fails too
        raise InputError("radii must be numbers >= 0 (a ball's radius is a distance), got a negative or NaN radius")
    n_keys = weights.shape[-1]
    ns_t = resolve_ns(ns, n_keys, device=weights.device)
    w, packing = einops.pack([weights.to(dtype)], "* k")
    v, _ = einops.pack([values.to(dtype)], "* k d")
    n_rows, n_sizes = w.shape[0], ns_t.shape[0]
    check_memory(
        n_rows * n_sizes * radii.shape[-1] * (8 + 2 * n_keys),
        f"the distances and balls of {n_rows} rows x {n_keys} keys x {n_sizes} sizes x {radii.shape[-1]} radii",
        "pass fewer rows, sizes or radii per call",
    )
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

    return PrecisionRecallAtRadius(ns=ns_t, radii=unpack(radii_out), precision=unpack(precision), recall=unpack(recall))


def _direct_distances(weights: Tensor, values: Tensor, ns: Tensor, max_block_bytes: int) -> Tensor:
    """``D[r, t, g] = ||y_(t) - s(N_g)||`` for keys in selection order ``t``: [R, K, G]."""
    _, contributions = sort_by_weight(weights, values)
    centers = _centers(contributions, ns)  # as the engine forms them
    n_rows, n_keys, dim = contributions.shape
    per_size = n_rows * n_keys * dim * contributions.element_size()
    size_block = max(1, max_block_bytes // max(per_size, 1))
    blocks = [
        torch.linalg.vector_norm(contributions[:, :, None, :] - centers[:, None, g0 : g0 + size_block, :], dim=-1)
        for g0 in range(0, ns.shape[0], size_block)
    ]
    return torch.cat(blocks, dim=-1)
