"""HTML of the report page: one file, plotly.js inlined once in ``<head>``, nothing fetched."""

from __future__ import annotations

import html
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from tl_geometry.io.files import write_atomic
from tl_geometry.report.figures import SECTIONS, ReportFigure
from tl_geometry.report.sections import Summary

#: Marks the one inline copy of plotly.js (tests count it).
PLOTLYJS_ID = "tlg-plotlyjs"
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}

_REMOTE = (
    # a tag that loads a URL
    re.compile(
        r"""<(script|link|img|iframe|source|embed)\b[^>]*\b(src|href)\s*=\s*["']?\s*(https?:)?//""", re.IGNORECASE
    ),
    # an ES module import from a URL (circuitsvis' CDN HTML: import { render } from "https://unpkg.com/...")
    re.compile(r"""\b(from|import)\s*\(?\s*["'](https?:)?//""", re.IGNORECASE),
)

CSS = """
:root { --fg: #1f2933; --muted: #52606d; --line: #d9e2ec; --bg-alt: #f5f7fa; --accent: #2f6fba; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--fg); background: #fff; }
main { max-width: 1200px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 1.6rem; margin: 0 0 4px; }
h2 { font-size: 1.3rem; margin: 40px 0 8px; padding-top: 12px; border-top: 2px solid var(--line); }
h2 .extra { font-weight: normal; color: var(--muted); font-size: 1rem; margin-left: 8px; }
h3 { font-size: 1.05rem; margin: 24px 0 4px; }
p.sub, p.lead, figcaption p { color: var(--muted); margin: 4px 0 10px; }
nav ul { list-style: none; padding: 0; margin: 12px 0; display: flex; flex-wrap: wrap; gap: 6px 18px; }
nav a { color: var(--accent); text-decoration: none; }
nav .na { color: var(--muted); }
.meta { display: grid; grid-template-columns: repeat(auto-fill, minmax(330px, 1fr)); gap: 12px 24px; margin: 16px 0; }
.meta table { width: 100%; align-self: start; }
.meta caption { text-align: left; font-weight: 600; padding: 4px 0; }
table { border-collapse: collapse; font-size: 0.88rem; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 10px 3px 0; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
td.num, .tlg-table td { text-align: right; }
.tlg-table th { text-align: right; }
.table-wrap { overflow-x: auto; margin: 6px 0 14px; }
figure.tlg-figure { margin: 18px 0 28px; padding: 10px 12px; border: 1px solid var(--line); border-radius: 6px;
                    overflow-x: auto; }
figure.tlg-figure figcaption h3 { margin-top: 0; }
.tlg-plot { width: 100%; min-height: 200px; }
.na-list li, p.na { color: #8a4b08; }
.tlg-head-grid-wrap { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; overflow-x: auto; }
footer { margin-top: 48px; color: var(--muted); font-size: 0.85rem; }
code { background: var(--bg-alt); padding: 0 3px; border-radius: 3px; }
@media (max-width: 600px) { main { padding: 16px 12px 48px; } .tlg-head-grid-wrap { padding: 8px 6px; } }
"""


