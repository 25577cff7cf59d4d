"""The Pareto figure of per-head budgets: ``delta_nll_rel`` against the mean budget ``B``, one line per rule.

From :func:`tl_geometry.competition.evaluate_budgets`' table (definitions §9); lower and to the left
is better: a rule below another at the same ``B`` loses less loss for the same keys.

Examples
--------
>>> import pandas as pd
>>> table = pd.DataFrame({"rule": ["uniform", "uniform", "geometry", "geometry"], "mean_budget": [4.0, 8.0] * 2,
...                       "delta_nll_rel": [0.5, 0.2, 0.6, 0.1]})
>>> [t.name for t in budget_pareto(table).data]
['uniform', 'geometry']
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from tl_geometry.errors import InputError
from tl_geometry.plot.base import base_layout

RULE_COLORS = {
    "uniform": "#0072B2",
    "geometry": "#009E73",
    "loss": "#CC79A7",
    "duo": "#D55E00",
    "streaming": "#777777",
}


def budget_pareto(table: Any) -> go.Figure:
    """``delta_nll_rel`` against ``B`` per rule (log ``B``); streaming dashed grey, as the static baseline.

    The loss axis is logarithmic where every point lost loss (``delta_nll_rel > 0``): the rules
    differ by tens of percent where streaming loses many times more, and a linear axis drew them
    as one line. Otherwise it is linear.

    Parameters
    ----------
    table : DataFrame with ``rule``, ``mean_budget`` and ``delta_nll_rel`` (``evaluate_budgets``).
    """
    if not isinstance(table, pd.DataFrame) or not {"rule", "mean_budget", "delta_nll_rel"} <= set(table.columns):
        raise InputError("budget_pareto needs the table of tlg.competition.evaluate_budgets (rule, mean_budget, ...)")
    if table.empty:
        raise InputError("the budget table has no points: evaluate at least one budget")
    fig = go.Figure()
    for rule, points in table.groupby("rule", sort=False):
        points = points.sort_values("mean_budget")
        fig.add_trace(
            go.Scatter(
                x=points.mean_budget,
                y=points.delta_nll_rel,
                name=str(rule),
                mode="lines+markers",
                line=dict(color=RULE_COLORS.get(str(rule)), dash="dash" if rule == "streaming" else "solid"),
            )
        )
    log_y = bool((table.delta_nll_rel > 0).all())
    y_title = "loss increase over the full model (relative)" + (", log scale" if log_y else "")
    return base_layout(
        fig,
        "Per-head budgets: loss against mean budget",
        "mean budget B (keys per query, log scale)",
        y_title,
        log_x=True,
        log_y=log_y,
    )


__all__ = ["RULE_COLORS", "budget_pareto"]
