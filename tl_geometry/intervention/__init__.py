"""The top-``N`` attention intervention and what it does to the loss (definitions §8).

* :func:`top_n_attention` — a context manager restricting every causal query to its top-``N`` keys;
* :func:`sparsification_curve` — ``delta_nll_rel(N)`` by ranking and renormalisation, with
  :meth:`SparsificationCurve.effective_set_size` (``N*_tau``);
* :func:`localized_loss` — one layer or one head restricted at a time;
* :func:`gradient_sensitivity` — the first-order predictor ``S(N)`` of the loss change (one backward pass);
* :func:`geometry_vs_function` — Spearman's ``rho`` between separability and loss;
* :mod:`~tl_geometry.intervention.patching` — activation patching per head (exact, stacked in the batch, and
  attribution patching from one backward pass; ``[n_layers, n_heads]`` tensors) and mean ablation.
"""

from tl_geometry.intervention import patching
from tl_geometry.intervention.context import TopNAttention, top_n_attention
from tl_geometry.intervention.curve import SparsificationCurve, load_curve, sparsification_curve
from tl_geometry.intervention.function import geometry_vs_function
from tl_geometry.intervention.localized import localized_loss
from tl_geometry.intervention.restrict import restrict_pattern
from tl_geometry.intervention.sensitivity import gradient_sensitivity

__all__ = [
    "SparsificationCurve",
    "TopNAttention",
    "geometry_vs_function",
    "gradient_sensitivity",
    "load_curve",
    "localized_loss",
    "patching",
    "restrict_pattern",
    "sparsification_curve",
    "top_n_attention",
]
