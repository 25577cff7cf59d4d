"""The per-row pipeline: separability of rows ``weights [*batch, K]``, ``values [*batch, K, d]``,
one query position per row, every ranking of a call on rows checked and scaled once.

:func:`tl_geometry.core.separability` and the layer's door
(:func:`tl_geometry.core.engine.layer.separability_of_layer`) call it; the route inside is
:func:`tl_geometry.core.engine.dispatch.route`'s: the compiled float32 screen with its float64
re-check (:mod:`~tl_geometry.core.engine.screening`) or the batched route
(:mod:`~tl_geometry.core.engine.batched`). The derivations are in docs/engine.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.core.checks import check_row_inputs, typechecked
from tl_geometry.core.engine.batched import layer_metrics
from tl_geometry.core.engine.dispatch import route
from tl_geometry.core.engine.fused_rows import scaled_values
from tl_geometry.core.engine.screening import balanced_block, decide
from tl_geometry.core.layouts import pack_rows
from tl_geometry.core.metrics import METRICS, SeparabilityMetrics
from tl_geometry.core.numerics import local_errors, pow2, scale_exponents, times_pow2
from tl_geometry.core.rankings import (
    COSINE_EPS,
    DEFAULT_N_RANDOM,
    check_distance,
    check_n_random,
    check_rank_by,
    check_rankings,
    check_seed,
    default_row_keys,
    ranking_scores,
    selection_order,
    uniform_order,
)
from tl_geometry.core.sizes import DEFAULT_NS, NsLike, resolve_ns
from tl_geometry.errors import InputError
from tl_geometry.runtime.budget import check_memory
from tl_geometry.runtime.workspace import WORKSPACE

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
def separability_of_rows(
    weights: Float[Tensor, "*batch k"],
    values: Float[Tensor, "*batch k d"],
    ns: NsLike = DEFAULT_NS,
    *,
    rank_by: str = "attention",
    distance: str = "euclidean",
    n_random: int = DEFAULT_N_RANDOM,
    seed: int = 0,
    row_keys: Tensor | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    kernel: str | None = None,
) -> Separability:
    """:func:`separability` of rows ``weights [*batch, K]``, ``values [*batch, K, d]`` measured over every key."""
    (result,) = separability_rankings(
        weights,
        values,
        ns,
        check_rank_by(rank_by),
        distance=distance,
        n_random=n_random,
        seed=seed,
        row_keys=row_keys,
        block_bytes=block_bytes,
        kernel=kernel,
    ).values()
    return result


@typechecked
def separability_rankings(
    weights: Float[Tensor, "*batch k"],
    values: Float[Tensor, "*batch k d"],
    ns: NsLike = DEFAULT_NS,
    rank_by: Any = ("attention",),
    *,
    distance: str = "euclidean",
    n_random: int = DEFAULT_N_RANDOM,
    seed: int = 0,
    row_keys: Tensor | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    kernel: str | None = None,
) -> dict[str, Separability]:
    """:func:`separability_of_rows` for each of the rankings ``rank_by`` (one name or a sequence, as
    ``tlg.analyze`` takes them), keyed by ranking, each once, in the order given: the same results
    as one call per ranking, with the rows checked and scaled once (``analyze`` measures the attention ranking
    and the random control of the same rows).

    >>> import torch
    >>> w, v = torch.tensor([0.5, 0.25, 0.25]), torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> both = separability_rankings(w, v, [1, 2], ("attention", "random"), n_random=4)
    >>> list(both), both["attention"].precision.tolist()
    (['attention', 'random'], [1.0, 0.6666666666666666])
    >>> torch.equal(both["random"].recall, separability_of_rows(w, v, [1, 2], rank_by="random", n_random=4).recall)
    True
    """
    rankings = check_rankings(rank_by)
    distance, path = check_distance(distance), route(weights.device, kernel)
    n_random, seed = check_n_random(n_random), check_seed(seed)
    check_row_inputs(weights, values)
    _check_row_keys(row_keys, tuple(weights.shape[:-1]))
    n_keys = weights.shape[-1]
    ns_t = resolve_ns(ns, n_keys, device=weights.device)
    n_rows = weights.numel() // n_keys
    n_draws = {name: n_random if name == "random" else 1 for name in rankings}
    most = max(n_draws.values())  # one ranking at a time: the largest sets the peak
    check_memory(
        n_rows * most * (n_keys * ORDER_BYTES_PER_KEY + ns_t.shape[0] * METRIC_BYTES_PER_SIZE),
        f"the selection orders and metrics of {n_rows} rows x {most} draws x {n_keys} keys",
        "lower n_random, or pass fewer rows per call" if most > 1 else "pass fewer rows per call",
    )
    w, packing = pack_rows(weights, 1)
    v, _ = pack_rows(values, 2)
    keys = None if row_keys is None else row_keys.reshape(-1).to(device=weights.device, dtype=torch.int64)
    rows = _ScaledRows.of(w, v, compiled=True) if path == "numba" else None

    def unpack(x: Tensor) -> Tensor:
        mean = einops.reduce(x, "r draw n -> r n", "mean")
        return einops.unpack(mean, packing, "* n")[0]

    results = {}
    for name in rankings:
        if rows is None:  # the batched route: the rows as one query of one head each
            metrics = _batched_rows(w, v, ns_t, name, distance, n_draws[name], seed, keys)
        else:
            order = _orders(rows, name, n_draws[name], seed, keys)  # [R, draws, K]
            metrics = _separability_rows(rows, order, ns_t, distance, block_bytes)
        results[name] = Separability(
            ns=ns_t,
            **{metric: unpack(x) for metric, x in metrics.items()},
            rank_by=name,
            distance=distance,
            n_draws=n_draws[name],
        )
    return results


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
    def of(cls, weights: Tensor, values: Tensor, compiled: bool = False) -> "_ScaledRows":
        """``compiled``: the values' product by ``2^-e`` in one numba walk (CPU, float32 or float64)."""
        n_keys = weights.shape[-1]
        w = weights.to(torch.float64)
        # in the values' own dtype (float32: half the bytes): abs, max and the widening are exact
        v_max = values.abs().amax(dim=(-2, -1)).to(torch.float64) if values.shape[-1] else w.new_zeros(w.shape[0])
        weight_exp, value_exp = scale_exponents(w.amax(dim=-1), v_max, torch.tensor(n_keys))
        native = values.device.type == "cpu" and values.dtype in (torch.float32, torch.float64)
        if compiled and native and bool((value_exp.abs() <= 1000).all()):
            v = torch.from_numpy(scaled_values(values.detach().contiguous().numpy(), value_exp.numpy()))
        else:
            v = times_pow2(values.to(torch.float64), -value_exp[:, None, None])
        return cls(times_pow2(w, -weight_exp[:, None]), v, weight_exp, value_exp)

    def length_exp(self) -> Tensor:
        return self.weight_exp + self.value_exp


