""":func:`build_report`: one self-contained ``index.html`` from a result or a saved run directory."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from tl_geometry.capture.tables import check_heads
from tl_geometry.errors import InputError
from tl_geometry.io.files import write_atomic
from tl_geometry.pipeline.result import AnalysisResult, load_result
from tl_geometry.report.figures import (
    SECTIONS,
    ReportFigure,
    as_report_figures,
    default_figures,
    head_type_figures,
    regime_test_figures,
)
from tl_geometry.report.page import (
    check_self_contained,
    footer_html,
    head_grid_section,
    meta_html,
    page_html,
    section_html,
)
from tl_geometry.report.sections import (
    Summary,
    diagnostics_summary,
    envelope_summary,
    head_types_summary,
    header_rows,
    heads_table,
    read_run_info,
    separability_summary,
    taxonomy_summary,
)

#: Files of a run directory the report reads besides the saved result (all optional).
RUN_INFO_FILE = "run.json"
HEAD_GRID_FILE = "head_grid.html"
HEADS_FILE = "heads.parquet"
EFFECTS_FILE = "head_effects.parquet"
REPORT_FILE = "index.html"


def build_report(
    result_or_dir: AnalysisResult | str | Path,
    out_dir: str | Path,
    *,
    figures: Iterable[Any] | None = None,
    head_grid_html: str | Any | None = None,
    heads: pd.DataFrame | None = None,
    effects: Any = None,
    head_types: pd.DataFrame | None = None,
    title: str | None = None,
) -> Path:
    """Write ``out_dir/index.html``: one self-contained page with everything the result holds.

    Parameters
    ----------
    result_or_dir : AnalysisResult, or a directory written by ``result.save(dir)``
        A directory is read with :func:`tl_geometry.load_result` (no model needed). If it also
        holds ``run.json`` (written by ``tl-geometry run``) its package versions and timings
        go in the header; ``head_grid.html`` (a :func:`tl_geometry.plot.circuitsvis_grid.head_grid_html` fragment)
        is the head grid unless ``head_grid_html`` is given; ``heads.parquet`` (the
        ``classify_heads`` table) is the head table unless ``heads`` is given.
    out_dir : str or Path
        Created if needed; may be the run directory itself.
    figures : iterable, optional
        ``(title, description, plotly Figure)`` or ``(title, description, figure, section)``
        tuples, or :class:`~tl_geometry.report.ReportFigure` s, in page order within each
        section; ``section`` is a key of :data:`~tl_geometry.report.SECTIONS` (guessed from the
        title when left out). Default: :func:`default_figures` (every ``tl_geometry.plot`` figure
        that can be drawn; the others listed as not available).
    head_grid_html : str or HeadGrid, optional
        The head grid: a fragment from :func:`tl_geometry.plot.circuitsvis_grid.head_grid_html`, or a
        :class:`~tl_geometry.plot.circuitsvis_grid.HeadGrid`. Must not load anything remote.
    heads : DataFrame, optional
        The head table (:func:`tl_geometry.taxonomy.classify_heads`); else ``heads.parquet`` of the
        directory, else ``classify_heads(result)`` when the result holds the taxonomy features
        (else the taxonomy section says what to run). The section shows the strict labels and,
        where the table has them, the nearest ones.
    effects : DataFrame or [n_layers, n_heads] tensor, optional
        Per-head effects (:func:`tl_geometry.intervention.patching.head_out`, :func:`~tl_geometry.intervention.patching.
        mean_ablation`, the localised loss) for the effect-by-regime figure; else
        ``head_effects.parquet`` of the directory. With the default figures the taxonomy section
        also shows the k-means clusters of the heads (:func:`tl_geometry.regime_clusters`).
    head_types : DataFrame, optional
        :func:`tl_geometry.head_types` joined to the regimes (``tlg.head_types(model, result)``):
        the section "Regimes and circuit head types" lists the typed heads and cross-tabulates
        regimes against head types in both modes; else it says how to get them.
    title : str, optional
        Page title (default ``"tl_geometry report: <model>"``).

    Returns
    -------
    Path of ``index.html``.

    The page holds plotly.js once (inline, in ``<head>``), every figure as a div, circuitsvis'
    script inline in the head grid, and no ``src``/``href`` to any remote URL.
    """
    src = _read_source(result_or_dir, head_grid_html, heads, effects)
    result = src.result
    heads, why_no_heads = src.heads, None
    if heads is None:
        heads, why_no_heads = heads_table(result)
    else:
        heads = check_heads(heads, "build_report")

    if figures is None:
        figs = default_figures(result, heads=heads) + regime_test_figures(result, heads, src.effects)
    else:
        figs = as_report_figures(figures)
    figs += head_type_figures(head_types)
    fragment = _fragment(src.head_grid_html)
    sections, nav = _sections(result, heads, why_no_heads, figs, fragment, head_types)
    page = page_html(
        title or f"tl_geometry report: {result.model.name}",
        meta_html(header_rows(result, src.run_info)),
        nav,
        sections,
        footer_html(str(src.directory) if src.directory else None),
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_atomic(out / REPORT_FILE, lambda p: p.write_text(page, encoding="utf-8"))


@dataclass
class _Source:
    """What a report is built from: the result and, from a run directory, the optional files."""

    result: AnalysisResult
    directory: Path | None = None
    run_info: dict | None = None
    head_grid_html: Any = None
    heads: pd.DataFrame | None = None
    effects: Any = None


def _read_source(result_or_dir: Any, head_grid_html: Any, heads: Any, effects: Any) -> _Source:
    """The result (loaded from a directory) and the run directory's files where not given."""
    if isinstance(result_or_dir, AnalysisResult):
        return _Source(result_or_dir, head_grid_html=head_grid_html, heads=heads, effects=effects)
    if not isinstance(result_or_dir, (str, Path)):
        raise InputError(
            f"build_report needs an AnalysisResult or the directory of a saved one, got {type(result_or_dir).__name__}"
        )
    directory = Path(result_or_dir)
    src = _Source(load_result(directory), directory, None, head_grid_html, heads, effects)
    info_file = directory / RUN_INFO_FILE
    if info_file.is_file():
        src.run_info = read_run_info(info_file.read_text(encoding="utf-8"))
    if src.head_grid_html is None and (directory / HEAD_GRID_FILE).is_file():
        src.head_grid_html = (directory / HEAD_GRID_FILE).read_text(encoding="utf-8")
    if src.heads is None and (directory / HEADS_FILE).is_file():
        src.heads = pd.read_parquet(directory / HEADS_FILE)
    if src.effects is None and (directory / EFFECTS_FILE).is_file():
        src.effects = pd.read_parquet(directory / EFFECTS_FILE)
    return src


