"""The tensor maths of token selection: rankings, the ``N`` grids, separability and its engines.

No model, no files: tensors in, tensors out. Everything above this layer builds on it.

* :mod:`~tl_geometry.core.rankings` — the orders that define the top-``N`` set ``I_N``;
* :mod:`~tl_geometry.core.stable_order` — that order from numpy's vectorised sort, ties in key order;
* :mod:`~tl_geometry.core.ranking_checks` — the rankings and distances by name, their checks (no torch);
* :mod:`~tl_geometry.core.sizes` — the grids of selection sizes ``N``;
* :mod:`~tl_geometry.core.separability` — precision, recall and F-scores of top-``N`` selection
  (``tlg.separability``, ``tlg.precision_recall_at_radius``);
* :mod:`~tl_geometry.core.engine` — the separability engine, in one folder: its route decided in one
  module (``engine.dispatch``), one door for a layer (``engine.layer``), the per-row and the block
  pipelines (``engine.rows``, ``engine.query_engine``), the float32 screen and its compiled passes
  (``engine.screening``, ``engine.fused_rows``, ``engine.fused``) and the device route
  (``engine.batched``);
* :mod:`~tl_geometry.core.compiled` — whether numba's compiled passes run here, per helper;
* :mod:`~tl_geometry.core.numerics` — the shared numerics (accumulator dtype, exact scaling, std);
* :mod:`~tl_geometry.core.checks` — run-time shape checks, integer tests and the rows' checks;
* :mod:`~tl_geometry.core.layouts` — which keys a row is measured over: query positions and
  TransformerLens' layouts (``layout="tl"``);
* :mod:`~tl_geometry.core.threads` — moved to :mod:`tl_geometry.runtime.threads` (a re-export);
* :mod:`~tl_geometry.core.progress` — the package's progress bar (the notebook's widget only where it can draw).

The process's tuning (threads, allocator, work tensors, memory budget) is :mod:`tl_geometry.runtime`.

``tl_geometry.core.separability`` is the module; the function is ``tlg.separability``
(``tl_geometry.core.separability.separability``).
"""

from typing import TYPE_CHECKING

from tl_geometry.lazy import lazy_names

if TYPE_CHECKING:
    from tl_geometry.core.engine.query_engine import separability_queries
    from tl_geometry.core.engine.rows import Separability
    from tl_geometry.core.separability import PrecisionRecallAtRadius, precision_recall_at_radius
    from tl_geometry.core.size_names import DEFAULT_NS
    from tl_geometry.core.sizes import log_spaced_ns, resolve_ns

#: The module that holds each name of ``__all__``; a name loads its module on first use, so that
#: importing one module of ``core`` (``ranking_checks``) does not import torch.
HOMES = {
    "DEFAULT_NS": "tl_geometry.core.size_names",
    "PrecisionRecallAtRadius": "tl_geometry.core.separability",
    "Separability": "tl_geometry.core.engine.rows",
    "log_spaced_ns": "tl_geometry.core.sizes",
    "precision_recall_at_radius": "tl_geometry.core.separability",
    "resolve_ns": "tl_geometry.core.sizes",
    "separability_queries": "tl_geometry.core.engine.query_engine",
}


__getattr__ = lazy_names(globals(), HOMES)


__all__ = [
    "DEFAULT_NS",
    "PrecisionRecallAtRadius",
    "Separability",
    "log_spaced_ns",
    "precision_recall_at_radius",
    "resolve_ns",
    "separability_queries",
]
