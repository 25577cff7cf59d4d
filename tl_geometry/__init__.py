"""tl_geometry: how attention heads select tokens, measured in the geometry of value space.

A TransformerLens plugin for "Geometric Analysis of Token Selection in Multi-Head Attention"
(definitions in docs/definitions.md). The top level holds the verbs a notebook types; each
layer's sub-package holds the rest (docs/architecture.md)::

    import tl_geometry as tlg
    model = tlg.load_model("smollm2-135m")
    result = tlg.analyze(model, tlg.corpus.python_docs(n_seqs=8, seq_len=512))
    result.separability                      # a tidy table
    tlg.plot.separability_by_n(result)       # a figure

Sub-packages load on first use: ``tlg.plot``, ``tlg.report``, ``tlg.diagnostics``,
``tlg.theory``, ``tlg.taxonomy``, ``tlg.intervention`` (``tlg.intervention.patching``),
``tlg.core``, ``tlg.capture``, ``tlg.pipeline``, ``tlg.io``, ``tlg.testing``.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from tl_geometry import moved

if TYPE_CHECKING:
    from tl_geometry import corpus
    from tl_geometry.competition import context_scaling, head_budgets, supporting_fact
    from tl_geometry.core.separability import precision_recall_at_radius, separability
    from tl_geometry.core.sizes import log_spaced_ns
    from tl_geometry.corpus import corpus_tokens
    from tl_geometry.errors import InputError, ModelError, TLGeometryError
    from tl_geometry.intervention import (
        SparsificationCurve,
        geometry_vs_function,
        load_curve,
        localized_loss,
        sparsification_curve,
        top_n_attention,
    )
    from tl_geometry.models import ModelInfo, describe_model, load_model
    from tl_geometry.pipeline.analysis import analyze
    from tl_geometry.pipeline.cache import analyze_cache
    from tl_geometry.pipeline.result import AnalysisResult, load_result
    from tl_geometry.pipeline.settings import AnalysisSettings
    from tl_geometry.taxonomy import classify_heads, head_types, join_heads, regime_clusters, regime_function

#: The module that holds each top-level name. A name loads its module on first use: ``import
#: tl_geometry`` imports neither torch nor pandas, and ``tl-geometry --help`` stays fast.
HOMES = {
    "load_model": "tl_geometry.models",
    "describe_model": "tl_geometry.models",
    "ModelInfo": "tl_geometry.models",
    "corpus_tokens": "tl_geometry.corpus",
    "analyze": "tl_geometry.pipeline.analysis",
    "analyze_cache": "tl_geometry.pipeline.cache",
    "AnalysisSettings": "tl_geometry.pipeline.settings",
    "AnalysisResult": "tl_geometry.pipeline.result",
    "load_result": "tl_geometry.pipeline.result",
    "separability": "tl_geometry.core.separability",
    "precision_recall_at_radius": "tl_geometry.core.separability",
    "log_spaced_ns": "tl_geometry.core.sizes",
    "top_n_attention": "tl_geometry.intervention",
    "sparsification_curve": "tl_geometry.intervention",
    "SparsificationCurve": "tl_geometry.intervention",
    "load_curve": "tl_geometry.intervention",
    "localized_loss": "tl_geometry.intervention",
    "geometry_vs_function": "tl_geometry.intervention",
    "context_scaling": "tl_geometry.competition",
    "supporting_fact": "tl_geometry.competition",
    "head_budgets": "tl_geometry.competition",
    "classify_heads": "tl_geometry.taxonomy",
    "regime_clusters": "tl_geometry.taxonomy",
    "join_heads": "tl_geometry.taxonomy",
    "regime_function": "tl_geometry.taxonomy",
    "head_types": "tl_geometry.taxonomy",
    "TLGeometryError": "tl_geometry.errors",
    "InputError": "tl_geometry.errors",
    "ModelError": "tl_geometry.errors",
}

#: From pyproject.toml, as the installed package (editable too) carries it (``0+unknown`` in a source tree never installed).
__version__ = import_module("tl_geometry.io.environment").package_version()

#: Sub-packages and modules imported on first attribute access (``tlg.plot`` imports plotly only then).
SUBPACKAGES = (
    "capture",
    "corpus",
    "cli",
    "competition",
    "core",
    "diagnostics",
    "intervention",
    "io",
    "pipeline",
    "plot",
    "report",
    "taxonomy",
    "testing",
    "theory",
)

moved.install_finder()


def __getattr__(name: str) -> Any:
    if name in HOMES:
        value = getattr(import_module(HOMES[name]), name)
        globals()[name] = value  # once: later lookups do not come here
        return value
    if name in SUBPACKAGES:
        return import_module(f"tl_geometry.{name}")
    return moved.moved_attribute(__name__, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *HOMES, *SUBPACKAGES})


__all__ = [
    # models and text
    "load_model",
    "describe_model",
    "ModelInfo",
    "corpus",
    "corpus_tokens",
    # the analysis
    "analyze",
    "analyze_cache",
    "AnalysisSettings",
    "AnalysisResult",
    "load_result",
    # the tensor functions
    "separability",
    "precision_recall_at_radius",
    "log_spaced_ns",
    # the intervention
    "top_n_attention",
    "sparsification_curve",
    "SparsificationCurve",
    "load_curve",
    "localized_loss",
    "geometry_vs_function",
    # competition and budgets
    "context_scaling",
    "supporting_fact",
    "head_budgets",
    # head regimes
    "classify_heads",
    "regime_clusters",
    "join_heads",
    "regime_function",
    "head_types",
    # errors
    "TLGeometryError",
    "InputError",
    "ModelError",
    # figures and the report
    "plot",
    "report",
]
