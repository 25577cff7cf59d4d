"""One analysis from settings to result: settings, plan, batch loop, result, torchrun.

``analyze`` = :class:`AnalysisSettings` -> :func:`place_model` -> :func:`plan_analysis` ->
:func:`run_analysis`; under torchrun each rank runs :func:`run_sharded` instead of the last step.
:func:`analyze_cache` runs the same loop over an ``ActivationCache`` instead of forward passes.
"""

from tl_geometry.pipeline.analysis import analyze
from tl_geometry.pipeline.cache import analyze_cache
from tl_geometry.pipeline.loop import run_analysis
from tl_geometry.pipeline.plan import AnalysisPlan, place_model, plan_analysis
from tl_geometry.pipeline.result import AnalysisResult, load_result
from tl_geometry.pipeline.settings import AnalysisSettings
from tl_geometry.pipeline.torchrun import World, run_sharded

__all__ = [
    "analyze_cache",
    "AnalysisPlan",
    "AnalysisResult",
    "AnalysisSettings",
    "World",
    "analyze",
    "load_result",
    "place_model",
    "plan_analysis",
    "run_analysis",
    "run_sharded",
]
