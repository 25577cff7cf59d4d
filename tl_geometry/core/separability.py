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
distances (:mod:`tl_geometry.core.engine.screening`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, overload

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.core.checks import check_row_inputs, typechecked
from tl_geometry.core.engine.query_engine import QueryRows, separability_queries
from tl_geometry.core.engine.rows import DEFAULT_BLOCK_BYTES, Separability, selection_centers, separability_of_rows
from tl_geometry.core.layouts import Layout, causal_rows, check_layout, pack_rows, tl_rows, values_per_head
from tl_geometry.core.rankings import (
    DEFAULT_N_RANDOM,
)
from tl_geometry.core.sizes import DEFAULT_NS, NsLike, clip_ns, resolve_ns, sort_by_weight
from tl_geometry.errors import InputError
from tl_geometry.runtime.budget import check_memory


@dataclass(frozen=True)
class PrecisionRecallAtRadius:
    """``P(r, N)`` and ``R(r, N)`` of eq. 2-3 at given radii (definitions §2).

    ``precision`` and ``recall`` have shape ``[*batch, len(ns), n_radii]``; ``precision`` is NaN
    where the closed ball ``B_r(s(N))`` holds no contribution at all. With ``layout="tl"``, ``ns`` is
    ``[query, n]`` (each query's grid, padded with 0) and the rest ``[batch, head, query, n, r]``.
    """

    ns: Int[Tensor, "*query n"]
    radii: Float[Tensor, "*batch n r"]
    precision: Float[Tensor, "*batch n r"]
    recall: Float[Tensor, "*batch n r"]


@overload
def separability(
    weights: Tensor,
    values: Tensor,
    ns: NsLike = ...,
    *,
    query_positions: Any = ...,
    layout: Literal["rows"] = ...,
    rank_by: str = ...,
    distance: str = ...,
    n_random: int = ...,
    seed: int = ...,
    row_keys: Tensor | None = ...,
    block_bytes: int = ...,
    kernel: str | None = ...,
) -> Separability: ...


@overload
def separability(
    weights: Tensor,
    values: Tensor,
    ns: NsLike = ...,
    *,
    query_positions: Any = ...,
    layout: Literal["tl"],
    rank_by: str = ...,
    distance: str = ...,
    n_random: int = ...,
    seed: int = ...,
    row_keys: Tensor | None = ...,
    block_bytes: int = ...,
    kernel: str | None = ...,
) -> QueryRows: ...


def separability(
    weights: Tensor,
    values: Tensor,
    ns: NsLike = DEFAULT_NS,
    *,
    query_positions: Any = None,
    layout: Layout = "rows",
    rank_by: str = "attention",
    distance: str = "euclidean",
    n_random: int = DEFAULT_N_RANDOM,
    seed: int = 0,
    row_keys: Tensor | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    kernel: str | None = None,
) -> Separability | QueryRows:
    """Precision, Recall, radii, F-scores and local output errors of top-N selection (definitions §2, §7).

    Parameters
    ----------
    weights : Tensor of shape [*batch, K], or [batch, head, query, key] with ``layout="tl"``
        Attention weights ``alpha_i`` of each row over its ``K`` keys (non-negative; they need
        not sum to one). Any leading batch dimensions (sequence, head...). With
        ``layout="tl"``: ``hook_pattern``, whole or some of its query rows.
    values : Tensor of shape [*batch, K, d], or [batch, pos, kv_head, d_head] with ``layout="tl"``
        Value vectors ``v_i`` of the same keys, already mapped to the query head's key/value
        head (definitions §1). With ``layout="tl"``: ``hook_v``, one head per key/value head;
        query head ``h`` reads ``h // (n_heads // n_kv_heads)``, as TransformerLens groups them.
    ns : None, "all", "log", sequence of int or 1-D int tensor, default "log"
        Selection sizes ``N``: ``"log"`` (:data:`~tl_geometry.core.sizes.DEFAULT_NS`, as
        ``analyze``) is the log-spaced grid, ``None`` or ``"all"`` every ``N`` from 1 to ``K``.
        See :func:`tl_geometry.core.sizes.resolve_ns`.
    query_positions : int, "last", "all", list of int or range, optional
        Where each row's query is; a query at ``q`` sees the keys ``0..q`` only.
        ``layout="rows"``: one position for every row (an int; negative counts from ``K``), the
        rows are cut to keys ``0..q``. Not given, a row of more than one key whose last weight is
        exactly 0 raises :class:`InputError`: it looks like the full row of an earlier query, whose
        future keys weigh 0, and measuring them would count them as unselected tokens (if those
        zeros are real weights, pass ``-1``). ``layout="tl"`` (required): the positions to
        measure in the whole pattern (``"last"``, ``"all"``, a list), or the position of each of
        the pattern's query rows; each row is cut to its own keys.
    layout : "rows" or "tl", default "rows"
        ``"rows"``: ``weights [*batch, K]`` and ``values [*batch, K, d]``. ``"tl"``:
        TransformerLens' ``hook_pattern`` and ``hook_v`` as ``run_with_cache`` gives them
        (:mod:`tl_geometry.core.layouts`).
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
    row_keys : int tensor [*batch] ([batch, head, query] with ``layout="tl"``), optional
        One key per row (:func:`tl_geometry.core.rankings.row_keys`) so that a row's draws do not depend
        on its batch; default: the row's index in the flattened batch.
    block_bytes : int, default 8 MiB
        Working-set size of one block of the distance computation; a tuning knob only.
    kernel : "auto", "numba" or "torch", optional
        The route (:func:`tl_geometry.core.engine.dispatch.route`): ``"auto"`` (None) takes the compiled
        float32 screen with its exact float64 re-check on the CPU where numba imports (``"numba"``),
        else the batched tensor route (``"torch"``: float64 direct distances, every row and size at
        once; what a GPU runs). Every count and radius is that of float64 distances whatever the
        inputs' dtype; the routes give the same counts and radii (docs/engine.md).

    Returns
    -------
    Separability or QueryRows
        ``layout="rows"``: a :class:`Separability`, ``ns`` ([n]) and ``precision, recall, r_min, r_max,
        f_at_rmax, f_at_rmin, retained_mass, local_error_del, local_error_ren`` ([*batch, n]), on
        the device of ``weights``. ``layout="tl"``: a
        :class:`~tl_geometry.core.engine.query_engine.QueryRows`, the same metrics ``[batch, head, query, n]``
        for each query's own grid ``ns`` ([query, n], padded with 0 and NaN where ``valid`` is
        false): the rows ``tlg.analyze`` gives.

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

    From a TransformerLens cache (``tl_geometry.testing`` has tiny random models):

    >>> from tl_geometry.testing import tiny_llama_bridge
    >>> model = tiny_llama_bridge()   # grouped-query: 4 heads, 2 key/value heads
    >>> _, cache = model.run_with_cache(torch.randint(3, 200, (1, 12)))
    >>> rows = separability(cache["pattern", 1], cache["v", 1], layout="tl", query_positions=[5, 11])
    >>> rows.precision.shape, rows.ns[0].tolist()   # [batch, head, query, n]; N <= 6 at query 5
    (torch.Size([1, 4, 2, 11]), [1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0])
    >>> v = cache["v", 1][:, :, [0, 0, 1, 1]].transpose(1, 2)   # [batch, head, pos, d] per query head
    >>> separability(cache["pattern", 1][:, :, 5], v)   # query 5's full row: keys 6..11 are future
    Traceback (most recent call last):
    ...
    tl_geometry.errors.InputError: 4 of 4 attention rows end in keys of weight exactly 0, ...
    >>> cut = separability(cache["pattern", 1][:, :, 5], v, query_positions=5)
    >>> torch.equal(cut.precision, rows.precision[:, :, 0, :6])
    True
    """
    if check_layout(layout) == "tl":
        pattern, hook_v, positions, kv_head_of = tl_rows(weights, values, query_positions)
        return separability_queries(
            pattern,
            hook_v,
            positions,
            kv_head_of,
            ns,
            rank_by=rank_by,
            distance=distance,
            n_random=n_random,
            seed=seed,
            row_keys=row_keys,
            kernel=kernel,
        )
    weights, values = causal_rows(weights, values, query_positions)
    return separability_of_rows(
        weights,
        values,
        ns,
        rank_by=rank_by,
        distance=distance,
        n_random=n_random,
        seed=seed,
        row_keys=row_keys,
        block_bytes=block_bytes,
        kernel=kernel,
    )


def precision_recall_at_radius(
    weights: Tensor,
    values: Tensor,
    radii: Tensor,
    ns: NsLike = DEFAULT_NS,
    *,
    query_positions: Any = None,
    layout: Layout = "rows",
    dtype: torch.dtype = torch.float64,
    max_block_bytes: int = 64 << 20,
) -> PrecisionRecallAtRadius:
    """``P(r, N)`` and ``R(r, N)`` (eq. 2-3) at arbitrary radii: a precision-recall curve per ``N``.

    ``P(r, N) = |{i in I_N: D_i <= r}| / |{all i: D_i <= r}|`` (NaN for an empty ball) and
    ``R(r, N) = |{i in I_N: D_i <= r}| / N`` with ``D_i = ||alpha_i v_i - s(N)||`` computed
    directly (no Gram expansion), balls closed (definitions §2).

    Parameters
    ----------
    weights : Tensor of shape [*batch, K], or [batch, head, query, key] with ``layout="tl"``
        Attention weights of each row (as for :func:`separability`).
    values : Tensor of shape [*batch, K, d], or [batch, pos, kv_head, d_head] with ``layout="tl"``
        Value vectors of the same keys (as for :func:`separability`).
    radii : Tensor of shape [r] or [*batch, len(ns), r]
        Radii, either common to all rows and sizes, or one set per row and ``N`` (for instance a
        sweep between each row's ``r_min`` and ``r_max`` from :func:`separability`). With
        ``layout="tl"``: [r] only.
    ns : as in :func:`separability`, default "log".
    query_positions, layout : as for :func:`separability` (a full row of an earlier query is cut
        to its causal keys, or refused when its position is not given).
    dtype : torch.dtype, default torch.float64
    max_block_bytes : int, default 64 MiB
        Largest ``[rows, K, sizes, d]`` block of differences formed at once.

    Returns
    -------
    PrecisionRecallAtRadius
        ``precision`` and ``recall`` of shape [*batch, len(ns), r]. With ``layout="tl"``:
        ``[batch, head, query, n, r]`` over each query's own grid ``ns`` ([query, n], padded with 0
        and NaN).
    """
    if check_layout(layout) == "rows":
        weights, values = causal_rows(weights, values, query_positions)
        return radius_rows(weights, values, radii, ns, dtype=dtype, max_block_bytes=max_block_bytes)
    pattern, hook_v, positions, kv_head_of = tl_rows(weights, values, query_positions)
    if radii.ndim != 1:
        raise InputError(
            f"with layout='tl' the radii must be one list [r] for every row, got shape {tuple(radii.shape)}; "
            "for radii per row and N, call once per query row with layout='rows'"
        )
    per_head = values_per_head(hook_v, kv_head_of)  # [b, h, L, d]
    parts = [
        radius_rows(
            pattern[:, :, j, : q + 1],
            per_head[:, :, : q + 1],
            radii,
            clip_ns(ns, q + 1),
            dtype=dtype,
            max_block_bytes=max_block_bytes,
        )
        for j, q in enumerate(positions)
    ]
    width = max(part.ns.shape[0] for part in parts)
    shape = (*pattern.shape[:2], len(positions), width, radii.shape[0])
    out = {
        name: torch.full(shape, torch.nan, dtype=dtype, device=pattern.device)
        for name in ("radii", "precision", "recall")
    }
    ns_out = torch.zeros(len(positions), width, dtype=torch.int64, device=pattern.device)
    for j, part in enumerate(parts):
        g = part.ns.shape[0]
        ns_out[j, :g] = part.ns
        for name, x in out.items():
            x[:, :, j, :g] = getattr(part, name)
    return PrecisionRecallAtRadius(ns=ns_out, **out)


@typechecked
def radius_rows(
    weights: Float[Tensor, "*batch k"],
    values: Float[Tensor, "*batch k d"],
    radii: Float[Tensor, " r"] | Float[Tensor, "*batch n r"],
    ns: NsLike = DEFAULT_NS,
    *,
    dtype: torch.dtype = torch.float64,
    max_block_bytes: int = 64 << 20,
) -> PrecisionRecallAtRadius:
    """:func:`precision_recall_at_radius` of rows ``weights [*batch, K]``, ``values [*batch, K, d]``
    measured over every key."""
    check_row_inputs(weights, values)
    if radii.numel() and not bool((radii >= 0).all()):  # NaN fails too
        raise InputError("radii must be numbers >= 0 (a ball's radius is a distance), got a negative or NaN radius")
    n_keys = weights.shape[-1]
    ns_t = resolve_ns(ns, n_keys, device=weights.device)
    w, packing = pack_rows(weights.to(dtype), 1)
    v, _ = pack_rows(values.to(dtype), 2)
    n_rows, n_sizes = w.shape[0], ns_t.shape[0]
    check_memory(
        n_rows * n_sizes * radii.shape[-1] * (8 + 2 * n_keys),
        f"the distances and balls of {n_rows} rows x {n_keys} keys x {n_sizes} sizes x {radii.shape[-1]} radii",
        "pass fewer rows, sizes or radii per call",
    )
    if radii.ndim == 1:
        r = einops.repeat(radii.to(dtype), "r -> rows n r", rows=n_rows, n=n_sizes)
    else:
        r, _ = pack_rows(radii.to(dtype), 2)
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
    centers = selection_centers(contributions, ns)  # as the engine forms them
    n_rows, n_keys, dim = contributions.shape
    per_size = n_rows * n_keys * dim * contributions.element_size()
    size_block = max(1, max_block_bytes // max(per_size, 1))
    blocks = [
        torch.linalg.vector_norm(contributions[:, :, None, :] - centers[:, None, g0 : g0 + size_block, :], dim=-1)
        for g0 in range(0, ns.shape[0], size_block)
    ]
    return torch.cat(blocks, dim=-1)
