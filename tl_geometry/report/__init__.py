"""A self-contained HTML report of an analysis: one ``index.html`` that opens with no network.

::

    from tl_geometry.report import build_report
    from tl_geometry.plot.circuitsvis_grid import head_grid_html

    result.save("runs/x")
    (Path("runs/x") / "head_grid.html").write_text(head_grid_html(model, text, heads))
    build_report("runs/x", "runs/x")          # -> runs/x/index.html, no model needed
    build_report(result, "out", figures=[("Precision by N", "mean over heads", fig)],
                 head_grid_html=head_grid_html(model, text))

The page has a header (model, corpus, parameters, timings, package versions), one section per
analysis (separability; envelopes, with kappa; assumption diagnostics; head taxonomy) holding its
summary table and figures, or a "not available: run with ..." line, and the head grid. plotly.js
is inlined once in ``<head>``; every figure is a div; circuitsvis' script is inline in the grid.
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
