"""The report section of the top-N intervention (definitions §8) and the page of ``tl-geometry sparsify``.

The section shows ``N*_tau`` per ranking and renormalisation (with the sizes tried), the loss at
each size, the geometry-function correlations when given, and the figures (b) loss curve,
(c) geometry against loss, (d) localised loss (:mod:`tl_geometry.plot.sparsification`).

Examples
--------
>>> import tempfile, pandas as pd
>>> from tl_geometry.intervention.curve import SparsificationCurve, CURVE_COLUMNS
>>> rows = [{"rank_by": "attention", "renormalize": False, "n": n, "nll": 1 + d, "nll_full": 1.0,
...          "delta_nll_rel": d, "n_tokens": 9, "stage": "grid"} for n, d in ((1, 0.4), (4, 0.01))]
>>> curve = SparsificationCurve(pd.DataFrame(rows, columns=CURVE_COLUMNS), 1.0, {"model": "toy"})
>>> page = write_sparsify_report(tempfile.mkdtemp(), curve, curve.effective_set_size(refine=False))
>>> "N*" in page.read_text()
True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from tl_geometry.errors import InputError
from tl_geometry.report.figures import ReportFigure
from tl_geometry.report.page import write_section_page
from tl_geometry.report.sections import Summary

SECTION = "sparsification"


def sparsification_summary(curve: Any, n_star: pd.DataFrame, correlations: pd.DataFrame | None = None) -> Summary:
    """The section's lead paragraph and tables."""
    table = curve.table.pivot_table(index="n", columns=["rank_by", "renormalize"], values="delta_nll_rel")
    table.columns = [f"{r} ({'renorm' if f else 'del'})" for r, f in table.columns]
    tables = [
        ("N*_tau per ranking and renormalisation (sizes tried listed)", n_star),
        ("delta_nll_rel by N", table.reset_index()),
    ]
    if correlations is not None and not correlations.empty:
        tables.append(("Geometry against function (Spearman's rho)", correlations))
    lead = (
        f"Every causal query keeps only its top-N keys under each ranking (definitions §8); the loss is the next-token "
        f"NLL over positions 1..L-1 (full model: {curve.nll_full:.4f} nats). N*_tau is the smallest size measured whose "
        "relative loss increase is at most tau; sink_window (the sink plus the most recent keys) is the static baseline."
    )
    return Summary(available=True, lead=lead, tables=tables)


def sparsification_figures(
    curve: Any, tolerance: float = 0.05, result: Any = None, local: pd.DataFrame | None = None
) -> list[ReportFigure]:
    """Figures (b), (c) (with ``result``) and (d) (with ``local``), or a "not available" entry each."""
    from tl_geometry.plot.sparsification import geometry_vs_loss, localized_loss_map, loss_curve

    out = [
        ReportFigure(
            "Loss by N (b)",
            "delta_nll_rel per ranking and renormalisation; N* starred",
            loss_curve(curve, tolerance),
            SECTION,
            source="tl_geometry.plot.loss_curve",
        )
    ]
    for title, fn, needs, why in (
        (
            "Geometry against loss (c)",
            lambda: geometry_vs_loss(result, curve),
            result,
            "run tlg.analyze with the curve's ns",
        ),
        ("Localised loss (d)", lambda: localized_loss_map(local), local, "run tlg.localized_loss(model, corpus)"),
    ):
        if needs is None:
            out.append(ReportFigure(title, "", None, SECTION, note=f"not available: {why}"))
            continue
        try:
            out.append(ReportFigure(title, "", fn(), SECTION))
        except InputError as exc:
            out.append(ReportFigure(title, "", None, SECTION, note=f"not available: {exc}"))
    return out


def write_sparsify_report(
    out_dir: str | Path,
    curve: Any,
    n_star: pd.DataFrame,
    *,
    local: pd.DataFrame | None = None,
    result: Any = None,
    correlations: pd.DataFrame | None = None,
    tolerance: float = 0.05,
) -> Path:
    """Write ``out_dir/index.html``: header, the sparsification section with its figures; self-contained."""
    summary = sparsification_summary(curve, n_star, correlations)
    figures = sparsification_figures(curve, tolerance, result, local)
    config = curve.config or {}
    return write_section_page(
        out_dir,
        SECTION,
        "Sparsification",
        summary,
        figures,
        ("Curve", [*config.items(), ("tolerance", f"{tolerance:g}")]),
        title=f"tl_geometry sparsification: {config.get('model', 'model')}",
    )


__all__ = ["sparsification_figures", "sparsification_summary", "write_sparsify_report"]
