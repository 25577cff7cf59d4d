"""tl_geometry: how attention heads select tokens, measured in the geometry of value space.

A TransformerLens plugin implementing "Geometric Analysis of Token Selection in Multi-Head
Attention" under the definitions of docs/definitions.md. Start with::

    import tl_geometry as tlg
    model = tlg.load_model("smollm2-135m")
    result = tlg.analyze(model, tlg.corpus.python_docs(n_seqs=8, seq_len=512))
    result.separability
"""

from importlib import metadata as _metadata

from tl_geometry import corpus, diagnostics, intervention, patching, plot, report, taxonomy, theory, vis
from tl_geometry.capture.observers import Observer, RowObserver, SeparabilityObserver
from tl_geometry.core.separability import (
    PrecisionRecallAtRadius,
    Separability,
    precision_recall_at_radius,
    separability,
)
from tl_geometry.core.sizes import log_spaced_ns
from tl_geometry.corpus import corpus_tokens
from tl_geometry.diagnostics import (
    AttentionProfileFit,
    DiagnosticsObserver,
    DiagnosticsTables,
    SimilarityDecay,
    ValueNormStats,
    fit_attention_profile,
    similarity_decay,
    value_norm_stats,
)
from tl_geometry.errors import InputError, ModelError, TLGeometryError
from tl_geometry.intervention import (
    SparsificationCurve,
    geometry_vs_function,
    load_curve,
    localized_loss,
    sparsification_curve,
    top_n_attention,
)
from tl_geometry.models import DEFAULT_MODEL, ModelInfo, describe_model, kv_head_index, load_model
from tl_geometry.pipeline.analysis import analyze
from tl_geometry.pipeline.result import AnalysisResult, load_result
from tl_geometry.pipeline.settings import AnalysisSettings
from tl_geometry.taxonomy import (
    ClassificationStability,
    RegimeClusters,
    RegimeFeatures,
    RegimeFunction,
    RegimeThresholds,
    TaxonomyObserver,
    classification_stability,
    classify_heads,
    head_features,
    join_heads,
    regime_clusters,
    regime_feature_table,
    regime_features,
    regime_function,
    regime_pr_curves,
    regime_shares,
    rho0_table,
    sink_effect,
)
from tl_geometry.theory import (
    Bounds,
    BoundsObserver,
    PiecewiseProfile,
    SimilarityModel,
    bounds,
    envelopes,
    f_bound,
    join_bounds,
    phase_boundaries,
    size_phases,
)

try:  # the version lives in pyproject.toml only; an installed package (editable too) carries it
    __version__ = _metadata.version("tl-geometry")
except _metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

__all__ = [
    "SparsificationCurve",
    "geometry_vs_function",
    "intervention",
    "load_curve",
    "localized_loss",
    "sparsification_curve",
    "top_n_attention",
    "AnalysisResult",
    "AnalysisSettings",
    "ClassificationStability",
    "RegimeClusters",
    "RegimeFeatures",
    "RegimeFunction",
    "RegimeThresholds",
    "TaxonomyObserver",
    "classification_stability",
    "classify_heads",
    "head_features",
    "join_heads",
    "patching",
    "regime_clusters",
    "regime_feature_table",
    "regime_features",
    "regime_function",
    "regime_pr_curves",
    "regime_shares",
    "rho0_table",
    "sink_effect",
    "taxonomy",
    "plot",
    "report",
    "vis",
    "AttentionProfileFit",
    "DiagnosticsObserver",
    "DiagnosticsTables",
    "SimilarityDecay",
    "ValueNormStats",
    "diagnostics",
    "fit_attention_profile",
    "similarity_decay",
    "value_norm_stats",
    "Bounds",
    "BoundsObserver",
    "PiecewiseProfile",
    "SimilarityModel",
    "bounds",
    "envelopes",
    "f_bound",
    "join_bounds",
    "phase_boundaries",
    "size_phases",
    "theory",
    "Observer",
    "RowObserver",
    "SeparabilityObserver",
    "DEFAULT_MODEL",
    "InputError",
    "ModelError",
    "ModelInfo",
    "PrecisionRecallAtRadius",
    "Separability",
    "TLGeometryError",
    "analyze",
    "corpus",
    "corpus_tokens",
    "describe_model",
    "kv_head_index",
    "load_model",
    "load_result",
    "log_spaced_ns",
    "precision_recall_at_radius",
    "separability",
]
