"""The report and the head grid show both rule modes, the cluster figure and the effect-by-regime figure."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import tl_geometry as tlg
from tl_geometry.plot.circuitsvis_grid import head_grid
from tl_geometry.report import EFFECTS_FILE, build_report

TEXT = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n    y: int = 0\n" * 4


@pytest.fixture(scope="module")
def result(llama_bridge):
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=24)
    return tlg.analyze(llama_bridge, corpus, progress=False)


def _section(page: str, key: str) -> str:
    start = page.index(f'<section id="{key}"')
    return page[start : page.index("</section>", start)]


def test_report_shows_both_modes_and_the_two_tests_of_the_regimes(result, tmp_path) -> None:
    heads = result.classify_heads()
    page = build_report(result, tmp_path / "a").read_text(encoding="utf-8")
    taxonomy = _section(page, "taxonomy")
    nearest = heads.regime_nearest.astype(str).value_counts()
    assert "Nearest mode" in taxonomy and "Heads per regime and layer (nearest)" in taxonomy
    assert f"Reset {nearest.get('Reset', 0)}, Mixer {nearest.get('Mixer', 0)}" in taxonomy
    assert "Are the regimes real? k-means clusters of the heads" in taxonomy
    assert "Do the regimes differ in function?" in taxonomy and "pass effects=" in taxonomy  # no effects given
    # effects as a tensor, then from the run directory's head_effects.parquet
    effects = torch.arange(8, dtype=torch.float64).reshape(2, 4)
    with_effects = _section(
        build_report(result, tmp_path / "b", effects=effects).read_text(encoding="utf-8"), "taxonomy"
    )
    assert "pass effects=" not in with_effects and with_effects.count('class="plotly-graph-div"') == \
        taxonomy.count('class="plotly-graph-div"') + 1  # fmt: skip
    run = tmp_path / "run"
    result.save(run)
    tlg.intervention.patching.effect_frame(effects, "delta_loss").to_parquet(run / EFFECTS_FILE)
    from_dir = _section(build_report(run, run).read_text(encoding="utf-8"), "taxonomy")
    assert "pass effects=" not in from_dir and "delta_loss of each head" in from_dir


def test_head_grid_names_the_nearest_label_where_it_differs(llama_bridge) -> None:
    heads = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 2],
                          "regime": pd.Categorical(["Reset", "Unclassified", "Mixer"]),
                          "regime_nearest": ["Reset", "Mixer", "Mixer"]})  # fmt: skip
    grid = head_grid(llama_bridge, "def f(x):\n    return x", heads, sort_by_regime=False)
    assert grid.names == ["L0H0 · Reset", "L0H1 · Unclassified (nearest: Mixer)", "L1H2 · Mixer"]
    assert grid.heads.regime_nearest.tolist() == ["Reset", "Mixer", "Mixer"]


def test_cli_mean_ablation_feeds_the_effect_figure(tmp_path, capsys, monkeypatch) -> None:
    from conftest import tiny_llama_bridge

    import tl_geometry.cli.app as cli
    from tl_geometry.cli.run import ABLATION_TOKENS

    model = tiny_llama_bridge()
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: model)
    out = tmp_path / "run"
    base = ["run", "--n-seqs", "2", "--seq-len", "24", "--no-progress", "--no-bounds", "--no-diagnostics"]
    assert cli.main(base + ["--out", str(out), "--mean-ablation"]) == 0
    effects = pd.read_parquet(out / EFFECTS_FILE)
    want = tlg.intervention.patching.mean_ablation(model, tlg.load_result(out).tokens[:1, :ABLATION_TOKENS])
    pd.testing.assert_frame_equal(effects, want)
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "pass effects=" not in _section(page, "taxonomy")
    assert cli.main(base + ["--out", str(tmp_path / "plain")]) == 0  # without the flag: no ablation, a note
    assert not (tmp_path / "plain" / EFFECTS_FILE).exists()
    assert "tl-geometry run --mean-ablation" in _section(
        (tmp_path / "plain" / "index.html").read_text(encoding="utf-8"), "taxonomy"
    )
    capsys.readouterr()


def test_report_cross_tabulates_regimes_against_head_types(result, llama_bridge, tmp_path) -> None:
    without = _section(build_report(result, tmp_path / "none").read_text(encoding="utf-8"), "head_types")
    assert "not available: pass head_types=" in without and "plotly-graph-div" not in without
    table = tlg.head_types(llama_bridge, result, n_seqs=2, half_len=8, threshold=1e-9)  # every head typed
    page = build_report(result, tmp_path / "types", head_types=table).read_text(encoding="utf-8")
    section = _section(page, "head_types")
    assert f"{len(table)} of {len(table)} heads have a circuit type" in section
    assert section.count('class="plotly-graph-div"') == 2 and "Regimes (nearest) against circuit head types" in section
    assert section.count("<tr>") >= len(table)  # the typed-heads table: one row per typed head
    with pytest.raises(tlg.InputError, match="regimes"):
        build_report(result, tmp_path / "bad", head_types=table.drop(columns="regime_strict"))
