"""The batched separability route: every head, row, draw and size of a layer in a fixed number of tensor operations.

The route a GPU runs (and the CPU with ``kernel="torch"``; :mod:`tl_geometry.core.engine.dispatch`).
For each row (one query of one head, one ranking draw), with its keys in selection order::

    y_t = alpha_t v_t                      contributions, sorted by score (one stable sort)
    s(N) = sum_{t < N} y_t                 one prefix sum, read at every N of the grid
    D_t(N) = ||y_t - s(N)||                direct float64 distances, every key and size at once
    r_max = max_{t < N} D_t, r_min = min_{N <= t < K} D_t,
    K_out = #{t >= N: D_t <= r_max}, K_in = #{t < N: D_t <= r_min}   (masked reductions)

Nothing reads a tensor's value on the host and no shape depends on a value, so a layer is the
same operations whatever its numbers, and a GPU runs it without synchronising. Rows of different
lengths share one tensor: the keys a row does not see (``length <= key``) score ``-inf``, sort
last and are masked out of every reduction. The distances are the loop reference's (float64,
direct), so the counts are exact; the cost is ``rows x sizes x keys x d`` per layer, taken in
chunks of at most ``max_cells`` (a size hint from the caller).

>>> import torch
>>> w = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64)[:, None, None]   # [b, h, q, k]
>>> v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)[None, :, None]
>>> out = layer_metrics(w, v, torch.tensor([0]), torch.tensor([3]), torch.tensor([[1, 2]]))
>>> out["precision"][0, 0, 0, 0].tolist()
[1.0, 0.6666666666666666]
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.core.engine.screening import direct_distances
from tl_geometry.core.metrics import COMPUTED_METRICS
from tl_geometry.core.numerics import local_errors, pow2, scale_exponents
from tl_geometry.core.rankings import COSINE_EPS, default_row_keys, ranking_scores, uniform_bits

#: Cells (rows x sizes x keys x d) of one chunk when the caller gives no hint, by device type:
#: 2^24 float64 (128 MiB) on a CPU, 2^28 (2 GiB) on a GPU, where fewer, larger operations pay.
DEFAULT_MAX_CELLS = {"cpu": 2**24, "cuda": 2**28}


@torch.no_grad()
def layer_metrics(
    weights: Float[Tensor, "batch head query key"],
    values: Float[Tensor, "batch key kv_head d"],
    kv_head_of: Int[Tensor, " head"],
    lengths: Int[Tensor, " query"],
    ns: Int[Tensor, "query size"],
    *,
    rank_by: str = "attention",
    distance: str = "euclidean",
    n_draws: int = 1,
    seed: int = 0,
    row_keys: Int[Tensor, "batch head query"] | None = None,
    max_cells: int | None = None,
    output_in_key_order: bool = False,
) -> dict[str, Float[Tensor, "batch head query draw size"]]:
    """The per-draw metrics (:data:`~tl_geometry.core.metrics.COMPUTED_METRICS`) of every row of a layer.

    Parameters
    ----------
    weights : [batch, head, query, key]
        Attention rows; row ``(b, h, j)`` sees the keys ``0..lengths[j] - 1`` (later weights are ignored).
    values : [batch, key, kv_head, d]
        The value vectors, shared by the query heads of a key/value head (``kv_head_of``).
    lengths : [query] int64
        How many keys each query row sees (``q + 1`` for query position ``q``).
    ns : [query, size] int64
        Each query's sizes, ``1 <= N <= lengths[j]`` (a grid padded with ``N = lengths[j]``).
    rank_by, distance, n_draws, seed, row_keys
        As :func:`tl_geometry.core.separability.separability`; ``n_draws`` draws of ``"random"``.
    max_cells : int, optional
        At most this many ``rows x sizes x keys x d`` cells per chunk (a memory hint; the
        number of chunks depends on the shapes only); by default :data:`DEFAULT_MAX_CELLS` of the device.
    output_in_key_order : bool
        Add the row's output ``z`` of the local errors in key order (as
        :func:`tl_geometry.core.separability.separability` does) rather than as ``s(K)`` in
        selection order (as :func:`tl_geometry.core.engine.query_engine.separability_queries` does): the
        same number to rounding, each bit for bit that of its compiled route.

    Returns
    -------
    dict of [batch, head, query, draw, size] float64
        ``precision``, ``recall``, ``r_min``, ``r_max``, ``retained_mass``, ``local_error_del``,
        ``local_error_ren``.
    """
    n_batch, n_heads, n_queries, n_keys = weights.shape
    device = weights.device
    n_sizes, dim = ns.shape[1], values.shape[-1]
    scores = _scores(weights, rank_by, n_draws, seed, row_keys)  # [b, h, q, draw, k] or None
    n_rows = n_batch * n_heads * n_queries * n_draws
    # which (batch, head, query, draw) each flat row is: index tensors, no copy of the values per row
    index = torch.arange(n_rows, device=device)
    query_of = (index // n_draws) % n_queries
    batch_of = index // (n_draws * n_queries * n_heads)
    kv_of = kv_head_of.to(device)[(index // (n_draws * n_queries)) % n_heads]
    flat_weights = weights.reshape(n_batch * n_heads * n_queries, n_keys)
    flat_scores = None if scores is None else scores.reshape(n_rows, n_keys)
    if max_cells is None:
        max_cells = DEFAULT_MAX_CELLS.get(device.type, DEFAULT_MAX_CELLS["cpu"])
    chunk = max(1, max_cells // max(1, n_sizes * n_keys * max(dim, 1)))
    parts = []
    for start in range(0, n_rows, chunk):
        rows = slice(start, min(start + chunk, n_rows))
        parts.append(
            _chunk_metrics(
                flat_weights[index[rows] // n_draws],
                values[batch_of[rows], :, kv_of[rows]],
                None if flat_scores is None else flat_scores[rows],
                lengths.to(device)[query_of[rows]],
                ns.to(device)[query_of[rows]],
                rank_by,
                distance,
                output_in_key_order,
            )
        )
    shape = (n_batch, n_heads, n_queries, n_draws, n_sizes)
    return {name: torch.cat([part[name] for part in parts]).reshape(shape) for name in COMPUTED_METRICS}


def _scores(weights: Tensor, rank_by: str, n_draws: int, seed: int, row_keys: Tensor | None) -> Tensor | None:
    """The scores that do not depend on the row's numbers (``"random"``, ``"sink_window"``):
    [batch, head, query, draw, key] float64; None for ``"attention"`` and ``"contribution"``
    (scored from the scaled rows, as the compiled route scores them)."""
    n_batch, n_heads, n_queries, n_keys = weights.shape
    if rank_by == "random":
        keys = default_row_keys((n_batch, n_heads, n_queries), weights.device) if row_keys is None else row_keys
        bits = uniform_bits(keys.to(torch.int64), n_keys, n_draws, seed, compiled=False)
        return bits.to(torch.float64) * 2.0**-53
    if rank_by == "sink_window":
        scores = ranking_scores(weights, None, rank_by)
        return scores[..., None, :].expand(n_batch, n_heads, n_queries, n_draws, n_keys)
    return None


def _chunk_metrics(
    weights: Tensor,
    values: Tensor,
    scores: Tensor | None,
    lengths: Tensor,
    ns: Tensor,
    rank_by: str,
    distance: str,
    output_in_key_order: bool,
) -> dict[str, Tensor]:
    """The metrics of ``r`` rows: weights [r, K], values [r, K, d], scores [r, K] (or None: from the
    scaled rows), lengths [r], ns [r, G]."""
    n_keys, dim = weights.shape[-1], values.shape[-1]
    position = torch.arange(n_keys, device=weights.device)
    seen = position < lengths[:, None]  # [r, K]; in selection order too: unseen keys sort last
    # exact scaling by powers of two (as the compiled route): weights summing to at most 1, values
    # whose largest seen component lies in [1/2, 1); undone on the radii and the masses
    key_w = torch.where(seen, weights.to(torch.float64), 0.0)
    key_v = values.to(torch.float64)
    v_max = torch.where(seen[..., None], key_v.abs(), 0.0).amax(dim=(-2, -1))
    weight_exp, value_exp = scale_exponents(key_w.amax(dim=-1), v_max, lengths)
    key_w = key_w * pow2(-weight_exp)[:, None]
    key_v = key_v * pow2(-value_exp)[:, None, None]
    if scores is None:
        scores = ranking_scores(key_w, key_v, rank_by)
    order = torch.argsort(torch.where(seen, scores, -torch.inf), dim=-1, descending=True, stable=True)
    w = key_w.gather(-1, order)
    y = w[..., None] * key_v.gather(1, order[..., None].expand(-1, -1, dim))  # [r, K, d], in selection order
    sums = torch.cumsum(y, dim=1)  # s(N) = sums[N - 1]: the left-to-right sum of the loop reference
    centers = sums.gather(1, (ns - 1)[..., None].expand(-1, -1, dim))  # [r, G, d]
    if output_in_key_order:  # the row's output z = sum_i y_i: in key order as the loop reference adds it
        total = (key_w[..., None] * key_v).sum(dim=1)[:, None]  # [r, 1, d]
    else:  # or s(K), in selection order
        total = sums.gather(1, (lengths - 1)[:, None, None].expand(-1, 1, dim))
    # the direct float64 distances of the compiled route's re-check and of the loop reference
    n_rows, n_sizes = centers.shape[:2]
    if distance == "euclidean":
        dist = direct_distances(y[:, None], centers[:, :, None], distance, y.new_zeros(()))  # [r, G, K]
    else:  # pairwise rows of [r * G * K, d], as the compiled route measures its cells
        eps = COSINE_EPS * pow2(-2 * (weight_exp + value_exp))
        flat = (n_rows * n_sizes * n_keys, dim)
        dist = direct_distances(
            y[:, None].expand(n_rows, n_sizes, n_keys, dim).reshape(flat),
            centers[:, :, None].expand(n_rows, n_sizes, n_keys, dim).reshape(flat),
            distance,
            eps[:, None, None].expand(n_rows, n_sizes, n_keys).reshape(-1),
        ).reshape(n_rows, n_sizes, n_keys)
    selected = position < ns[..., None]  # [r, G, K]
    others = seen[:, None, :] & ~selected
    r_max = torch.where(selected, dist, -torch.inf).amax(dim=-1)
    r_min = torch.where(others, dist, torch.inf).amin(dim=-1)
    k_out = (others & (dist <= r_max[..., None])).sum(dim=-1)
    k_in = (selected & (dist <= r_min[..., None])).sum(dim=-1)
    n_float = ns.to(torch.float64)
    mass = torch.cumsum(w, dim=-1).gather(-1, ns - 1) * pow2(weight_exp)[:, None]
    error_del, error_ren = local_errors(total, centers, mass)
    scale = pow2(weight_exp + value_exp)[:, None] if distance == "euclidean" else 1.0
    return {
        "precision": n_float / (n_float + k_out),
        "recall": k_in / n_float,
        "r_min": r_min * scale,
        "r_max": r_max * scale,
        "retained_mass": mass,
        "local_error_del": error_del,
        "local_error_ren": error_ren,
    }


__all__ = ["DEFAULT_MAX_CELLS", "layer_metrics"]
