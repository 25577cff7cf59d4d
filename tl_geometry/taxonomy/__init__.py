"""The sink effect and the head taxonomy (definitions §5; paper §4.1-4.2, Appendix A.4).

* :func:`regime_features` — the definitions §5 features of raw attention rows (``c_sink``, ``c_last``,
  ``c_rest``, ``rho_0``, ``cos(s(N), v_0)``, ``cos(s(N), v_L)``, ``||s(N)||`` and its
  leave-one-out variants);
* :class:`TaxonomyObserver` — the same features for every head of a model, streamed inside
  :func:`tl_geometry.capture.hooks.run_streaming` and averaged over sequences (mean and std);
* :func:`classify_heads` — Retriever / Reset / Mixer / Unclassified per (layer, head), with the
  margin, the deciding condition and every feature (:class:`RegimeThresholds` documents the
  thresholds);
* :func:`regime_clusters` — k-means on the standardised Figure 7 features, silhouette per ``k`` and
  agreement (adjusted Rand index, contingency) of ``k = 3`` with both rule modes;
* :func:`join_heads`, :func:`regime_function` — per-head effects (patching, ablation, localised
  loss) joined with the regimes and the separability, and summarised by regime;
* :func:`head_types` — previous-token, duplicate-token, induction and current-token scores
  (TransformerLens' ``head_detector`` definitions on repeated random tokens) beside the regimes;
  :func:`head_type_crosstab`, :func:`regime_agreement` (the same label in two runs);
* :func:`sink_effect` — per ``N``, Pearson and Spearman correlation of recall with ``rho_0``
  across heads (Figure 6);
* :func:`regime_shares` (Figure 8), :func:`regime_pr_curves` (Figure 11) and
  :func:`classification_stability` (labels of two halves of the sequences).
"""

from tl_geometry.taxonomy.accumulate import TABLE_COLUMNS as FEATURE_TABLE_COLUMNS
from tl_geometry.taxonomy.accumulate import FeatureAccumulator
from tl_geometry.taxonomy.classify import (
    ALL_LABELS,
    HEAD_FEATURE_COLUMNS,
    REGIMES,
    UNCLASSIFIED,
    RegimeThresholds,
    classify_heads,
    head_features,
)
from tl_geometry.taxonomy.clusters import STRUCTURE_SILHOUETTE, RegimeClusters, cluster_features, regime_clusters
from tl_geometry.taxonomy.features import RegimeFeatures, regime_features, sink_similarity
from tl_geometry.taxonomy.function import RegimeFunction, join_heads, regime_function
from tl_geometry.taxonomy.head_types import (
    HEAD_TYPES,
    head_type_crosstab,
    head_types,
    regime_agreement,
    repeated_random_tokens,
)
from tl_geometry.taxonomy.observer import TaxonomyObserver, halves
from tl_geometry.taxonomy.sink_effect import average_ranks, pearson, rho0_table, sink_effect, spearman
from tl_geometry.taxonomy.summaries import (
    ClassificationStability,
    classification_stability,
    regime_pr_curves,
    regime_shares,
)
from tl_geometry.taxonomy.tables import regime_feature_table

__all__ = [
    "ALL_LABELS",
    "ClassificationStability",
    "FEATURE_TABLE_COLUMNS",
    "FeatureAccumulator",
    "HEAD_FEATURE_COLUMNS",
    "HEAD_TYPES",
    "REGIMES",
    "RegimeClusters",
    "RegimeFeatures",
    "RegimeFunction",
    "STRUCTURE_SILHOUETTE",
    "RegimeThresholds",
    "TaxonomyObserver",
    "UNCLASSIFIED",
    "average_ranks",
    "classification_stability",
    "classify_heads",
    "cluster_features",
    "halves",
    "head_type_crosstab",
    "head_types",
    "join_heads",
    "head_features",
    "pearson",
    "regime_clusters",
    "regime_feature_table",
    "regime_agreement",
    "regime_features",
    "regime_function",
    "regime_pr_curves",
    "regime_shares",
    "repeated_random_tokens",
    "rho0_table",
    "sink_effect",
    "sink_similarity",
    "spearman",
]
