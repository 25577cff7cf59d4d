"""``--resume`` with other settings than the saved run's: one line naming each difference, before the
model loads, for every command (issue 47, severe 1 and the medium ``--seed 5`` case).

The settings come from one place (``tl_geometry.cli.common.run_settings``): every option but the
presentation-only ones, recorded in ``--out`` when a command claims it.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import tiny_llama_bridge

import tl_geometry as tlg
from tl_geometry.cli.app import main
from tl_geometry.cli.common import MARKER_FILE

BUDGETS = ["budgets", "--n-seqs", "1", "--seq-len", "16", "--budgets", "4", "--rules", "uniform,geometry",
           "--grid", "4,8", "--error-tolerance", "0.1", "--no-progress"]  # fmt: skip
SPARSIFY = ["sparsify", "--n-seqs", "2", "--seq-len", "12", "--ns", "1,4", "--no-progress", "--no-geometry"]
RUN = ["run", "--n-seqs", "3", "--seq-len", "24", "--batch-size", "1", "--no-progress", "--no-diagnostics"]


@pytest.fixture()
def tiny(monkeypatch):
    model = tiny_llama_bridge()
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: model)
    return model


def refuse_model(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(tlg, "load_model", refuse)


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("tl-geometry: error: "), err
    return lines[0]


def replaced(argv: list[str], option: str, value: str) -> list[str]:
    i = argv.index(option)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


@pytest.mark.parametrize(
    "option, value",
    [("--error-tolerance", "0.5"), ("--tolerance", "0.2"), ("--grid", "4,12"), ("--budgets", "5"), ("--n-seqs", "2")],
)
def test_budgets_resume_with_other_settings_is_refused_before_the_model_loads(
    tmp_path, tiny, capsys, monkeypatch, option, value
) -> None:
    """The issue's reproduction: the 0.5 allocation beside the loss measured for the 0.1 one."""
    out = tmp_path / "b"
    assert main([*BUDGETS, "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    refuse_model(monkeypatch)
    argv = replaced(BUDGETS, option, value) if option in BUDGETS else [*BUDGETS, option, value]
    assert main([*argv, "--out", str(out), "--resume"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "other settings" in line and f"{option} (" in line, line
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # nothing mixed


def test_budgets_resume_with_the_same_settings_continues(tmp_path, tiny, capsys) -> None:
    out = tmp_path / "b"
    assert main([*BUDGETS, "--out", str(out)]) == 0
    table = pd.read_parquet(out / "budgets.parquet")
    assert main([*BUDGETS, "--out", str(out), "--resume", "--no-progress"]) == 0
    pd.testing.assert_frame_equal(pd.read_parquet(out / "budgets.parquet"), table)


def test_sparsify_resume_with_another_seed_is_refused_before_the_model_loads(
    tmp_path, tiny, capsys, monkeypatch
) -> None:
    out = tmp_path / "sp"
    assert main([*SPARSIFY, "--out", str(out)]) == 0
    capsys.readouterr()
    refuse_model(monkeypatch)
    assert main([*SPARSIFY, "--seed", "5", "--out", str(out), "--resume"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--seed (5 vs 0)" in line


def test_sparsify_full_is_the_options_it_sets(tmp_path, tiny, capsys) -> None:
    """``--full`` only sets the defaults of three options: the same options given by hand resume it."""
    out = tmp_path / "sp"
    full = [*SPARSIFY, "--full", "--local-n", "2"]
    assert main([*full, "--out", str(out)]) == 0
    by_hand = [*SPARSIFY, "--local-n", "2", "--rank-by", "attention,contribution,random,sink_window"]
    by_hand += ["--renormalize", "both", "--local-unit", "layer"]
    assert main([*by_hand, "--out", str(out), "--resume"]) == 0


@pytest.fixture()
def interrupted_run(tmp_path, capsys, tiny, monkeypatch):
    import tl_geometry.pipeline.loop as analysis

    real, count = analysis.run_streaming, {"n": 0}

    def interrupted(*args, **kwargs):
        count["n"] += 1
        if count["n"] > 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(analysis, "run_streaming", interrupted)
    out = tmp_path / "half"
    assert main([*RUN, "--out", str(out)]) == 130
    monkeypatch.setattr(analysis, "run_streaming", real)
    capsys.readouterr()
    return out


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--seed", "5"], "--seed (5 vs 0)"),
        (["--kappa", "0.25"], "--kappa (0.25 vs 0.5)"),
        (["--corpus", "elsewhere.txt"], "--corpus (elsewhere.txt vs python-docs)"),
        (["--dtype", "float64"], "--dtype (float64 vs float32)"),
    ],
)
def test_run_resume_with_other_settings_is_refused_before_the_model_loads(
    interrupted_run, capsys, monkeypatch, extra, named
) -> None:
    refuse_model(monkeypatch)
    assert main([*RUN, *extra, "--out", str(interrupted_run), "--resume"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert named in line and "(here vs saved)" in line, line


def test_run_resume_with_the_preset_given_explicitly_continues(interrupted_run, tiny, capsys, monkeypatch) -> None:
    """``--seed 0`` is the preset's value: the same settings as leaving it out."""
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: tiny)
    assert main([*RUN, "--seed", "0", "--out", str(interrupted_run), "--resume"]) == 0
    assert (interrupted_run / "result.json").is_file()


def test_a_run_recorded_before_settings_were_still_resumes(interrupted_run, tiny, capsys, monkeypatch) -> None:
    marker = interrupted_run / MARKER_FILE
    marker.write_text(json.dumps({"command": json.loads(marker.read_text())["command"]}))
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: tiny)
    assert main([*RUN, "--out", str(interrupted_run), "--resume"]) == 0


def test_the_marker_records_the_settings_and_the_version(tmp_path, tiny) -> None:
    out = tmp_path / "b"
    assert main([*BUDGETS, "--out", str(out)]) == 0
    mark = json.loads((out / MARKER_FILE).read_text())
    assert mark["version"] == tlg.__version__
    assert mark["settings"]["--error-tolerance"] == 0.1 and mark["settings"]["command"] == "budgets"
    assert not {"--out", "--resume", "--force", "--no-progress"} & set(mark["settings"])
