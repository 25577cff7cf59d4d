"""The theory: envelopes of Theorems 1-2 and Corollary 1, and the phases of ``N`` (definitions §4).

* :func:`bounds` — lower and upper envelopes of precision and recall for attention rows
  (:mod:`tl_geometry.theory.bounds`);
* :class:`BoundsObserver`, :func:`join_bounds`, :func:`envelopes` — the same inside the streaming
  analysis, and the comparison of measured means with the envelopes
  (:mod:`tl_geometry.theory.observer`);
* :func:`size_phases`, :func:`phase_boundaries`, :class:`PiecewiseProfile` — the phases ``I``..``V``
  of the selection size ``N`` under the piecewise attention profile (paper Table 2, where they are
  called regimes; :mod:`tl_geometry.theory.size_phases`).
"""

from tl_geometry.theory.bounds import Bounds, SimilarityModel, bounds, f_bound
from tl_geometry.theory.observer import BOUND_COLUMNS, BOUNDS_COLUMNS, BoundsObserver, envelopes, join_bounds
from tl_geometry.theory.size_phases import PHASES, SEGMENTS, PiecewiseProfile, phase_boundaries, size_phases

__all__ = [
    "BOUND_COLUMNS",
    "BOUNDS_COLUMNS",
    "Bounds",
    "BoundsObserver",
    "PHASES",
    "PiecewiseProfile",
    "SEGMENTS",
    "SimilarityModel",
    "bounds",
    "envelopes",
    "f_bound",
    "join_bounds",
    "phase_boundaries",
    "size_phases",
]
