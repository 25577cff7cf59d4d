""":func:`build_report`: one self-contained ``index.html`` from a result or a saved run directory."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from .._files import write_atomic
from ..analysis import AnalysisResult, load_result
from ..errors import InputError
from .figures import SECTIONS, ReportFigure, as_report_figures, default_figures
from .page import check_self_contained, footer_html, head_grid_section, meta_html, page_html, section_html
from .sections import (
    Summary,
    diagnostics_summary,
    envelope_summary,
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
REPORT_FILE = "index.html"


def build_report(
    result_or_dir: AnalysisResult | str | Path,
    out_dir: str | Path,
    *,
    figures: Iterable[Any] | None = None,
    head_grid_html: str | Any | None = None,
    heads: pd.DataFrame | None = None,
    title: str | None = None,
) -> Path:
    """Write ``out_dir/index.html``: one self-contained page with everything the result holds.

    Parameters
    ----------
    result_or_dir : AnalysisResult, or a directory written by ``result.save(dir)``
        A directory is read with :func:`tl_geometry.load_result` (no model needed). If it also
        holds ``run.json`` (written by ``tl-geometry run``) its package versions and timings
        go in the header; ``head_grid.html`` (a :func:`tl_geometry.vis.head_grid_html` fragment)
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
        The head grid: a fragment from :func:`tl_geometry.vis.head_grid_html`, or a
        :class:`~tl_geometry.vis.HeadGrid`. Must not load anything remote.
    heads : DataFrame, optional
        The head table (:func:`tl_geometry.taxonomy.classify_heads`); else ``heads.parquet`` of the
        directory, else ``classify_heads(result)`` when the result holds the taxonomy features
        (else the taxonomy section says what to run).
    title : str, optional
        Page title (default ``"tl_geometry report: <model>"``).

    Returns
    -------
    Path of ``index.html``.

    The page holds plotly.js once (inline, in ``<head>``), every figure as a div, circuitsvis'
    script inline in the head grid, and no ``src``/``href`` to any remote URL.
    """
    source_dir: Path | None = None
    run_info: dict | None = None
    if isinstance(result_or_dir, AnalysisResult):
        result = result_or_dir
    elif isinstance(result_or_dir, (str, Path)):
        source_dir = Path(result_or_dir)
        result = load_result(source_dir)
        info_file = source_dir / RUN_INFO_FILE
        if info_file.is_file():
            run_info = read_run_info(info_file.read_text(encoding="utf-8"))
        if head_grid_html is None and (source_dir / HEAD_GRID_FILE).is_file():
            head_grid_html = (source_dir / HEAD_GRID_FILE).read_text(encoding="utf-8")
        if heads is None and (source_dir / HEADS_FILE).is_file():
            heads = pd.read_parquet(source_dir / HEADS_FILE)
    else:
        raise InputError(
            f"build_report needs an AnalysisResult or the directory of a saved one, got {type(result_or_dir).__name__}"
        )

    why_no_heads = None
    if heads is None:
        heads, why_no_heads = heads_table(result)
    elif not isinstance(heads, pd.DataFrame) or not {"layer", "head", "regime"} <= set(heads.columns):
        raise InputError("heads must be the DataFrame of tl_geometry.taxonomy.classify_heads (layer, head, regime)")

    if figures is None:
        figs = default_figures(result, heads=heads)
    else:
        figs = as_report_figures(figures)
    fragment = _fragment(head_grid_html)

    kappa = ((result.config or {}).get("bounds") or {}).get("kappa")
    summaries: dict[str, Summary | None] = {
        "separability": separability_summary(result),
        "envelopes": envelope_summary(result),
        "diagnostics": diagnostics_summary(result),
        "taxonomy": taxonomy_summary(heads, why_no_heads),
        "other": None,
    }
    by_section: dict[str, list[ReportFigure]] = {key: [] for key in SECTIONS}
    for fig in figs:
        by_section[fig.section or "other"].append(fig)

    sections, nav, index = [], [], 0
    for key, label in SECTIONS.items():
        summary = summaries[key]
        if summary is None and not by_section[key]:
            continue  # "More figures" only when there are some
        text, index = section_html(key, summary, by_section[key], index, kappa)
        sections.append(text)
        available = summary.available if summary is not None else True
        nav.append((key, label, available or any(f.available for f in by_section[key])))
    grid_why = (
        "not available: pass head_grid_html=tl_geometry.vis.head_grid_html(model, text, heads) "
        f"(or put that fragment in {HEAD_GRID_FILE} beside the saved result); it needs the model"
    )
    sections.append(head_grid_section(fragment, grid_why))
    nav.append(("head-grid", "Attention patterns", fragment is not None))

    page = page_html(
        title or f"tl_geometry report: {result.model.name}",
        meta_html(header_rows(result, run_info)),
        nav,
        sections,
        footer_html(str(source_dir) if source_dir else None),
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_atomic(out / REPORT_FILE, lambda p: p.write_text(page, encoding="utf-8"))


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
            f"head_grid_html must be the str of tl_geometry.vis.head_grid_html(...) or a HeadGrid, "
            f"got {type(head_grid_html).__name__}"
        )
    if not text.strip():
        warnings.warn("head_grid_html is empty; the report has no head grid", UserWarning, stacklevel=3)
        return None
    try:
        check_self_contained(text, "the head grid")
    except ValueError as exc:
        raise InputError(
            f"{exc}: use tl_geometry.vis.head_grid_html (circuitsvis' local_src), not str(RenderedHTML) "
            "which loads circuitsvis from a CDN"
        ) from None
    return text
