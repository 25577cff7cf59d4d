"""``SeparabilityMetrics``: the nine per-row measurements every separability engine returns.

One top-``N`` selection of a row, for each size ``N`` (definitions §2 and §7)::

    precision = N / (N + K_out)       recall = K_in / N       f = 2 x / (1 + x)
    retained_mass = sum_{i in I_N} alpha_i
    local_error_del = ||z - s(N)|| / ||z||,   local_error_ren = ||z - s(N) / M_S|| / ||z||

:class:`~tl_geometry.core.engine.rows.Separability` (one row per call) and
:class:`~tl_geometry.core.engine.query_engine.QueryRows` (every query of a window) extend it with their
own indexing; the row tables' columns are named after :data:`METRICS` (docs/columns.md).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

from jaxtyping import Float
from torch import Tensor


@dataclass(frozen=True, kw_only=True)
class SeparabilityMetrics:
    """The metrics of a top-``N`` selection, one tensor each, trailing dimension ``n`` (the sizes).

    Attributes
    ----------
    precision : ``P(r_max(N), N) = N / (N + K_out)``.
    recall : ``R(r_min(N), N) = K_in / N``; 1 at ``N = K``.
    r_min : ``min_{j not in I_N} D_j``; ``+inf`` at ``N = K``.
    r_max : ``max_{i in I_N} D_i``; 0 at ``N = 1``.
    f_at_rmax : ``2 precision / (1 + precision)``, the F-score at ``r_max`` (Corollary 1).
    f_at_rmin : ``2 recall / (1 + recall)``, the F-score at ``r_min`` (Corollary 1).
    retained_mass : ``M_S = sum_{i in I_N} alpha_i`` (definitions §7).
    local_error_del : ``||z - s(N)|| / ||z||`` with ``z = sum_i y_i`` the row's output (NaN if ``z = 0``).
    local_error_ren : ``||z - s(N) / M_S|| / ||z||`` (NaN if ``z = 0`` or ``M_S = 0``).
    rank_by, distance : the ranking and the distance used.
    n_draws : draws averaged per row (``n_random`` for ``"random"``, else 1); with several, every
        metric is the mean of the per-draw metrics (each draw around its own ``s(N)``).
    """

    precision: Float[Tensor, "..."]
    recall: Float[Tensor, "..."]
    r_min: Float[Tensor, "..."]
    r_max: Float[Tensor, "..."]
    f_at_rmax: Float[Tensor, "..."]
    f_at_rmin: Float[Tensor, "..."]
    retained_mass: Float[Tensor, "..."]
    local_error_del: Float[Tensor, "..."]
    local_error_ren: Float[Tensor, "..."]
    rank_by: str = "attention"
    distance: str = "euclidean"
    n_draws: int = 1


#: The metric tensors of :class:`SeparabilityMetrics`, in order.
METRICS: list[str] = [f.name for f in fields(SeparabilityMetrics) if f.default is MISSING]
#: Precision, recall, the radii and the F-scores: how well the selection separates.
SEPARABILITY_METRICS: list[str] = METRICS[:6]
#: What the selection keeps of the row's output (definitions §7).
LOCAL_ERROR_METRICS: list[str] = METRICS[6:]
#: The metrics computed per draw; the F-scores follow from precision and recall.
COMPUTED_METRICS: list[str] = [m for m in METRICS if not m.startswith("f_")]

__all__ = ["COMPUTED_METRICS", "LOCAL_ERROR_METRICS", "METRICS", "SEPARABILITY_METRICS", "SeparabilityMetrics"]
