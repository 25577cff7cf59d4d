"""The head grid (tl_geometry.plot.circuitsvis_grid) and the HTML report (tl_geometry.report), without a browser.

The page must be self-contained: no script / link / img / iframe with a remote src or href, plotly.js
inlined exactly once, circuitsvis' script inline in the head grid (never its CDN).
"""

from __future__ import annotations

import copy
import json
import re
import sys
import types
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest
import torch
from circuitsvis.utils.render import RenderedHTML

import tl_geometry as tlg
from tl_geometry.errors import InputError
from tl_geometry.models import hook_pattern_name
from tl_geometry.plot.circuitsvis_grid import HeadGrid, head_grid, head_grid_html
from tl_geometry.report import PLOTLYJS_ID, ReportFigure, build_report, default_figures
from tl_geometry.report.figures import as_report_figures, guess_section

TEXT = ["The quick brown fox jumps over the lazy dog. " * 6, "Attention is a weighting of values. " * 6]
GRID_TEXT = "def f(x):\n    return x  # </script> <!-- tag"
REGIMES = ["Retriever", "Reset", "Mixer", "Unclassified"]


def heads_of(n_layers: int, n_heads: int) -> pd.DataFrame:
    """A heads table shaped like classify_heads' (regime categorical in its order, a margin)."""
    rows = [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    labels = [REGIMES[(3 * layer + head) % 4] for layer, head in rows]
    return pd.DataFrame({
        "layer": [r[0] for r in rows], "head": [r[1] for r in rows],
        "regime": pd.Categorical(labels, categories=REGIMES),
        "margin": [0.1 * (i % 5) for i in range(len(rows))],
    })  # fmt: skip


class Tags(HTMLParser):
    """Every start tag with its attributes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def remote_refs(page: str) -> list[str]:
    parser = Tags()
    parser.feed(page)
    out = []
    for tag, attrs in parser.tags:
        if tag in ("script", "link", "img", "iframe", "source", "embed"):
            for key in ("src", "href"):
                value = (attrs.get(key) or "").strip().lower()
                if value.startswith(("http:", "https:", "//")):
                    out.append(f"<{tag} {key}={value}>")
    # the grep of the brief, on the raw text of the tags
    out += re.findall(r"<(?:script|link)\b[^>]*\b(?:src|href)=\"https?:[^\"]*\"", page, flags=re.IGNORECASE)
    out += re.findall(r"""\b(?:from|import)\s*\(?\s*["'](?:https?:)?//[^"']*""", page)  # ES module imports
    return out


@pytest.fixture(scope="module")
def result(llama_bridge):
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=24)
    return tlg.analyze(llama_bridge, corpus, diagnostics=True, bounds=True, progress=False)


@pytest.fixture(scope="module")
def heads(result):
    return heads_of(result.model.n_layers, result.model.n_heads)


@pytest.fixture(scope="module")
def grid(llama_bridge, heads):
    return head_grid(llama_bridge, GRID_TEXT, heads)


def figures_of(result) -> list[tuple]:
    by_n = result.mean_by_n()
    env = result.envelopes()
    f1 = go.Figure([go.Scatter(x=by_n.n, y=by_n.precision, name="precision"),
                    go.Scatter(x=by_n.n, y=by_n.recall, name="recall")])  # fmt: skip
    f2 = go.Figure([go.Scatter(x=env.n, y=env.precision_lower, name="lower"),
                    go.Scatter(x=env.n, y=env.precision_upper, name="upper")])  # fmt: skip
    f3 = go.Figure(go.Bar(x=result.value_norms.layer, y=result.value_norms.sink_ratio))
    return [
        ("Precision & recall by N", "mean over windows, layers and heads <b>not bold</b>", f1),
        ("Precision envelope", "mean lower and upper bounds", f2, "envelopes"),
        ReportFigure("Sink ratio per layer", "value norm of the sink over the median", f3, section="diagnostics"),
    ]


@pytest.fixture(scope="module")
def page(result, grid, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("report")
    path = build_report(result, out, figures=figures_of(result), head_grid_html=grid.fragment())
    assert path == out / "index.html"
    return path.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------- page


def test_page_is_self_contained(page: str) -> None:
    assert remote_refs(page) == []
    assert "unpkg.com" not in page
    assert page.lstrip().startswith("<!DOCTYPE html>")


def test_page_cites_the_definitions_never_the_spec(page: str) -> None:
    assert "(definitions §4)" in page  # the envelopes' lead names the user's page
    assert re.search(r"\bSPEC\b", page) is None  # the spec is not the users' to read


def test_plotly_js_is_embedded_exactly_once(page: str) -> None:
    assert page.count("* plotly.js v") == 1  # the bundle's banner
    assert page.count(f'id="{PLOTLYJS_ID}"') == 1
    assert page.index(f'id="{PLOTLYJS_ID}"') < page.index("<body>")  # loaded before any figure
    assert page.count("Plotly.newPlot(") == 3
    assert page.count('class="plotly-graph-div"') == 3


def test_every_figure_title_and_section_appears(page: str) -> None:
    for title in ("Precision &amp; recall by N", "Precision envelope", "Sink ratio per layer"):
        assert f'data-title="{title}"' in page
        assert f"<h3>{title}</h3>" in page
    assert "&lt;b&gt;not bold&lt;/b&gt;" in page  # descriptions are text, not HTML
    for key in ("separability", "envelopes", "diagnostics", "taxonomy", "head-grid"):
        assert f'<section id="{key}"' in page
    envelopes = page[page.index('<section id="envelopes"') : page.index('<section id="diagnostics"')]
    assert "κ = 0.5" in envelopes and "Precision envelope" in envelopes
    diagnostics = page[page.index('<section id="diagnostics"') : page.index('<section id="taxonomy"')]
    assert "Sink ratio per layer" in diagnostics and "sink_ratio" in diagnostics


def test_header_has_model_corpus_parameters_timings_versions(page: str, result) -> None:
    header = page[page.index("<header>") : page.index("</header>")]
    for text in ("tiny-llama", "TransformerBridge", "2 × 4 (2 key/value heads)", "2 × 24 tokens", "texts",
                 "kappa=0.5", "k_max=64", "total_s", "forward_s", "transformer-lens", "plotly", "circuitsvis",
                 "python"):  # fmt: skip
        assert text in header, text


def test_head_grid_is_in_the_page_with_circuitsvis_inline(page: str, grid: HeadGrid) -> None:
    section = page[page.index('<section id="head-grid"') :]
    assert 'class="tlg-head-grid"' in section
    assert "CircuitsVis.render(" in section and "CircuitsVis.AttentionHeads" in section
    mount = re.search(r'<div id="(circuits-vis-[0-9a-f-]+)"[^>]*></div>', section)
    assert mount is not None, "the mount point is a closed div"


# ------------------------------------------------------------------------------------- head grid


def test_head_grid_fragment_inlines_the_circuitsvis_script(grid: HeadGrid) -> None:
    import circuitsvis

    fragment = grid.fragment()
    bundle = (Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js").read_text(encoding="utf-8")
    assert bundle[:2000] in fragment  # the library itself, inline
    assert "unpkg" not in fragment and "import {" not in fragment
    assert remote_refs(fragment) == []
    assert isinstance(grid, RenderedHTML)
    assert "unpkg.com" in grid.cdn_src  # what circuitsvis would do in a notebook online: never in the page


def test_head_grid_escapes_tokens_that_would_end_the_script(grid: HeadGrid) -> None:
    assert "<" in "".join(grid.tokens)  # the tokens themselves are intact
    script = grid.local_src[grid.local_src.index("CircuitsVis.render(") :]  # a notebook's copy
    assert script.count("</script>") == 1 and "<!--" not in script
    props = script[script.index("{") : script.rindex("}") + 1]
    assert json.loads(props)["tokens"] == grid.tokens
    fragment = grid.fragment()  # the report's copy: the props in a JSON element circuitsvis reads
    data = re.search(
        r'<script type="application/json" id="circuits-vis-[0-9a-f-]+-data"[^>]*>([^<]*)</script>', fragment
    )
    assert data is not None and json.loads(data.group(1))["tokens"] == grid.tokens


def test_head_grid_names_and_regime_order(llama_bridge, grid: HeadGrid, heads: pd.DataFrame) -> None:
    assert len(grid.heads) == len(heads)
    order = [REGIMES.index(r) for r in grid.heads.regime]
    assert order == sorted(order)
    row = heads.iloc[5]
    assert f"L{row['layer']}H{row['head']} · {row['regime']}" in grid.names
    plain = head_grid(llama_bridge, GRID_TEXT, layers=[1])
    assert plain.names == ["L1H0", "L1H1", "L1H2", "L1H3"]
    pairs = head_grid(llama_bridge, [0, 70, 71, 72], [(1, 2), (0, 3)])
    assert pairs.names == ["L0H3", "L1H2"] and pairs.token_ids == [0, 70, 71, 72]
    unsorted = head_grid(llama_bridge, GRID_TEXT, heads, sort_by_regime=False)
    assert list(zip(unsorted.heads.layer, unsorted.heads["head"])) == sorted(zip(heads.layer, heads["head"]))


def test_head_grid_filters_and_caps(llama_bridge, heads: pd.DataFrame) -> None:
    only = head_grid(llama_bridge, GRID_TEXT, heads, regimes=["Retriever", "Mixer"])
    assert set(only.heads.regime) == {"Retriever", "Mixer"}
    assert len(only.heads) == int(heads.regime.isin(["Retriever", "Mixer"]).sum())
    capped = head_grid(llama_bridge, GRID_TEXT, heads, max_heads=4)
    assert sorted(capped.heads.regime) == sorted(REGIMES)  # each regime keeps a share
    with pytest.raises(InputError, match="heads table"):
        head_grid(llama_bridge, GRID_TEXT, regimes=["Retriever"])
    with pytest.raises(InputError, match="unknown regimes"):
        head_grid(llama_bridge, GRID_TEXT, heads, regimes=["Copier"])
    with pytest.raises(InputError, match="do not exist"):
        head_grid(llama_bridge, GRID_TEXT, [(5, 0)])
    with pytest.warns(UserWarning, match="first 8"):
        short = head_grid(llama_bridge, GRID_TEXT, layers=[0], max_tokens=8)
    assert len(short.tokens) == 8


def test_head_grid_hooks_only_the_needed_patterns(llama_bridge, monkeypatch) -> None:
    seen: list[list[str]] = []
    original = llama_bridge.run_with_hooks

    def spy(*args, fwd_hooks=(), **kwargs):
        seen.append([name for name, _ in fwd_hooks])
        return original(*args, fwd_hooks=fwd_hooks, **kwargs)

    monkeypatch.setattr(llama_bridge, "run_with_hooks", spy)
    grid = head_grid(llama_bridge, GRID_TEXT, [(0, 1), (0, 2)])
    assert seen == [[hook_pattern_name(0)]]
    assert grid.names == ["L0H1", "L0H2"]
    seen.clear()
    head_grid(llama_bridge, GRID_TEXT)
    assert seen == [[hook_pattern_name(0), hook_pattern_name(1)]]
    monkeypatch.undo()
    logits = llama_bridge(torch.tensor([grid.token_ids]))  # no hook is left behind to stop this pass
    assert logits.shape[-1] == llama_bridge.cfg.d_vocab


def test_head_grid_patterns_equal_run_with_cache(llama_bridge) -> None:
    grid = head_grid(llama_bridge, GRID_TEXT, [(1, 3)], decimals=6)
    _, cache = llama_bridge.run_with_cache(torch.tensor([grid.token_ids]))
    expected = cache[hook_pattern_name(1)][0, 3]
    props = grid.local_src[grid.local_src.index("CircuitsVis.AttentionHeads,") :]
    got = json.loads(props[props.index("{") : props.rindex("}") + 1])["attention"][0]
    assert abs(torch.tensor(got) - expected).max() < 1e-5


def test_head_grid_html_is_the_fragment(llama_bridge) -> None:
    text = head_grid_html(llama_bridge, "Hello", layers=[0])
    assert text.startswith('<div class="tlg-head-grid"') and "CircuitsVis.render(" in text


# ---------------------------------------------------------------------------------- from a directory


def test_build_report_from_a_saved_directory_without_a_model(result, grid: HeadGrid, tmp_path) -> None:
    run = result.save(tmp_path / "run")
    (run / "head_grid.html").write_text(grid.fragment(), encoding="utf-8")
    heads_of(result.model.n_layers, result.model.n_heads).to_parquet(run / "heads.parquet", index=False)
    (run / "run.json").write_text(json.dumps({"timings": {"load_s": 12.5, "world_size": 2}, "versions": {"torch": "9.9.9"},
                                              "python": "3.99"}))  # fmt: skip
    path = build_report(run, tmp_path / "out", figures=figures_of(tlg.load_result(run)))
    page = path.read_text(encoding="utf-8")
    assert remote_refs(page) == []
    assert page.count("* plotly.js v") == 1 and page.count("Plotly.newPlot(") == 3
    assert "CircuitsVis.render(" in page  # head_grid.html was picked up
    header = page[: page.index("</header>")]
    assert "load_s" in header and "12.50 s" in header and "9.9.9" in header and "recorded by the run" in header
    assert "<tr><th>world_size</th><td>2</td></tr>" in header  # a count, not a time
    assert "tiny-llama" in header
    taxonomy = page[page.index('<section id="taxonomy"') : page.index('<section id="head-grid"')]
    assert "8 heads: Retriever 2, Reset 2, Mixer 2, Unclassified 2" in taxonomy  # heads.parquet was read


def test_build_report_defaults_say_what_is_missing(llama_bridge, tmp_path) -> None:
    bare = tlg.analyze(llama_bridge, tlg.corpus.from_texts(TEXT, n_seqs=1, seq_len=16), progress=False)
    page = build_report(bare, tmp_path).read_text(encoding="utf-8")  # default figures, no head grid
    assert remote_refs(page) == []
    assert page.count("* plotly.js v") == 1
    assert "not available: run with bounds" in page
    assert "not available: run with diagnostics" in page
    assert "not available: pass head_grid_html=" in page
    assert 'id="separability" data-available="true"' in page


def test_build_report_refuses_a_cdn_head_grid(result, grid: HeadGrid, tmp_path) -> None:
    with pytest.raises(InputError, match="remote"):
        build_report(result, tmp_path, figures=[], head_grid_html=grid.cdn_src)
    page = build_report(result, tmp_path, figures=[], head_grid_html=grid).read_text(encoding="utf-8")
    assert "CircuitsVis.render(" in page and "unpkg" not in page


# ----------------------------------------------------------------------------------------- figures


def test_figures_are_checked_and_sections_guessed() -> None:
    fig = go.Figure()
    out = as_report_figures([("Recall by N", "", fig), ("Regime shares", "d", fig), ("Whatever", "d", fig)])
    assert [f.section for f in out] == ["separability", "taxonomy", "other"]
    assert guess_section("precision_envelope") == "envelopes" and guess_section("value_norms") == "diagnostics"
    with pytest.raises(InputError, match="not a plotly Figure"):
        as_report_figures([("x", "y", {"data": []})])
    with pytest.raises(InputError, match="unknown section"):
        as_report_figures([("x", "y", fig, "nowhere")])
    with pytest.raises(InputError, match="tuples"):
        as_report_figures([fig])


def test_default_figures_calls_plot_functions_and_lists_the_unavailable(result, monkeypatch) -> None:
    plot = types.ModuleType("tl_geometry.plot")

    def precision_recall(result, *, ns=None):
        """Mean precision and recall by N.

        Long text."""
        return go.Figure(go.Scatter(x=[1, 2], y=[1, 0.5]), layout_title_text="Precision and recall")

    def envelope_bands(result):
        """Envelopes."""
        raise InputError("this result has no bounds: run tlg.analyze(..., bounds=True) first")

    def regime_map(result, heads):
        """Regimes per layer and head."""
        return go.Figure(go.Heatmap(z=[[0, 1]]))

    def broken_profile(result):
        raise ZeroDivisionError("oops")

    def save_all(figures, path):  # not a figure function: first parameter is not the result
        raise AssertionError("must not be called")

    for fn in (precision_recall, envelope_bands, regime_map, broken_profile, save_all):
        fn.__module__ = "tl_geometry.plot"
        setattr(plot, fn.__name__, fn)
    plot.__all__ = ["precision_recall", "envelope_bands", "regime_map", "broken_profile", "save_all"]
    monkeypatch.setitem(sys.modules, "tl_geometry.plot", plot)

    no_taxonomy = copy.copy(result)
    no_taxonomy.regime_features = None  # as a result analysed without the taxonomy
    with pytest.warns(UserWarning, match="broken_profile failed"):
        figs = default_figures(no_taxonomy)
    by_source = {f.source.rsplit(".", 1)[1]: f for f in figs}
    assert set(by_source) == {"precision_recall", "envelope_bands", "regime_map", "broken_profile"}
    assert by_source["precision_recall"].available and by_source["precision_recall"].title == "Precision and recall"
    assert by_source["precision_recall"].description == "Mean precision and recall by N."
    assert by_source["precision_recall"].section == "separability"
    note = by_source["envelope_bands"].note
    assert note.startswith("not available: ") and "bounds=True" in note
    assert by_source["envelope_bands"].section == "envelopes"
    assert not by_source["regime_map"].available and "taxonomy" in by_source["regime_map"].note
    assert not by_source["broken_profile"].available

    heads = heads_of(result.model.n_layers, result.model.n_heads)
    with pytest.warns(UserWarning):
        figs = default_figures(result, heads=heads)
    assert [f.source.rsplit(".", 1)[1] for f in figs if f.available] == ["precision_recall", "regime_map"]


def test_default_figures_without_a_plot_module(result, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tl_geometry.plot", None)  # import raises ModuleNotFoundError
    assert default_figures(result) == []


def test_default_figures_with_the_real_plot_module(result) -> None:
    import tl_geometry.plot  # noqa: F401  (a dependency of the package: its absence is a failure, not a skip)

    figs = default_figures(result)
    assert figs, "tl_geometry.plot exists but no figure function was found"
    for f in figs:
        assert f.available or (f.note or "").startswith("not available: "), f
    drawn = {f.source for f in figs if f.available}
    assert "tl_geometry.plot.separability_by_n" in drawn and "tl_geometry.plot.envelopes_by_n" in drawn
    sections = {f.source: f.section for f in figs}
    assert sections.get("tl_geometry.plot.norms_by_position") == "diagnostics"
    assert sections.get("tl_geometry.plot.regimes_by_layer") == "taxonomy"


def test_a_commands_page_holds_its_title_settings_and_one_section(tmp_path) -> None:
    """The page of sparsify, budgets, context and fact (report/page.write_section_page)."""
    from tl_geometry.report.page import check_self_contained, write_section_page
    from tl_geometry.report.sections import Summary

    summary = Summary(available=True, lead="the lead", tables=[("a table", pd.DataFrame({"n": [1, 2]}))])
    figure = ReportFigure("Loss by N", "a caption", go.Figure(go.Scatter(x=[1, 2], y=[3, 4])), "budgets")
    path = write_section_page(
        tmp_path / "new", "budgets", "Per-head budgets", summary, [figure], ("Budgets", {"model": "toy"}.items()),
        title="tl_geometry per-head budgets: toy",
    )  # fmt: skip
    text = path.read_text()
    check_self_contained(text, "the page")
    assert path == tmp_path / "new" / "index.html"
    assert "<title>tl_geometry per-head budgets: toy</title>" in text and 'href="#budgets">Per-head budgets<' in text
    assert "Budgets" in text and "toy" in text and "the lead" in text and "Loss by N" in text
    assert text.count("<section") == 1
