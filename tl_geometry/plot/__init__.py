"""Plotly figures of the paper's measurements (Figures 2-8, 10, 11), from an AnalysisResult.

Every function returns a ``plotly.graph_objects.Figure`` (it renders inline in a notebook; save
it with ``fig.write_html``). A figure whose table is missing raises
:class:`tl_geometry.InputError` saying which option of ``analyze`` produces it. What each function
needs, which paper figure it draws and how to read it: docs/figures.md.
"""

from typing import Any

from tl_geometry.moved import RENAMED_FIGURES, warn_moved
from tl_geometry.plot.attention import attention_mass
from tl_geometry.plot.budgets import budget_pareto
from tl_geometry.plot.circuitsvis_grid import HeadGrid, head_grid, head_grid_html
from tl_geometry.plot.colors import METRIC_COLORS, REGIME_COLORS, REGIME_ORDER
from tl_geometry.plot.competition import (
    fact_attention,
    fact_loss,
    n_star_by_context,
    retrieval_loss,
    retrieval_n_star,
    retrieval_support,
)
from tl_geometry.plot.contributions import contribution_points, contributions_from_model, contributions_scatter
from tl_geometry.plot.head_types import regimes_vs_head_types
from tl_geometry.plot.heatmap import head_heatmap, head_values
from tl_geometry.plot.norms import norm_cv_histogram, norms_by_position
from tl_geometry.plot.rankings import RANKING_COLORS, separability_by_ranking
from tl_geometry.plot.regime_curves import example_heads, regime_diagnostics
from tl_geometry.plot.regime_summaries import regime_pr, regimes_by_layer
from tl_geometry.plot.regime_tests import REGIME_SYMBOLS, cluster_scatter, effect_by_regime
from tl_geometry.plot.selection import envelopes_by_n, separability_by_n
from tl_geometry.plot.similarity import mae_histogram, similarity_curves
from tl_geometry.plot.sink import sink_correlation
from tl_geometry.plot.sparsification import geometry_vs_loss, localized_loss_map, loss_curve


def __getattr__(name: str) -> Any:
    new = RENAMED_FIGURES.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_moved(f"{__name__}.{name}", f"{__name__}.{new}")
    return globals()[new]


#: In the paper's figure order (a report lists the figures in this order), then helpers and constants.
__all__ = [
    "norms_by_position",
    "norm_cv_histogram",
    "mae_histogram",
    "similarity_curves",
    "attention_mass",
    "separability_by_n",
    "envelopes_by_n",
    "separability_by_ranking",
    "RANKING_COLORS",
    "sink_correlation",
    "regime_diagnostics",
    "regimes_by_layer",
    "contributions_scatter",
    "contributions_from_model",
    "regime_pr",
    "head_heatmap",
    "cluster_scatter",
    "effect_by_regime",
    "regimes_vs_head_types",
    "loss_curve",
    "geometry_vs_loss",
    "localized_loss_map",
    "budget_pareto",
    "n_star_by_context",
    "fact_attention",
    "fact_loss",
    "retrieval_loss",
    "retrieval_n_star",
    "retrieval_support",
    "head_grid",
    "head_grid_html",
    "HeadGrid",
    "contribution_points",
    "example_heads",
    "head_values",
    "METRIC_COLORS",
    "REGIME_COLORS",
    "REGIME_ORDER",
    "REGIME_SYMBOLS",
]
