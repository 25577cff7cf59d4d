"""The report section of per-head budgets (definitions §9) and the page of ``tl-geometry budgets``.

The section shows ``delta_nll_rel`` by rule and mean budget ``B`` on held-out windows, and the
Pareto figure (:func:`tl_geometry.plot.budget_pareto`).

Examples
--------
>>> import tempfile, pandas as pd
>>> table = pd.DataFrame({"rule": ["uniform", "geometry"], "mean_budget": [8.0, 8.0], "realised_mean": [8.0, 8.0],
...                       "n_full_heads": [0, 0], "nll": [3.8, 3.7], "nll_full": [3.3, 3.3],
...                       "delta_nll_rel": [0.15, 0.12], "n_tokens": [9, 9]})
>>> page = write_budgets_report(tempfile.mkdtemp(), table, {"model": "toy"})
>>> "Per-head budgets" in page.read_text()
True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from tl_geometry.report.figures import ReportFigure
from tl_geometry.report.page import write_section_page
from tl_geometry.report.sections import Summary

SECTION = "budgets"


def budgets_summary(table: pd.DataFrame) -> Summary:
    """The section's lead paragraph and its table (``delta_nll_rel``, one row per ``B``, one column per rule)."""
    wide = table.pivot_table(index="mean_budget", columns="rule", values="delta_nll_rel", sort=False).reset_index()
    lead = (
        "Every (layer, head) keeps its own number of keys per query, chosen by each rule on other windows; rules are "
        "compared at equal mean budget B (keys per query, mean over heads, a full head counted as the mean number of "
        f"causal keys). delta_nll_rel on held-out windows (full model: {table.nll_full.iloc[0]:.4f} nats)."
    )
    return Summary(available=True, lead=lead, tables=[("delta_nll_rel by mean budget B and rule", wide)])


def budgets_figures(table: pd.DataFrame) -> list[ReportFigure]:
    from tl_geometry.plot.budgets import budget_pareto

    return [
        ReportFigure(
            "Per-head budgets: loss against mean budget",
            "delta_nll_rel per rule; streaming (sink + window) dashed",
            budget_pareto(table),
            SECTION,
            source="tl_geometry.plot.budget_pareto",
        )
    ]


def write_budgets_report(out_dir: str | Path, table: pd.DataFrame, config: dict[str, Any] | None = None) -> Path:
    """Write ``out_dir/index.html``: header and the per-head budgets section with its figure; self-contained."""
    config = config or {}
    return write_section_page(
        out_dir,
        SECTION,
        "Per-head budgets",
        budgets_summary(table),
        budgets_figures(table),
        ("Budgets", config.items()),
        title=f"tl_geometry per-head budgets: {config.get('model', 'model')}",
    )


__all__ = ["budgets_figures", "budgets_summary", "write_budgets_report"]
