"""The `tl-geometry` command: one clear line and exit code 2 for user errors, resume, report rebuild."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pandas as pd
import pytest
from conftest import tiny_llama_bridge

import tl_geometry as tlg
import tl_geometry.cli.app as cli
from tl_geometry.cli.common import MARKER_FILE


@pytest.fixture()
def tiny_cli(monkeypatch):
    """`tl-geometry run` on the tiny random LLaMA instead of loading a model by name."""
    model = tiny_llama_bridge()
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: model)
    return model


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_unknown_model_offline_is_one_line_and_exit_2(tmp_path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "tl_geometry.cli.app", "run", "--model", "no-such-model-xyz", "--out", str(tmp_path / "o")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tl-geometry: error:")]
    assert len(errors) == 1 and "could not load model 'no-such-model-xyz'" in errors[0]
    assert "Traceback" not in proc.stderr


def test_usage_errors(tmp_path, capsys, tiny_cli) -> None:
    code, _, err = run(["run", "--n-seqs", "0", "--out", str(tmp_path / "a")], capsys)
    assert code == 2 and err.strip() == "tl-geometry: error: --n-seqs must be at least 1, got 0"
    code, _, err = run(["run", "--seq-len", "4096", "--out", str(tmp_path / "b"), "--no-progress"], capsys)
    assert code == 2 and "seq_len=4096 is longer than the model's context of 128 tokens" in err
    assert [line for line in err.splitlines() if "error" in line.lower()] == [err.strip().splitlines()[-1]]
    assert "Traceback" not in err
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / MARKER_FILE).write_text("{}")  # a directory an earlier `tl-geometry run` wrote
    (tmp_path / "c" / "x").write_text("old")
    code, _, err = run(["run", "--out", str(tmp_path / "c")], capsys)
    assert code == 2 and "already exists: pass --resume" in err and "--force" in err
    code, _, err = run(["run", "--resume", "--out", str(tmp_path / "c")], capsys)
    assert code == 2 and "holds no interrupted run" in err
    code, _, err = run(["report", str(tmp_path / "missing")], capsys)
    assert code == 2 and "is not a directory" in err


def test_run_writes_tables_report_and_resumes(tmp_path, capsys, tiny_cli, monkeypatch) -> None:
    out = tmp_path / "run"
    args = ["run", "--out", str(out), "--n-seqs", "3", "--seq-len", "32", "--batch-size", "1", "--no-progress"]
    import tl_geometry.pipeline.loop as analysis

    real = analysis.run_streaming
    calls = {"n": 0}

    def interrupted(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(analysis, "run_streaming", interrupted)
    code, _, err = run(args, capsys)
    assert code == 130 and "1 windows are saved" in err and "--resume" in err
    monkeypatch.setattr(analysis, "run_streaming", real)
    code, out_text, _ = run(args + ["--resume"], capsys)
    assert code == 0
    assert "report" in out_text and "regimes" in out_text
    for name in (
        "index.html",
        "run.json",
        "separability.parquet",
        "heads.parquet",
        "head_grid.html",
        "value_norms.parquet",
    ):
        assert (out / name).is_file(), name
    table = pd.read_parquet(out / "separability.parquet")
    assert sorted(table.seq.unique()) == [0, 1, 2]
    assert not table.duplicated(["seq", "layer", "head", "query_pos", "rank_by", "n"]).any()
    # the random control runs by default, next to attention (definitions §7)
    assert table.rank_by.unique().tolist() == ["attention", "random"]
    assert set(table.n_draws[table.rank_by == "random"]) == {16}
    info = json.loads((out / "run.json").read_text())
    assert info["parameters"]["kappa"] == 0.5 and info["versions"]["torch"]
    # the analysis time split into its parts, in the summary and in run.json
    assert re.search(r"analysis \d+\.\ds \(separability \d+\.\ds, envelopes \d+\.\ds, diagnostics \d+\.\ds, "
                     r"regimes \d+\.\ds\), tables", out_text), out_text  # fmt: skip
    assert {"separability_s", "bounds_s", "diagnostics_s", "taxonomy_s"} <= set(info["timings"])
    # a fresh run gives the same table as the interrupted-then-resumed one
    code, _, _ = run(["run", "--out", str(tmp_path / "fresh"), *args[3:]], capsys)
    fresh = pd.read_parquet(tmp_path / "fresh" / "separability.parquet")
    pd.testing.assert_frame_equal(fresh, table)
    # report rebuilds from the saved directory, without a model
    (out / "index.html").unlink()
    code, out_text, _ = run(["report", str(out)], capsys)
    assert code == 0 and (out / "index.html").is_file()
    assert "<script" in (out / "index.html").read_text()
    # --force replaces the directory (what tl-geometry wrote: a table of an older run goes too)
    (out / "stray.parquet").write_text("from an older run")
    code, _, _ = run(args + ["--force"], capsys)
    assert code == 0 and not (out / "stray.parquet").exists() and (out / "index.html").is_file()


def stop_with(error: BaseException):
    def stop(*args, **kwargs):
        raise error

    return stop


@pytest.mark.parametrize(
    "command, work, saved",
    [
        (["sparsify", "--n-seqs", "1", "--seq-len", "12", "--ns", "1"], "sparsification_curve", "{out}/curve.json"),
        (
            ["budgets", "--n-seqs", "1", "--seq-len", "16", "--budgets", "2", "--grid", "1,4"],
            "head_budgets",
            "{out}/budgets.json",
        ),
        (["context", "--contexts", "8,16", "--targets", "4", "--n-docs", "1"], "context_scaling", "{out};"),
    ],
)
def test_commands_that_save_as_they_go_end_alike(tmp_path, capsys, tiny_cli, monkeypatch, command, work, saved) -> None:
    """Ctrl-C: what is saved and the command that continues, exit code 130; a store that cannot be
    resumed: one line that also offers --force, exit code 2."""
    from tl_geometry.io.store import StoreError

    out = tmp_path / "o"
    argv = [*command, "--no-progress", "--out", str(out)]
    monkeypatch.setattr(tlg, work, stop_with(KeyboardInterrupt()))
    code, _, err = run(argv, capsys)
    assert code == 130 and err.splitlines()[-1] == (
        f"tl-geometry: interrupted; the points measured are saved in {saved.format(out=out).rstrip(';')}; "
        f"continue with `tl-geometry {' '.join(argv)} --resume`"
    )
    monkeypatch.setattr(tlg, work, stop_with(StoreError("the saved points are damaged")))
    code, _, err = run([*argv, "--force"], capsys)
    assert code == 2 and err.splitlines()[-1] == (
        "tl-geometry: error: the saved points are damaged; or start over with --force"
    )


@pytest.mark.parametrize("command", ["run", "sparsify", "budgets", "fact", "context"])
def test_no_progress_reaches_the_model_load(tmp_path, capsys, monkeypatch, command) -> None:
    """``--no-progress`` hides the loading's bars too (transformers' GGUF de-quantisation bar)."""
    seen: list[dict] = []

    def load(name, **kw):
        seen.append(kw)
        raise tlg.errors.ModelError("stop here")

    monkeypatch.setattr(tlg, "load_model", load)
    code, _, err = run([command, "--out", str(tmp_path / "o"), "--no-progress"], capsys)
    assert code == 2 and "stop here" in err
    assert [kw.get("progress") for kw in seen] == [False]
    code, _, _ = run([command, "--out", str(tmp_path / "p")], capsys)
    assert code == 2 and seen[-1].get("progress", True) is True
