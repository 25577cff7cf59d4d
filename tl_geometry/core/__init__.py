"""The tensor maths of token selection: rankings, the ``N`` grids, separability and its engines.

No model, no files: tensors in, tensors out. Everything above this layer builds on it.

* :mod:`~tl_geometry.core.rankings` — the orders that define the top-``N`` set ``I_N``;
* :mod:`~tl_geometry.core.sizes` — the grids of selection sizes ``N``;
* :mod:`~tl_geometry.core.separability` — precision, recall and F-scores of one row per call;
* :mod:`~tl_geometry.core.query_engine` — the same for every query position of a window at once;
* :mod:`~tl_geometry.core.screening` — the float32 screen with an exact float64 re-check;
* :mod:`~tl_geometry.core.numerics` — the shared numerics (accumulator dtype, exact scaling, std);
* :mod:`~tl_geometry.core.checks` — run-time shape checks, integer tests and the rows' checks;
* :mod:`~tl_geometry.core.layouts` — which keys a row is measured over: query positions and
  TransformerLens' layouts (``layout="tl"``);
* :mod:`~tl_geometry.core.threads` — torch's CPU threads during an analysis: the CPUs free now.
"""

from tl_geometry.core.query_engine import separability_queries
from tl_geometry.core.separability import (
    PrecisionRecallAtRadius,
    Separability,
    precision_recall_at_radius,
    separability,
)
from tl_geometry.core.sizes import DEFAULT_NS, log_spaced_ns, resolve_ns

__all__ = [
    "DEFAULT_NS",
    "PrecisionRecallAtRadius",
    "Separability",
    "log_spaced_ns",
    "precision_recall_at_radius",
    "resolve_ns",
    "separability",
    "separability_queries",
]
