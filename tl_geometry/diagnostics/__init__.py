"""Assumption diagnostics (definitions §3; paper §3.1-3.3, Figures 2-4).

Do a model's values and weights satisfy the three assumptions behind the bounds?

* :func:`value_norm_stats` — Assumption 1: stable value norms, compressed sink
  (``sink_ratio`` = the paper's ``lambda``, ``norm_cv``; per-position mean norms, Fig. 2);
* :func:`similarity_decay` — Assumption 2: ``cos(v_i, v_j) ~ exp(-beta |i - j|)``
  (``c(k)``, ``beta``, ``mae``, ``share_negative``) and the sink similarity ``rho_0`` (Fig. 3);
* :func:`fit_attention_profile` — Assumption 3: sink, plateau, oscillation, recency
  (``p_sink, p_base, eta_osc, omega, eta_exp, T1, T2, fit_error``; Fig. 4);
* :class:`DiagnosticsObserver` — all three, layer by layer, inside
  :func:`tl_geometry.capture.hooks.run_streaming`, with mergeable accumulators.

Each function is the one-batch case of its accumulator (:class:`NormAccumulator`,
:class:`SimilarityAccumulator`, :class:`ProfileAccumulator`), which ``update`` / ``merge`` /
``result`` and save with ``state_dict``.
"""

from tl_geometry.diagnostics.norms import NormAccumulator, ValueNormStats, value_norm_stats
from tl_geometry.diagnostics.observer import DiagnosticsObserver, DiagnosticsTables
from tl_geometry.diagnostics.profile import AttentionProfileFit, ProfileAccumulator, fit_attention_profile
from tl_geometry.diagnostics.similarity import SimilarityAccumulator, SimilarityDecay, similarity_decay

__all__ = [
    "AttentionProfileFit",
    "DiagnosticsObserver",
    "DiagnosticsTables",
    "NormAccumulator",
    "ProfileAccumulator",
    "SimilarityAccumulator",
    "SimilarityDecay",
    "ValueNormStats",
    "fit_attention_profile",
    "similarity_decay",
    "value_norm_stats",
]
