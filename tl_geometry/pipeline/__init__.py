"""One analysis from settings to result: settings, plan, batch loop, result, torchrun.

``analyze`` = :class:`AnalysisSettings` -> :func:`place_model` -> :func:`plan_analysis` ->
:func:`run_analysis`; under torchrun each rank runs :func:`run_sharded` instead of the last step.
:func:`analyze_cache` runs the same loop over an ``ActivationCache`` instead of forward passes.
The names load their modules on first use: ``tl-geometry --help`` reads
:mod:`~tl_geometry.pipeline.settings` without importing torch.
"""

from typing import TYPE_CHECKING

from tl_geometry.lazy import lazy_names

if TYPE_CHECKING:
    from tl_geometry.pipeline.analysis import analyze
    from tl_geometry.pipeline.cache import analyze_cache
    from tl_geometry.pipeline.loop import run_analysis
    from tl_geometry.pipeline.plan import AnalysisPlan, place_model, plan_analysis
    from tl_geometry.pipeline.result import AnalysisResult, load_result
    from tl_geometry.pipeline.settings import AnalysisSettings
    from tl_geometry.pipeline.torchrun import World, run_sharded

#: The module that holds each name of ``__all__`` (imported on first use).
HOMES = {
    "AnalysisPlan": "tl_geometry.pipeline.plan",
    "AnalysisResult": "tl_geometry.pipeline.result",
    "AnalysisSettings": "tl_geometry.pipeline.settings",
    "World": "tl_geometry.pipeline.torchrun",
    "analyze": "tl_geometry.pipeline.analysis",
    "analyze_cache": "tl_geometry.pipeline.cache",
    "load_result": "tl_geometry.pipeline.result",
    "place_model": "tl_geometry.pipeline.plan",
    "plan_analysis": "tl_geometry.pipeline.plan",
    "run_analysis": "tl_geometry.pipeline.loop",
    "run_sharded": "tl_geometry.pipeline.torchrun",
}


__getattr__ = lazy_names(globals(), HOMES)


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