#: On a narrow screen (a phone, 420 px) every plotly figure is laid out again: its title and each
#: panel's title and axis title wrapped to the length they have, the legend at the bottom of the
#: figure, the figure made taller by the legend's height (plotly would shrink the plot), and a log
#: axis of a panel under 300 px labelled at the powers of ten only. Wider, as built. Each figure's div gets
#: ``data-tlg-layout`` ("narrow" or "wide") once it is laid out (the browser test waits for it).
NARROW_SCRIPT = """
(function () {
  var NARROW = 640;
  function wrap(text, chars) {
    if (!text) { return text; }
    var words = String(text).replace(/<br>/g, " ").split(" "), lines = [], line = "";
    words.forEach(function (w) {
      if (line && (line + " " + w).length > chars) { lines.push(line); line = w; }
      else { line = line ? line + " " + w : w; }
    });
    if (line) { lines.push(line); }
    return lines.join("<br>");
  }
  function axes(layout) {
    return Object.keys(layout).filter(function (k) { return /^[xy]axis[0-9]*$/.test(k); });
  }
  function done(div, how) { div.dataset.tlgLayout = how; }
  // plotly's div and the box around it (plotly.io's wrapper, 480 px tall as built) grow together
  function setHeight(div, px) {
    div.style.height = px + "px";
    var wrapper = div.parentElement;
    if (wrapper && !wrapper.classList.contains("tlg-plot")) { wrapper.style.height = px + "px"; }
  }
  // plotly makes room for a legend at the bottom by shrinking the plot: grow the figure by the
  // legend's height instead, so the panels keep their size
  function room(div, height) {
    var legend = div.querySelector(".legend");
    if (!legend) { return null; }
    var grown = height + Math.ceil(legend.getBoundingClientRect().height) + 8;
    setHeight(div, grown);
    return {height: grown};
  }
  function fit(div) {
    if (!window.Plotly || !div.layout || !div.clientWidth) { return; }
    var box = div.closest(".tlg-plot") || div.parentElement || div;
    var layout = div.layout, width = box.clientWidth;
    if (!div.tlgWide) {
      var wide = {"title.text": layout.title && layout.title.text, "title.font.size": null, "legend.orientation": null,
                  "legend.x": null, "legend.y": null, "legend.xanchor": null, "legend.yanchor": null,
                  "legend.yref": null, height: layout.height || null,
                  "margin.t": (layout.margin && layout.margin.t !== undefined) ? layout.margin.t : null};
      (layout.updatemenus || []).forEach(function (m, i) {
        wide["updatemenus[" + i + "].y"] = m.y === undefined ? null : m.y;
        wide["updatemenus[" + i + "].yanchor"] = m.yanchor || null;
      });
      (layout.annotations || []).forEach(function (a, i) {
        wide["annotations[" + i + "].text"] = a.text;
        wide["annotations[" + i + "].font.size"] = (a.font && a.font.size) || null;
      });
      axes(layout).forEach(function (k) {
        var ax = layout[k];
        wide[k + ".title.text"] = ax.title && ax.title.text;
        wide[k + ".ticktext"] = ax.ticktext || null;
        wide[k + ".tickangle"] = ax.tickangle === undefined ? null : ax.tickangle;
      });
      div.tlgWide = wide;
      div.tlgTop = div._fullLayout ? div._fullLayout.margin.t : 100;  // the top margin as built
    }
    if (width >= NARROW) {
      if (div.tlgNarrow) {
        div.tlgNarrow = false;
        setHeight(div, div.tlgWide.height || 480);
        Plotly.relayout(div, div.tlgWide).then(function () { done(div, "wide"); });
      } else { done(div, "wide"); }
      return;
    }
    var xs = axes(layout).filter(function (k) { return k[0] === "x"; });
    var panels = Math.max(1, new Set(xs.map(function (k) { return (layout[k].domain || [0, 1])[0]; })).size);
    var panel = width / panels, height = div.tlgWide.height || 480;
    var drawn = Math.min.apply(null, xs.map(function (k) {  // a panel's width as drawn (the margins left out)
      var full = div._fullLayout && div._fullLayout[k];
      return (full && full._length) || panel;
    }).concat([panel]));
    var update = {"title.font.size": 14, autosize: true, height: height, "legend.orientation": "h",
      "legend.x": 0, "legend.xanchor": "left", "legend.yref": "container", "legend.y": 0, "legend.yanchor": "bottom"};
    setHeight(div, height);
    update["title.text"] = wrap(div.tlgWide["title.text"], Math.floor(width / 9.5));
    (layout.annotations || []).forEach(function (a, i) {
      update["annotations[" + i + "].text"] = wrap(div.tlgWide["annotations[" + i + "].text"], Math.max(8, Math.floor(drawn / 6.5)));
      update["annotations[" + i + "].font.size"] = 11;
    });
    axes(layout).forEach(function (k) {
      var ax = layout[k], full = div._fullLayout && div._fullLayout[k];
      var span = (full && full._length) || (k[0] === "x" ? panel : height / 2);
      // a y title keeps clear of the figure's title above the plot, which the wrapped titles shrink
      var chars = k[0] === "x" ? span / 6.5 : 0.7 * span / 7;
      update[k + ".title.text"] = wrap(div.tlgWide[k + ".title.text"], Math.max(10, Math.floor(chars)));
      if (k !== "yaxis" && k[0] === "y" && div.tlgWide[k + ".title.text"] === div.tlgWide["yaxis.title.text"]) {
        update[k + ".title.text"] = "";  // a panel's y title that repeats the first one's would cover its ticks
      }
      var text = div.tlgWide[k + ".ticktext"];
      if (ax.type === "log" && text && k[0] === "x" && panel < 300) {
        update[k + ".ticktext"] = text.map(function (t) { return /^(0\\.0*)?10*$/.test(t) ? t : ""; });
        update[k + ".tickangle"] = 0;
      }
    });
    // wrapped titles grow upwards: a taller top margin (and figure) keeps them off each other
    var lines = function (text) { return text ? String(text).split("<br>").length : 1; };
    var annotationLines = Math.max.apply(null, (layout.annotations || []).map(function (a, i) {
      return lines(update["annotations[" + i + "].text"]);
    }).concat([1]));
    var more = 16 * (lines(update["title.text"]) - 1) + 14 * (annotationLines - 1);
    (layout.updatemenus || []).forEach(function (m, i) {  // a menu goes just above the plot, under the title
      update["updatemenus[" + i + "].y"] = 1.01;
      update["updatemenus[" + i + "].yanchor"] = "bottom";
    });
    if ((layout.updatemenus || []).length) { more += 36; }
    update["margin.t"] = div.tlgTop + more;
    update.height = height = height + more;
    setHeight(div, height);
    div.tlgNarrow = true;
    Plotly.relayout(div, update).then(function () {
      var more = room(div, height);
      return more ? Plotly.relayout(div, more) : null;
    }).then(function () { done(div, "narrow"); });
  }
  function fitAll() { document.querySelectorAll(".js-plotly-plot").forEach(fit); }
  var timer = null;
  window.addEventListener("resize", function () { clearTimeout(timer); timer = setTimeout(fitAll, 150); });
  window.addEventListener("load", fitAll);
})();
"""