def _batched_rows(
    weights: Tensor,
    values: Tensor,
    ns: Tensor,
    rank_by: str,
    distance: str,
    n_draws: int,
    seed: int,
    keys: Tensor | None,
) -> dict[str, Tensor]:
    """:func:`tl_geometry.core.engine.batched.layer_metrics` on flat rows (weights [R, K], values [R, K, d]):
    one [R, draws, G] float64 tensor per metric."""
    n_rows, n_keys = weights.shape
    out = layer_metrics(
        weights[:, None, None],
        values[:, :, None],
        torch.zeros(1, dtype=torch.int64, device=weights.device),
        torch.full((1,), n_keys, dtype=torch.int64, device=weights.device),
        ns[None],
        rank_by=rank_by,
        distance=distance,
        n_draws=n_draws,
        seed=seed,
        row_keys=None if keys is None else keys[:, None, None],
        output_in_key_order=True,
    )
    out = {name: x[:, 0, 0] for name, x in out.items()}
    out["f_at_rmax"] = 2 * out["precision"] / (1 + out["precision"])
    out["f_at_rmin"] = 2 * out["recall"] / (1 + out["recall"])
    return out


def _orders(rows: _ScaledRows, rank_by: str, n_draws: int, seed: int, keys: Tensor | None) -> Tensor:
    """The selection order of every row and draw: [R, draws, K]."""
    n_rows, n_keys = rows.weights.shape
    if rank_by != "random":
        return selection_order(ranking_scores(rows.weights, rows.values, rank_by))[:, None, :]
    keys = default_row_keys((n_rows,), rows.weights.device) if keys is None else keys
    return uniform_order(keys, n_keys, draws=n_draws, seed=seed)


@torch.no_grad()
def _separability_rows(
    rows: _ScaledRows, order: Tensor, ns: Tensor, distance: str, block_bytes: int
) -> dict[str, Tensor]:
    """The engine on flat rows and their draws (``order``: [R, draws, K]): one [R, draws, G] float64
    tensor per metric.

    Each (row, draw) is put in its selection order once (contributions and weights gathered by
    the order), its centres ``s(N)`` are a running sum along it, and
    :func:`tl_geometry.core.engine.screening.decide` gives the counts and radii of every size with float32
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
        # contributions in key order [r, K, d], float64 (a work tensor: no fresh pages on every call)
        y = torch.mul(
            weights[..., None], values, out=WORKSPACE.get("contributions", values.shape, values.dtype, device)
        )
        decided = decide(y, keys, ns, distance, cosine_eps[block], block_bytes, kernel="numba")
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


def selection_centers(sorted_y: Tensor, ns: Tensor) -> Tensor:
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
    work = WORKSPACE.get("local_difference", tuple(centers.shape), centers.dtype, centers.device)
    return mass, *local_errors(z, centers, mass, work)
