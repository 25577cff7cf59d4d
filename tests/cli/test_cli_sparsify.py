"""``tl-geometry sparsify`` and the sparsification figures."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import tiny_llama_bridge

import tl_geometry as tlg
from tl_geometry.cli.app import main
from tl_geometry.intervention.curve import CURVE_COLUMNS, SparsificationCurve


@pytest.fixture()
def tiny(monkeypatch):
    model = tiny_llama_bridge()
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: model)
    return model


ARGS = ["sparsify", "--n-seqs", "2", "--seq-len", "12", "--ns", "1,4", "--rank-by", "attention,sink_window",
        "--local", "head", "--local-n", "2", "--no-progress", "--full"]  # fmt: skip


def test_sparsify_writes_tables_and_report(tmp_path, tiny, capsys) -> None:
    out = tmp_path / "sp"
    assert main([*ARGS, "--out", str(out)]) == 0
    curve = pd.read_parquet(out / "curve.parquet")
    grid = curve[curve.stage == "grid"]
    assert len(grid) == 2 * 2 * 2 and set(grid.rank_by) == {"attention", "sink_window"}
    n_star = pd.read_parquet(out / "n_star.parquet")
    assert len(n_star) == 4 and set(n_star.columns) >= {"rank_by", "renormalize", "n_star", "sizes_tried"}
    local = pd.read_parquet(out / "local.parquet")
    assert len(local) == 2 * 4  # every (layer, head) of the tiny model
    page = (out / "index.html").read_text()
    assert "Sparsification" in page and "N*_tau" in page and "http://" not in page.split("<body>")[1][:2000]
    assert "full NLL" in capsys.readouterr().out
    saved = json.loads((out / "curve.json").read_text())
    assert saved["full"]["n_tokens"] == 2 * 11
    # an existing directory needs --resume or --force; --resume reuses every point
    assert main([*ARGS, "--out", str(out)]) == 2
    assert main([*ARGS, "--out", str(out), "--resume"]) == 0
    pd.testing.assert_frame_equal(pd.read_parquet(out / "curve.parquet"), curve)
    assert main([*ARGS, "--out", str(out), "--force"]) == 0


def test_sparsify_tolerances_give_n_star_at_each_with_censored_ones_kept(tmp_path, tiny, capsys) -> None:
    out = tmp_path / "sp"
    argv = ["sparsify", "--n-seqs", "2", "--seq-len", "12", "--ns", "1,4", "--rank-by", "attention,random",
            "--renormalize", "both", "--local", "none", "--no-geometry", "--no-progress",
            "--tolerance", "0.05", "--tolerances", "0.01,0.1,0", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    n_star = pd.read_parquet(out / "n_star.parquet")
    assert sorted(set(n_star.tolerance)) == [0.0, 0.01, 0.05, 0.1] and len(n_star) == 4 * 2 * 2
    assert {"censored", "n_max", "n_star_text"} <= set(n_star.columns)
    printed = capsys.readouterr().out
    assert "<NA>" not in printed and printed.count("N* = ") == 16
    assert main([*argv[:-4], "--tolerances", "0.01,x", "--out", str(tmp_path / "other")]) == 2
    assert main([*argv, "--force", "--sensitivity"]) == 0
    sensitivity = pd.read_parquet(out / "sensitivity.parquet")
    assert sensitivity.n.tolist() == [1, 4] and (sensitivity.sensitivity > 0).all()


def test_an_out_of_csv_tables_resumes_into_parquet_and_report_names_the_fix(tmp_path, tiny, capsys) -> None:
    """A sparsify --out of tl_geometry 0.2 held curve.csv, n_star.csv...: --resume writes the
    parquet tables and drops the stale CSVs; `report` refuses the directory in one line."""
    out = tmp_path / "old"
    args = ["sparsify", "--n-seqs", "2", "--seq-len", "12", "--ns", "1,4", "--no-progress", "--no-geometry"]
    assert main([*args, "--out", str(out)]) == 0
    curve = pd.read_parquet(out / "curve.parquet")
    for name in ("curve", "n_star"):  # as the earlier version left it
        pd.read_parquet(out / f"{name}.parquet").to_csv(out / f"{name}.csv", index=False)
        (out / f"{name}.parquet").unlink()
    capsys.readouterr()
    assert main([*args, "--out", str(out), "--resume"]) == 0
    assert not list(out.glob("*.csv")) and {"curve.parquet", "n_star.parquet"} <= {p.name for p in out.iterdir()}
    pd.testing.assert_frame_equal(pd.read_parquet(out / "curve.parquet"), curve)
    assert "curve.parquet" in capsys.readouterr().out
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sparsify writes itself" in err[0] and "tl-geometry run" in err[0]


def test_default_is_a_first_look_and_full_the_study(tmp_path, tiny) -> None:
    args = ["sparsify", "--n-seqs", "2", "--seq-len", "12", "--ns", "1,4", "--no-progress", "--no-geometry"]
    assert main([*args, "--out", str(tmp_path / "quick")]) == 0
    rows = json.loads((tmp_path / "quick" / "curve.json").read_text())["rows"]
    assert {(r["rank_by"], r["renormalize"]) for r in rows} == {("attention", False), ("random", False)}
    assert not any(p.name.startswith("local") for p in (tmp_path / "quick").iterdir())  # no localised loss
    assert main([*args, "--full", "--local-unit", "none", "--out", str(tmp_path / "full")]) == 0
    rows = json.loads((tmp_path / "full" / "curve.json").read_text())["rows"]
    assert {r["rank_by"] for r in rows} == {"attention", "contribution", "random", "sink_window"}
    assert {r["renormalize"] for r in rows} == {False, True}
    assert not any(p.name.startswith("local") for p in (tmp_path / "full").iterdir())  # the explicit option won


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--tolerance", "-1"], "--tolerance"),
        (["--tolerance", "nan"], "--tolerance"),
        (["--ns", "0,2"], "--ns"),
        (["--rank-by", "value"], "not a ranking"),
        (["--local-n", "0"], "n must be"),
        (["--seq-len", "1"], "--seq-len"),
    ],
)
def test_bad_options_one_line_exit_2_nothing_written(tmp_path, monkeypatch, capsys, extra, words) -> None:
    monkeypatch.setattr(tlg, "load_model", lambda *a, **k: pytest.fail("the model must not be loaded"))
    out = tmp_path / "sp"
    assert main([*ARGS, "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tl-geometry: error:") and words in err and "\n" not in err
    assert not out.exists()


def test_resume_without_a_curve(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(tlg, "load_model", lambda *a, **k: pytest.fail("the model must not be loaded"))
    assert main([*ARGS, "--out", str(tmp_path / "none"), "--resume"]) == 2
    assert "holds no curve" in capsys.readouterr().err


# ----------------------------------------------------------------------------- figures


def toy_curve():
    rows = [{"rank_by": r, "renormalize": f, "n": n, "nll": 1 + d, "nll_full": 1.0, "delta_nll_rel": d, "n_tokens": 5, "stage": "grid"}
            for r, scale in (("attention", 1.0), ("random", 4.0), ("sink_window", 2.0)) for f in (False, True)
            for n, d in ((1, 0.8 * scale), (4, 0.04 * scale), (16, 0.0))]  # fmt: skip
    return SparsificationCurve(pd.DataFrame(rows, columns=CURVE_COLUMNS), 1.0, {})


def test_loss_curve_figure() -> None:
    fig = tlg.plot.loss_curve(toy_curve(), tolerance=0.05)
    names = [t.name for t in fig.data]
    assert "random (deletion)" in names and "sink_window (renormalised)" in names
    attention = next(t for t in fig.data if t.name == "attention (deletion)")
    assert list(attention.x) == [1, 4, 16] and np.allclose(attention.y, [0.8, 0.04, 0.0])
    assert "N* attention (deletion) = 4" in names and "N* random (deletion) = 16" in names
    assert next(t for t in fig.data if t.name == "sink_window (deletion)").line.dash == "dash"
    assert fig.layout.xaxis.type == "log"
    assert any(shape.y0 == 0.05 for shape in fig.layout.shapes)


def test_geometry_vs_loss_figure() -> None:
    sep = pd.DataFrame([{"rank_by": r, "n": n, "f_at_rmax": 1.0 / n + (0.1 if r == "random" else 0), "f_at_rmin": 0.5}
                        for r in ("attention", "random", "sink_window") for n in (1, 4, 16)])  # fmt: skip
    fig = tlg.plot.geometry_vs_loss(sep, toy_curve())
    attention = next(t for t in fig.data if t.name.startswith("attention"))
    assert np.allclose(attention.x, [1.0, 0.25, 1 / 16]) and np.allclose(attention.y, [0.8, 0.04, 0.0])
    assert attention.name == "attention (ρ = 1.00)"


def test_localized_loss_map_figure() -> None:
    local = pd.DataFrame(
        [
            {"layer": layer, "head": h, "delta_nll_rel": 10 * layer + h, "n": 8, "rank_by": "attention"}
            for layer in range(3)
            for h in range(2)
        ]
    )
    fig = tlg.plot.localized_loss_map(local)
    assert np.array_equal(np.asarray(fig.data[0].z), np.array([[0, 1], [10, 11], [20, 21]], dtype=float))
    with pytest.raises(tlg.InputError, match="localized_loss"):
        tlg.plot.localized_loss_map(pd.DataFrame())