def esc(text: Any) -> str:
    return html.escape("" if text is None else str(text), quote=True)


def plotlyjs_tags() -> str:
    """The one inline copy of plotly.js from the installed plotly package."""
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    if re.search(r"</script", js, re.IGNORECASE):  # pragma: no cover - would end the tag early
        js = re.sub(r"</(script)", r"<\\/\1", js, flags=re.IGNORECASE)
    return (
        "<script>window.PlotlyConfig = {MathJaxConfig: 'local'};</script>\n"
        f'<script type="text/javascript" id="{PLOTLYJS_ID}" charset="utf-8">{js}</script>\n'
    )


def figure_html(fig: ReportFigure, index: int, kappa: Any = None) -> str:
    """A ``<figure>`` with the title, description and the plotly div (no plotly.js)."""
    import plotly.io as pio

    fig_id = f"tlg-fig-{index}"
    caption = [f"<h3>{esc(fig.title)}</h3>"]
    description = fig.description or ""
    if fig.section == "envelopes" and kappa is not None and "κ" not in description and "kappa" not in description:
        description = (description + " " if description else "") + f"(κ = {kappa})"
    if description:
        caption.append(f"<p>{esc(description)}</p>")
    body = pio.to_html(
        fig.figure,
        config=PLOTLY_CONFIG,
        include_plotlyjs=False,
        include_mathjax=False,
        full_html=False,
        div_id=fig_id,
        default_width="100%",
        default_height="480px",
    )
    source = f' data-source="{esc(fig.source)}"' if fig.source else ""
    return (
        f'<figure class="tlg-figure" id="{fig_id}-box" data-title="{esc(fig.title)}"{source}>\n'
        f'<figcaption>{"".join(caption)}</figcaption>\n<div class="tlg-plot">{body}</div>\n</figure>\n'
    )


def table_html(title: str, table: pd.DataFrame) -> str:
    body = table.to_html(
        index=False,
        border=0,
        classes="tlg-table",
        na_rep="—",
        float_format=lambda x: f"{x:.4g}",
        escape=True,
    )
    return f'<h3>{esc(title)}</h3>\n<div class="table-wrap">{body}</div>\n'


def meta_html(groups: list[tuple[str, list[tuple[str, str]]]]) -> str:
    parts = ['<div class="meta">']
    for label, rows in groups:
        cells = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
        parts.append(f'<table class="meta-{esc(label.split()[0])}"><caption>{esc(label)}</caption>{cells}</table>')
    parts.append("</div>")
    return "\n".join(parts)


