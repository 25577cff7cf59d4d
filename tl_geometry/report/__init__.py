"""A self-contained HTML report of an analysis: one ``index.html`` that opens with no network.

::

    build_report("runs/x", "runs/x")          # -> runs/x/index.html, no model needed

A header, one section per analysis (summary table and figures, or "not available: run with
..."), and the head grid. Contents and options: docs/figures.md ("The HTML report").
"""

from tl_geometry.report.build import EFFECTS_FILE, HEAD_GRID_FILE, HEADS_FILE, REPORT_FILE, RUN_INFO_FILE, build_report
from tl_geometry.report.figures import SECTIONS, ReportFigure, default_figures, guess_section
from tl_geometry.report.page import PLOTLYJS_ID

__all__ = [
    "EFFECTS_FILE",
    "HEAD_GRID_FILE",
    "HEADS_FILE",
    "PLOTLYJS_ID",
    "REPORT_FILE",
    "RUN_INFO_FILE",
    "ReportFigure",
    "SECTIONS",
    "build_report",
    "default_figures",
    "guess_section",
]
