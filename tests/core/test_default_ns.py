"""One default grid of selection sizes: every function that takes ``ns`` defaults to ``DEFAULT_NS``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import torch

import tl_geometry
from tl_geometry.core.sizes import DEFAULT_NS, log_spaced_ns
from tl_geometry.pipeline.settings import AnalysisSettings
from tl_geometry.taxonomy.tables import regime_feature_table

#: ``ns`` parameters that are not the analysis grid, and why.
OTHER_GRIDS = {
    # one forward pass over the corpus per N: a grid of powers of two, not the analysis grid
    "tl_geometry.intervention.curve.sparsification_curve",
    # the same per context length (it calls sparsification_curve)
    "tl_geometry.competition.context.context_scaling",
    # one top-N pass per (background amount, N): a few sizes, not the analysis grid
    "tl_geometry.competition.fact.supporting_fact",
    # the same for the retrieval protocol: one top-N pass per (condition, amount, example, N)
    "tl_geometry.competition.retrieval.retrieval_under_competition",
    # the sizes of the loss curve it predicts (sparsification_curve's powers of two)
    "tl_geometry.intervention.sensitivity.gradient_sensitivity",
}


def functions_with_ns_default() -> dict[str, object]:
    """``module.qualname`` -> the default of its ``ns`` parameter, for every function of the package."""
    found: dict[str, object] = {}
    for info in pkgutil.walk_packages(tl_geometry.__path__, "tl_geometry."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for owner in [module, *(c for _, c in inspect.getmembers(module, inspect.isclass))]:
            for name, fn in inspect.getmembers(owner, inspect.isfunction):
                if getattr(fn, "__module__", None) != info.name:
                    continue
                param = inspect.signature(fn).parameters.get("ns")
                if param is not None and param.default is not inspect.Parameter.empty:
                    qualname = f"{info.name}.{getattr(fn, '__qualname__', name)}"
                    found[qualname] = param.default
    return found


def test_every_ns_default_is_the_analysis_default():
    defaults = functions_with_ns_default()
    assert "tl_geometry.core.separability.separability" in defaults  # the walk sees the package
    differ = {name: d for name, d in defaults.items() if d != DEFAULT_NS and name not in OTHER_GRIDS}
    assert differ == {}
    assert AnalysisSettings().ns == DEFAULT_NS


def test_regime_feature_table_defaults_to_analyzes_grid():
    torch.manual_seed(0)
    weights = torch.softmax(torch.randn(2, 3, 40, dtype=torch.float64), -1)
    values = torch.randn(2, 3, 40, 4, dtype=torch.float64)
    table = regime_feature_table(weights, values)
    assert sorted(table["n"].unique().tolist()) == log_spaced_ns(40)
