"""The figures of a report: :class:`ReportFigure`, and :func:`default_figures` from ``tl_geometry.plot``.

A report takes figures as ``(title, description, figure)`` (or ``(title, description, figure,
section)``) tuples or :class:`ReportFigure` s, so it does not depend on which figure functions
exist. :func:`default_figures` finds them: the functions of ``tl_geometry.plot`` listed in
:data:`KNOWN_FIGURES` (in the paper's order), then any other public function whose first
parameter is the result (``result``, ``result_or_table`` or annotated ``AnalysisResult``) or the
head table (``heads``) and whose other required parameters are at most ``heads``; one raising
:class:`~tl_geometry.errors.InputError` (the analysis it draws was not run) is listed in the page
as "not available", with the error's message (which says what to run).
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings
from dataclasses import dataclass
from typing import Any, Iterable

from tl_geometry.errors import InputError

#: Report sections, in page order: key -> heading.
SECTIONS = {
    "separability": "Separability",
    "envelopes": "Envelopes",
    "diagnostics": "Assumption diagnostics",
    "taxonomy": "Head taxonomy",
    "head_types": "Regimes and circuit head types",
    "sparsification": "Sparsification (top-N intervention)",
    "budgets": "Per-head budgets",
    "context": "Context scaling",
    "fact": "A supporting fact under competition",
    "retrieval": "Retrieval under competition",
    "other": "More figures",
}

# section guessed from a function name or a title; the first rule that matches wins
_SECTION_RULES = (
    ("envelopes", r"envelope|bound|kappa|theorem"),
    ("taxonomy", r"regime|taxonom|sink.?effect|sink.?corr|classif|retriever|mixer|reset|head.?type"),
    ("diagnostics", r"diagnos|norm|similar|cosine|decay|profile|assumption|sink.?ratio|beta|mae|attention.?mass"),
    ("separability", r"separab|precision|recall|f.?score|pr.?curve|mean.?by.?n|radi|selection"),
)


@dataclass
class ReportFigure:
    """One figure of a report.

    Attributes
    ----------
    title, description : str
        Shown above the figure (plain text; escaped in the page).
    figure : plotly Figure or None
        None for a figure that could not be drawn; ``note`` then says why.
    section : str or None
        A key of :data:`SECTIONS`; None: guessed from the title (else "other").
    note : str or None
        For an unavailable figure: what to run to get it.
    source : str or None
        The function that drew it (e.g. ``tl_geometry.plot.precision_recall``).
    """

    title: str
    description: str = ""
    figure: Any = None
    section: str | None = None
    note: str | None = None
    source: str | None = None

    @property
    def available(self) -> bool:
        return self.figure is not None


def guess_section(text: str) -> str:
    """The section of a figure from its function name or title (``"other"`` when none fits)."""
    low = text.lower()
    for key, pattern in _SECTION_RULES:
        if re.search(pattern, low):
            return key
    return "other"


def as_report_figures(figures: Iterable[Any]) -> list[ReportFigure]:
    """Normalise ``(title, description, figure[, section])`` tuples and :class:`ReportFigure` s."""
    out = []
    for i, item in enumerate(figures):
        if isinstance(item, ReportFigure):
            fig = item
        elif isinstance(item, (tuple, list)) and len(item) in (3, 4):
            title, description, figure = item[0], item[1], item[2]
            fig = ReportFigure(
                str(title),
                "" if description is None else str(description),
                figure,
                section=item[3] if len(item) == 4 else None,
            )
        else:
            raise InputError(
                f"figure {i} is a {type(item).__name__}: give (title, description, plotly Figure) tuples, "
                "(title, description, figure, section) or tl_geometry.report.ReportFigure"
            )
        if fig.figure is not None and not _is_figure(fig.figure):
            raise InputError(f"figure {fig.title!r} is a {type(fig.figure).__name__}, not a plotly Figure")
        if fig.section is None:
            fig.section = guess_section(f"{fig.source or ''} {fig.title}")
        if fig.section not in SECTIONS:
            raise InputError(f"figure {fig.title!r}: unknown section {fig.section!r}; use one of {list(SECTIONS)}")
        out.append(fig)
    return out


def _is_figure(obj: Any) -> bool:
    import plotly.graph_objects as go

    return isinstance(obj, go.Figure)


def _plot_module() -> Any:
    try:
        return importlib.import_module("tl_geometry.plot")
    except ModuleNotFoundError as exc:
        if exc.name in ("tl_geometry.plot",):
            return None
        raise


@dataclass(frozen=True)
class _Known:
    """A ``tl_geometry.plot`` function the report knows: its section, heading and arguments."""

    name: str
    section: str
    heading: str
    args: str = "result"  # "result", "result+heads" or "heads"


#: The figures of ``tl_geometry.plot`` in page order (the paper's figure order within a section).
#: Functions not listed here are still drawn when their signature allows (section guessed).
KNOWN_FIGURES = (
    _Known("separability_by_n", "separability", "Separability by N (Fig. 5)"),
    _Known("envelopes_by_n", "envelopes", "Measured separability inside the envelopes (Fig. 5)"),
    _Known("norms_by_position", "diagnostics", "Value norms by position (Fig. 2, left)"),
    _Known("norm_cv_histogram", "diagnostics", "Spread of the non-sink value norms (Fig. 2, right)"),
    _Known("similarity_curves", "diagnostics", "Cosine similarity by lag and its exponential fit (Fig. 3)"),
    _Known("mae_histogram", "diagnostics", "Error of the exponential similarity fit (Fig. 3)"),
    _Known("attention_mass", "diagnostics", "Attention weight by position (Fig. 4)"),
    _Known("sink_correlation", "taxonomy", "Sink effect: recall against rho_0 (Fig. 6)"),
    _Known("regime_diagnostics", "taxonomy", "Norms and alignments of s(N) per regime (Fig. 7)", "result+heads"),
    _Known("regimes_by_layer", "taxonomy", "Regimes by layer (Fig. 8)", "heads"),
    _Known("regime_pr", "taxonomy", "Precision and recall per regime (Fig. 11)", "result+heads"),
)

_RESULT_PARAMS = ("result", "res", "analysis", "result_or_table")


def _figure_functions(module: Any) -> list[tuple[str, Any, str]]:
    """``(name, function, args)`` of the figure functions of ``module``: the known ones in page
    order, then any other public function whose first parameter is the result (or the heads table)
    and whose other required parameters are at most ``heads``; ``args`` as in :class:`_Known`."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, obj in vars(module).items() if not n.startswith("_") and inspect.isfunction(obj)]
    known = {k.name: k for k in KNOWN_FIGURES}
    ordered = [k.name for k in KNOWN_FIGURES if k.name in names] + [n for n in names if n not in known]
    found = []
    for name in ordered:
        fn = getattr(module, name, None)
        if not inspect.isfunction(fn):
            continue
        if name in known:
            found.append((name, fn, known[name].args))
            continue
        params = list(inspect.signature(fn).parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not positional:
            continue
        first = positional[0]
        others = [p for p in params[1:] if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        required = {p.name for p in others if p.default is p.empty}
        takes_heads = any(p.name == "heads" for p in others)
        if first.name in _RESULT_PARAMS or "AnalysisResult" in str(first.annotation):
            if required - {"heads"}:
                continue
            found.append((name, fn, "result+heads" if takes_heads else "result"))
        elif first.name == "heads" and not required:
            found.append((name, fn, "heads"))
    return found


def _title_of(figure: Any, name: str) -> str:
    text = figure.layout.title.text
    if text:
        return re.sub(r"<[^>]+>", " ", str(text)).strip()
    return name.replace("_", " ").strip().capitalize()


def _summary_line(fn: Any) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").replace("``", "").strip()


def default_figures(result: Any, heads: Any = None) -> list[ReportFigure]:
    """Every figure ``tl_geometry.plot`` can draw for ``result``, and what it cannot.

    Parameters
    ----------
    result : AnalysisResult
    heads : DataFrame, optional
        The head table of :func:`tl_geometry.taxonomy.classify_heads`, given to the functions
        that take ``heads``. Default: ``classify_heads(result)`` when the result holds the taxonomy
        features; otherwise the figures that need it are listed as not available.

    Returns
    -------
    list of ReportFigure
        Drawn figures (``figure`` set; ``title`` the figure's own title, ``description`` the
        function's summary line) in page order, and, for each function that raised
        :class:`~tl_geometry.errors.InputError`, an entry with ``figure=None`` and ``note`` "not
        available: ..." (its message says which analysis to run). Another exception is reported
        the same way, with a warning, so one broken figure does not stop the report. Empty when
        ``tl_geometry.plot`` does not exist. Functions that need more than the result and the
        head table (``contributions_from_model``, ``head_heatmap``...) are not called.
    """
    module = _plot_module()
    if module is None:
        return []
    why_no_heads = None
    if heads is None:
        from tl_geometry.report.sections import heads_table

        heads, why_no_heads = heads_table(result)
    known = {k.name: k for k in KNOWN_FIGURES}
    out: list[ReportFigure] = []
    for name, fn, args in _figure_functions(module):
        source = f"tl_geometry.plot.{name}"
        spec = known.get(name)
        heading = spec.heading if spec else name.replace("_", " ").strip().capitalize()
        section = spec.section if spec else guess_section(name)
        summary = _summary_line(fn)
        if args != "result" and heads is None:
            note = why_no_heads or "not available: run with the head taxonomy (tl_geometry.taxonomy.classify_heads)"
            out.append(ReportFigure(heading, summary, None, section, note=note, source=source))
            continue
        try:
            if args == "heads":
                drawn = fn(heads)
            elif args == "result+heads":
                drawn = fn(result, heads=heads)
            else:
                drawn = fn(result)
        except InputError as exc:
            out.append(ReportFigure(heading, summary, None, section, note=f"not available: {exc}", source=source))
            continue
        except Exception as exc:  # noqa: BLE001 - a broken figure must not stop the report
            warnings.warn(f"{source} failed and is left out of the report: {type(exc).__name__}: {exc}", stacklevel=2)
            out.append(
                ReportFigure(
                    heading,
                    summary,
                    None,
                    section,
                    note=f"not available: {source} failed ({type(exc).__name__}: {exc})",
                    source=source,
                )
            )
            continue
        figures = drawn if isinstance(drawn, (list, tuple)) else [drawn]
        figures = [f for f in figures if _is_figure(f)]
        for k, fig in enumerate(figures):
            title = heading if spec else _title_of(fig, name)
            if len(figures) > 1:
                title = f"{title} ({k + 1})"
            out.append(ReportFigure(title, summary, fig, section, source=source))
    return out


def head_type_figures(table: Any) -> list[ReportFigure]:
    """The cross-table of regimes against circuit head types, both modes, from a
    :func:`tl_geometry.head_types` table joined to the regimes (empty when ``table`` is None)."""
    if table is None:
        return []
    import tl_geometry.plot as plot

    return [
        ReportFigure(
            f"Regimes ({mode}) against circuit head types",
            _summary_line(plot.regimes_vs_head_types),
            plot.regimes_vs_head_types(table, mode),
            "head_types",
            source="tl_geometry.plot.regimes_vs_head_types",
        )
        for mode in ("strict", "nearest")
    ]


def regime_test_figures(result: Any, heads: Any, effects: Any = None) -> list[ReportFigure]:
    """The two tests of the regimes (definitions §5): the cluster plane and, given per-head
    ``effects`` (patching, mean-ablation, localised loss), the effect by regime; each listed as
    not available, with what to run, when it cannot be drawn."""
    import tl_geometry.plot as plot
    from tl_geometry.taxonomy import join_heads, regime_clusters

    out = []
    clusters_title = "Are the regimes real? k-means clusters of the heads"
    clusters_source = "tl_geometry.plot.cluster_scatter"
    try:
        clusters = regime_clusters(result, k=range(2, 7), seed=0)
        out.append(
            ReportFigure(
                clusters_title,
                _summary_line(plot.cluster_scatter),
                plot.cluster_scatter(clusters),
                "taxonomy",
                source=clusters_source,
            )
        )
    except InputError as exc:
        out.append(
            ReportFigure(clusters_title, "", None, "taxonomy", note=f"not available: {exc}", source=clusters_source)
        )
    effect_title = "Do the regimes differ in function? Per-head effect by regime"
    effect_source = "tl_geometry.plot.effect_by_regime"
    if effects is None or heads is None:
        note = (
            "not available: pass effects= (tlg.intervention.patching.head_out(...), tlg.intervention.patching.mean_ablation(model, tokens) "
            "or the localised loss) and a heads table, or run `tl-geometry run --mean-ablation`"
        )
        out.append(ReportFigure(effect_title, "", None, "taxonomy", note=note, source=effect_source))
        return out
    try:
        table = join_heads(effects, heads)
        out.append(
            ReportFigure(
                effect_title,
                _summary_line(plot.effect_by_regime),
                plot.effect_by_regime(table),
                "taxonomy",
                source=effect_source,
            )
        )
    except InputError as exc:
        out.append(ReportFigure(effect_title, "", None, "taxonomy", note=f"not available: {exc}", source=effect_source))
    return out