def _sections(
    result: AnalysisResult,
    heads: Any,
    why_no_heads: str | None,
    figs: list[ReportFigure],
    fragment: str | None,
    head_types: pd.DataFrame | None = None,
) -> tuple[list[str], list[tuple[str, str, bool]]]:
    """The HTML of every section (summary, figures), then the head grid, and the navigation entries."""
    kappa = ((result.config or {}).get("bounds") or {}).get("kappa")
    summaries: dict[str, Summary | None] = {
        "separability": separability_summary(result),
        "envelopes": envelope_summary(result),
        "diagnostics": diagnostics_summary(result),
        "taxonomy": taxonomy_summary(heads, why_no_heads),
        "head_types": head_types_summary(head_types),
        # their own pages: tl-geometry sparsify, budgets, context and fact (tl_geometry.report.*)
    }
    by_section: dict[str, list[ReportFigure]] = {key: [] for key in SECTIONS}
    for fig in figs:
        by_section[fig.section or "other"].append(fig)
    sections, nav, index = [], [], 0
    for key, label in SECTIONS.items():
        summary = summaries.get(key)
        if summary is None and not by_section[key]:
            continue  # "More figures" only when there are some
        text, index = section_html(key, summary, by_section[key], index, kappa)
        sections.append(text)
        available = summary.available if summary is not None else True
        nav.append((key, label, available or any(f.available for f in by_section[key])))
    grid_why = (
        "not available: pass head_grid_html=tl_geometry.plot.circuitsvis_grid.head_grid_html(model, text, heads) "
        f"(or put that fragment in {HEAD_GRID_FILE} beside the saved result); it needs the model"
    )
    sections.append(head_grid_section(fragment, grid_why))
    nav.append(("head-grid", "Attention patterns", fragment is not None))
    return sections, nav


def _fragment(head_grid_html: Any) -> str | None:
    if head_grid_html is None:
        return None
    if hasattr(head_grid_html, "fragment") and callable(head_grid_html.fragment):
        text = head_grid_html.fragment()
    elif hasattr(head_grid_html, "local_src"):
        text = f'<div class="tlg-head-grid">\n{head_grid_html.local_src}\n</div>'
    elif isinstance(head_grid_html, str):
        text = head_grid_html
    else:
        raise InputError(
            f"head_grid_html must be the str of tl_geometry.plot.circuitsvis_grid.head_grid_html(...) or a HeadGrid, "
            f"got {type(head_grid_html).__name__}"
        )
    if not text.strip():
        warnings.warn("head_grid_html is empty; the report has no head grid", UserWarning, stacklevel=3)
        return None
    try:
        check_self_contained(text, "the head grid")
    except ValueError as exc:
        raise InputError(
            f"{exc}: use tl_geometry.plot.circuitsvis_grid.head_grid_html (circuitsvis' local_src), not str(RenderedHTML) "
            "which loads circuitsvis from a CDN"
        ) from None
    return text