def section_html(
    key: str, summary: Summary | None, figures: list[ReportFigure], start_index: int, kappa: Any = None
) -> tuple[str, int]:
    """One ``<section>``; returns its HTML and the next figure index."""
    title = SECTIONS[key]
    extra = f' <span class="extra">{esc(summary.heading_extra)}</span>' if summary and summary.heading_extra else ""
    out = [
        f'<section id="{key}" data-available="{str(bool(summary is None or summary.available)).lower()}">',
        f"<h2>{esc(title)}{extra}</h2>",
    ]
    if summary is not None:
        if summary.available:
            if summary.lead:
                out.append(f'<p class="lead">{esc(summary.lead)}</p>')
            for t_title, table in summary.tables:
                out.append(table_html(t_title, table))
        else:
            out.append(f'<p class="na">{esc(summary.note)}</p>')
    index = start_index
    drawn = [f for f in figures if f.available]
    missing = [f for f in figures if not f.available]
    for fig in drawn:
        out.append(figure_html(fig, index, kappa))
        index += 1
    if missing:
        items = "".join(
            f"<li><strong>{esc(f.title)}</strong>{' (' + esc(f.source) + ')' if f.source else ''}: "
            f"{esc(f.note or 'not available')}</li>"
            for f in missing
        )
        out.append(f'<ul class="na-list">{items}</ul>')
    out.append("</section>")
    return "\n".join(out), index


def head_grid_section(fragment: str | None, why: str) -> str:
    out = ['<section id="head-grid">', f"<h2>{esc('Attention patterns (head grid)')}</h2>"]
    if fragment:
        out.append(
            '<p class="lead">Attention patterns of one text for the chosen heads (circuitsvis), named '
            "L{layer}H{head} · regime. Click a head to enlarge it; hover a cell for its weight.</p>"
        )
        out.append(f'<div class="tlg-head-grid-wrap">\n{fragment}\n</div>')
    else:
        out.append(f'<p class="na">{esc(why)}</p>')
    out.append("</section>")
    return "\n".join(out)


def page_html(title: str, meta: str, nav: list[tuple[str, str, bool]], sections: list[str], footer: str) -> str:
    nav_items = "".join(
        f'<li><a href="#{key}">{esc(label)}</a></li>'
        if ok
        else f'<li><a class="na" href="#{key}">{esc(label)} (not available)</a></li>'
        for key, label, ok in nav
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n{plotlyjs_tags()}</head>\n<body>\n<main>\n"
        f"<header>\n<h1>{esc(title)}</h1>\n{meta}\n</header>\n<nav><ul>{nav_items}</ul></nav>\n"
        + "\n".join(sections)
        + f"\n<footer>{footer}</footer>\n</main>\n<script>{NARROW_SCRIPT}</script>\n</body>\n</html>\n"
    )


def footer_html(source: str | None) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    src = f" from <code>{esc(source)}</code>" if source else ""
    return f"Built {esc(stamp)}{src} by tl_geometry.report.build_report. Self-contained: opens without a network."


def write_section_page(
    out_dir: str | Path,
    key: str,
    label: str,
    summary: Summary,
    figures: list[ReportFigure],
    settings: tuple[str, Iterable[tuple[Any, Any]]],
    title: str | None = None,
) -> Path:
    """Write ``out_dir/index.html`` (created if needed): the self-contained page of one section, as
    ``tl-geometry sparsify``, ``budgets``, ``context`` and ``fact`` write it.

    Parameters
    ----------
    out_dir : str or Path
        The folder of the page.
    key, label : str
        The section's anchor and its name in the page's navigation.
    summary, figures
        The section's lead, tables and figures (:func:`section_html`).
    settings : (str, iterable of (name, value))
        The header's group of settings: its heading and its rows.
    title : str, optional
        The page's title (default: ``label``).
    """
    section, _ = section_html(key, summary, figures, 0)
    heading, rows = settings
    meta = meta_html([(heading, [(str(k), str(v)) for k, v in rows])])
    page = page_html(title or label, meta, [(key, label, True)], [section], footer_html(str(out_dir)))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_atomic(out / "index.html", lambda p: p.write_text(page, encoding="utf-8"))


def check_self_contained(text: str, what: str) -> None:
    """Raise ValueError if ``text`` loads a remote URL (a tag's src / href, or a module import)."""
    for pattern in _REMOTE:
        match = pattern.search(text)
        if match:
            raise ValueError(
                f"{what} loads a remote resource ({match.group(0)[:120]!r}); the report must be self-contained"
            )
