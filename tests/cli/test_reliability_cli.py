"""Bad or unusual input to `analyze` and `tl-geometry`, interrupt and resume: one clear line, nothing lost or mixed.

One test per defect of issue 10 (items 1, 2, 4, 5, 6, 10); each failed before the fix.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_llama_bridge

import tl_geometry as tlg
import tl_geometry.cli.app as cli

MARKER = ".tl-geometry-run"  # the file `tl-geometry run` leaves in its --out directory
TEXT = ["The quick brown fox jumps over the lazy dog. " * 12, "Attention is a weighting of values. " * 10]
SMALL = ["--n-seqs", "3", "--seq-len", "24", "--batch-size", "1", "--no-progress", "--no-diagnostics"]


@pytest.fixture()
def tiny_cli(monkeypatch, llama_bridge):
    """`tl-geometry run` on the tiny random LLaMA instead of loading a model by name."""
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: llama_bridge)
    return llama_bridge


@pytest.fixture()
def no_model(monkeypatch):
    """Fail the test if the command loads a model."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded although the options were invalid")

    monkeypatch.setattr(tlg, "load_model", refuse)


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if "error" in line.lower()]
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("tl-geometry: error: "), err
    return lines[0]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def interrupt_after(monkeypatch, calls: int) -> None:
    """Make the forward pass number ``calls + 1`` raise KeyboardInterrupt (as Ctrl-C would)."""
    import tl_geometry.pipeline.loop as analysis

    real = analysis.run_streaming
    count = {"n": 0}

    def interrupted(*args, **kwargs):
        count["n"] += 1
        if count["n"] > calls:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(analysis, "run_streaming", interrupted)


def write_doc(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "doc.txt"
    path.write_text(text * 40)
    return path


# ----------------------------------------------------------------------------- 1. --force


def test_force_never_deletes_the_working_directory(tmp_path, capsys, monkeypatch, no_model) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    (tmp_path / MARKER).write_text("{}")  # even one that looks like a run
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["run", "--force", "--out", ".", *SMALL], capsys)
    assert code == 2 and "--force will not delete" in one_error_line(err)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_force_refuses_a_directory_that_is_not_a_run(tmp_path, capsys, no_model) -> None:
    out = tmp_path / "photos"
    out.mkdir()
    (out / "a.jpg").write_bytes(b"\xff\xd8")
    code, _, err = run(["run", "--force", "--out", str(out), *SMALL], capsys)
    assert code == 2 and MARKER in one_error_line(err)
    assert (out / "a.jpg").read_bytes() == b"\xff\xd8"
    code, _, err = run(["run", "--out", str(out), *SMALL], capsys)  # nor suggests --force for it
    assert code == 2 and "--force" not in one_error_line(err) and "choose another --out" in err


def test_force_refuses_the_home_directory(tmp_path, capsys, monkeypatch, no_model) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / MARKER).write_text("{}")
    (home / ".bashrc").write_text("export A=1")
    monkeypatch.setenv("HOME", str(home))
    code, _, err = run(["run", "--force", "--out", str(home), *SMALL], capsys)
    assert code == 2 and "--force will not delete" in one_error_line(err)
    assert (home / ".bashrc").read_text() == "export A=1"


def test_empty_out_is_an_error(tmp_path, capsys, monkeypatch, no_model) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["run", "--out", "", *SMALL], capsys)
    line = one_error_line(err)
    assert code == 2 and "--out is empty" in line and "exists" not in line


# ----------------------------------------------------------------------------- 2. resume never mixes runs


def test_analyze_refuses_to_resume_the_run_of_another_model(tmp_path) -> None:
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=16)
    first = tiny_llama_bridge(seed=0)
    tlg.analyze(first, corpus, out_dir=tmp_path / "run", progress=False)
    before = snapshot(tmp_path / "run")
    other = tiny_llama_bridge(seed=1)  # same architecture and name, other weights
    with pytest.raises(tlg.InputError, match="other settings") as caught:
        tlg.analyze(other, corpus, out_dir=tmp_path / "run", progress=False)
    message = str(caught.value)
    assert "model weights" in message and "\n" not in message
    assert "token windows" not in message and "ns (" not in message
    assert snapshot(tmp_path / "run") == before


def test_cli_refuses_to_resume_with_another_corpus(tmp_path, capsys, tiny_cli, monkeypatch) -> None:
    doc_a = write_doc(tmp_path / "a", "Alpha beta gamma delta. ")
    doc_b = write_doc(tmp_path / "b", "One two three four five. ")
    out = tmp_path / "run"
    interrupt_after(monkeypatch, 1)
    code, _, _ = run(["run", "--corpus", str(doc_a), "--out", str(out), *SMALL], capsys)
    assert code == 130
    monkeypatch.undo()
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: tiny_cli)
    before = snapshot(out)
    code, _, err = run(["run", "--corpus", str(doc_b), "--resume", "--out", str(out), *SMALL], capsys)
    line = one_error_line(err)  # the option differs: refused before the model loads (issue 47)
    assert code == 2 and "--corpus (" in line and "model" not in line.split("other settings")[1]
    assert snapshot(out) == before
    saved_text = doc_a.read_text()
    doc_a.write_text(doc_b.read_text())  # the same option, other text: the token windows differ
    code, _, err = run(["run", "--corpus", str(doc_a), "--resume", "--out", str(out), *SMALL], capsys)
    line = one_error_line(err)
    assert code == 2 and "token windows" in line and "model" not in line.split("other settings")[1]
    assert snapshot(out) == before
    doc_a.write_text(saved_text)
    code, _, _ = run(["run", "--corpus", str(doc_a), "--resume", "--out", str(out), *SMALL], capsys)
    assert code == 0
    assert sorted(pd.read_parquet(out / "separability.parquet").seq.unique()) == [0, 1, 2]


# ----------------------------------------------------------------------------- 4. no crash after the model ran


def test_duplicate_sizes_with_bounds_run(tmp_path, capsys, tiny_cli) -> None:
    code, _, err = run(["run", "--ns", "2,1,2", "--out", str(tmp_path / "run"), *SMALL], capsys)
    assert code == 0, err
    table = pd.read_parquet(tmp_path / "run" / "separability.parquet")
    assert sorted(table.n.unique()) == [1, 2] and "precision_lower" in table
    assert not table.duplicated(["seq", "layer", "head", "query_pos", "rank_by", "n"]).any()


@pytest.mark.parametrize("kappa", ["nan", "inf", "-1"])
def test_bad_kappa_is_refused_before_the_model_is_loaded(tmp_path, capsys, no_model, kappa) -> None:
    code, _, err = run(["run", "--kappa", kappa, "--out", str(tmp_path / "run"), *SMALL], capsys)
    assert code == 2 and "--kappa" in one_error_line(err)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64])
def test_unsupported_dtype_is_refused_before_the_model_runs(llama_bridge, monkeypatch, dtype) -> None:
    import tl_geometry.pipeline.loop as analysis

    monkeypatch.setattr(analysis, "run_streaming", lambda *a, **k: pytest.fail("the model ran"))
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=1, seq_len=16)
    with pytest.raises(tlg.InputError, match=r"dtype=torch\.\w+ is not supported.*float64"):
        tlg.analyze(llama_bridge, corpus, dtype=dtype, progress=False)


def test_a_run_that_fails_in_its_first_batch_leaves_nothing_that_blocks_the_fix(
    tmp_path, capsys, tiny_cli, monkeypatch
):
    import tl_geometry.pipeline.loop as analysis
    from tl_geometry.capture.hooks import run_streaming

    def broken(*args, **kwargs):
        raise tlg.InputError("something about this batch is wrong")

    monkeypatch.setattr(analysis, "run_streaming", broken)
    args = ["run", "--out", str(tmp_path / "run"), *SMALL]
    code, _, err = run(args, capsys)
    assert code == 2 and "this batch is wrong" in one_error_line(err)
    monkeypatch.setattr(analysis, "run_streaming", run_streaming)
    code, _, err = run(args, capsys)  # the same command, neither --resume nor --force
    assert code == 0, err


def test_analyze_that_fails_in_its_first_batch_leaves_no_store(tmp_path, llama_bridge, monkeypatch) -> None:
    import tl_geometry.pipeline.loop as analysis

    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=16)
    monkeypatch.setattr(analysis, "run_streaming", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        tlg.analyze(llama_bridge, corpus, out_dir=tmp_path / "run", progress=False)
    monkeypatch.undo()
    result = tlg.analyze(llama_bridge, corpus, ns=[1, 2], out_dir=tmp_path / "run", progress=False)
    assert sorted(result.separability.n.unique()) == [1, 2]


# ----------------------------------------------------------------------------- 5. one line, exit code 2


def test_out_on_a_path_that_cannot_be_written(capsys, no_model) -> None:
    code, _, err = run(["run", "--out", "/sys/tl-geometry-test/run", *SMALL], capsys)
    assert code == 2 and "cannot write to --out" in one_error_line(err)


@pytest.fixture()
def finished_run(tmp_path, capsys, tiny_cli) -> Path:
    out = tmp_path / "done"
    code, _, err = run(["run", "--out", str(out), *SMALL], capsys)
    assert code == 0, err
    return out


def test_report_on_a_truncated_table(finished_run, capsys) -> None:
    for name in ("separability.parquet", "heads.parquet"):
        path = finished_run / name
        saved = path.read_bytes()
        path.write_bytes(saved[: len(saved) // 2])
        code, _, err = run(["report", str(finished_run)], capsys)
        assert code == 2 and f"{name} is damaged" in one_error_line(err)
        path.write_bytes(saved)
    code, _, _ = run(["report", str(finished_run)], capsys)
    assert code == 0


def test_report_on_a_result_of_another_version(finished_run, capsys) -> None:
    meta = json.loads((finished_run / "result.json").read_text())
    meta["format"] = 999
    (finished_run / "result.json").write_text(json.dumps(meta))
    code, _, err = run(["report", str(finished_run)], capsys)
    assert code == 2 and "another version" in one_error_line(err) and "result.json" in err
    del meta["format"]  # as written before the format was recorded
    (finished_run / "result.json").write_text(json.dumps(meta))
    code, _, err = run(["report", str(finished_run)], capsys)
    assert code == 2 and "another version" in one_error_line(err)
    (finished_run / "result.json").write_text('{"model": ')
    code, _, err = run(["report", str(finished_run)], capsys)
    assert code == 2 and "result.json is damaged" in one_error_line(err)


@pytest.fixture()
def interrupted_run(tmp_path, capsys, tiny_cli, monkeypatch) -> tuple[Path, list[str]]:
    out = tmp_path / "half"
    args = ["run", "--out", str(out), *SMALL]
    interrupt_after(monkeypatch, 2)
    code, _, _ = run(args, capsys)
    assert code == 130
    monkeypatch.undo()
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: tiny_cli)
    return out, args


def damage_progress(progress: Path) -> Path:
    path = progress / "progress.json"
    path.write_text(path.read_text()[:20])
    return path


def damage_part(progress: Path) -> Path:
    path = sorted((progress / "separability").glob("part-*.parquet"))[0]
    path.unlink()
    return path


def damage_state(progress: Path) -> Path:
    path = sorted((progress / "state").glob("*.pt"))[0]
    path.write_bytes(path.read_bytes()[:30])
    return path


def damage_part_inside(progress: Path) -> Path:
    """4 KB (at most) changed in the middle of a part: it still parses, its SHA-256 differs."""
    path = sorted((progress / "separability").glob("part-*.parquet"))[0]
    data = path.read_bytes()
    n = min(4096, len(data) // 4)
    start = len(data) // 2 - n // 2
    path.write_bytes(data[:start] + bytes(255 - b for b in data[start : start + n]) + data[start + n :])
    return path


def truncate_part(progress: Path) -> Path:
    path = sorted((progress / "separability").glob("part-*.parquet"))[-1]
    path.write_bytes(path.read_bytes()[:100])
    return path


@pytest.mark.parametrize("damage", [damage_part, damage_part_inside, truncate_part])
def test_resume_redoes_a_damaged_part_and_keeps_the_rest(interrupted_run, tmp_path, capsys, damage) -> None:
    """Issue 47: one window's part missing, truncated or changed inside: --resume computes that
    window's rows again (the saved states already hold it) and keeps every other window; every
    table equals an uninterrupted run's."""
    out, args = interrupted_run
    damage(out / "progress")
    code, _, err = run([*args, "--resume"], capsys)
    assert code == 0, err
    whole = tmp_path / "whole"
    code, _, err = run([*args[:2], str(whole), *args[3:]], capsys)
    assert code == 0, err
    tables = sorted(p.name for p in whole.glob("*.parquet"))
    assert tables == sorted(p.name for p in out.glob("*.parquet")) and "separability.parquet" in tables
    for name in tables:
        pd.testing.assert_frame_equal(pd.read_parquet(out / name), pd.read_parquet(whole / name), check_exact=True)
    assert not (out / "progress").exists()


def test_resume_recomputes_only_the_damaged_window(interrupted_run, capsys, monkeypatch) -> None:
    import tl_geometry.pipeline.loop as analysis

    out, args = interrupted_run
    done = json.loads((out / "progress" / "progress.json").read_text())["done"]
    damage_part_inside(out / "progress")
    real, seen = analysis.run_streaming, []

    def counted(model, info, tokens, ids, *rest, **kw):
        seen.extend(int(i) for i in ids)
        return real(model, info, tokens, ids, *rest, **kw)

    monkeypatch.setattr(analysis, "run_streaming", counted)
    code, _, err = run([*args, "--resume"], capsys)
    assert code == 0, err
    assert len(done) == 2 and sorted(seen) == sorted([done[0], *(i for i in range(3) if i not in done)])


@pytest.mark.parametrize("damage", [damage_progress, damage_state])
def test_resume_of_a_damaged_store_names_the_file(interrupted_run, capsys, damage) -> None:
    out, args = interrupted_run
    path = damage(out / "progress")
    code, _, err = run([*args, "--resume"], capsys)
    line = one_error_line(err)
    assert code == 2 and f"{path} is damaged" in line and "start over" in line


# ----------------------------------------------------------------------------- 6. validation in analyze


def test_analyze_validates_layers_positions_and_sizes(llama_bridge) -> None:
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=16)
    bad = [
        (dict(layers=[1.5]), "layers must be an integer"),
        (dict(layers=[True]), "layers must be an integer"),
        (dict(query_positions=True), "query_positions"),
        (dict(query_positions=[2.0]), "query_positions must be an integer"),
        (dict(ns=[1, "2"]), "ns must be an integer"),
        (dict(batch_size=0), "batch_size must be a positive integer"),
        (dict(batch_size=True), "batch_size must be an integer"),
        (dict(diagnostics="yes"), "diagnostics must be True or False"),
        (dict(bounds=True, kappa=float("nan")), "kappa must be a positive finite number"),
    ]
    for kwargs, message in bad:
        with pytest.raises(tlg.InputError, match=message):
            tlg.analyze(llama_bridge, corpus, progress=False, **kwargs)


def test_analyze_accepts_numpy_integers_and_a_single_layer(llama_bridge) -> None:
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=16)
    plain = tlg.analyze(llama_bridge, corpus, layers=[1], query_positions=[5], batch_size=2, progress=False)
    numpy = tlg.analyze(
        llama_bridge, corpus, layers=np.int64(1), query_positions=np.int64(5), batch_size=np.int64(2), progress=False
    )
    pd.testing.assert_frame_equal(numpy.separability, plain.separability)
    assert sorted(plain.separability.layer.unique()) == [1] and plain.config["query_positions"] == [5]


def test_negative_token_ids_are_refused(llama_bridge) -> None:
    tokens = torch.tensor([[0, 5, -3, 7], [0, 1, 2, 3]])
    with pytest.raises(tlg.InputError, match="token id -3 is negative"):
        tlg.analyze(llama_bridge, tokens, progress=False)


# ----------------------------------------------------------------------------- 10. messages


def test_bad_query_names_only_what_query_accepts(tmp_path, capsys, no_model) -> None:
    code, _, err = run(["run", "--query", "x", "--out", str(tmp_path / "run"), *SMALL], capsys)
    line = one_error_line(err)
    assert code == 2 and "--query" in line and "'last'" in line and "'all'" in line
    assert "log" not in line


def test_report_on_an_interrupted_run_suggests_a_command_that_works(interrupted_run, capsys) -> None:
    out, _ = interrupted_run
    code, _, err = run(["report", str(out)], capsys)
    line = one_error_line(err)
    assert code == 2 and "interrupted run" in line
    command = shlex.split(line.split("`")[1])
    assert command[:2] == ["tl-geometry", "run"] and "--resume" in command
    code, _, err = run(command[1:], capsys)
    assert code == 0, err
    code, _, _ = run(["report", str(out)], capsys)
    assert code == 0


def test_report_on_a_copied_interrupted_run_names_the_copy(interrupted_run, tmp_path, capsys) -> None:
    """Issue 47: the advice named the --out the run was started in, not the directory given."""
    import shutil

    out, _ = interrupted_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = snapshot(out)
    code, _, err = run(["report", str(copy)], capsys)
    command = shlex.split(one_error_line(err).split("`")[1])
    assert code == 2 and command[command.index("--out") + 1] == str(copy) and str(out) not in command
    code, _, err = run(command[1:], capsys)
    assert code == 0, err
    assert (copy / "result.json").is_file() and snapshot(out) == before


def test_resume_command_keeps_an_out_that_names_the_directory(tmp_path, monkeypatch) -> None:
    from tl_geometry.cli.common import resume_command

    monkeypatch.chdir(tmp_path)
    (tmp_path / "r").mkdir()
    assert resume_command(["tl-geometry", "run", "--out", "r", "--force"], tmp_path / "r") == (
        "tl-geometry run --out r --resume"
    )
    assert resume_command(["tl-geometry", "run", "--out=old"], tmp_path / "r") == (
        f"tl-geometry run --resume --out {tmp_path / 'r'}"
    )
    assert resume_command(["tl-geometry", "budgets"], tmp_path / "r").endswith(f"--resume --out {tmp_path / 'r'}")


def test_report_on_a_foreign_directory_leaves_nothing_in_it(tmp_path, capsys, no_model) -> None:
    """Issue 47: `report` left its lock file in a directory it did not write."""
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("mine")
    code, _, err = run(["report", str(foreign)], capsys)
    assert code == 2 and "no result" in one_error_line(err)
    assert sorted(p.name for p in foreign.iterdir()) == ["todo.txt"]


def test_resume_mismatch_names_only_the_difference(tmp_path, llama_bridge) -> None:
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=16)
    tlg.analyze(llama_bridge, corpus, ns=[1, 2, 4], out_dir=tmp_path, progress=False)
    with pytest.raises(tlg.InputError) as caught:
        tlg.analyze(llama_bridge, corpus, ns=[1, 2], out_dir=tmp_path, progress=False)
    message = str(caught.value)
    assert "ns ([1, 2] vs [1, 2, 4])" in message
    for other in ("query_positions", "dtype", "corpus", "model", "token", "layers", "taxonomy"):
        assert other not in message.replace(str(tmp_path), ""), other
    # what does not change the results does not block resuming
    again = tlg.analyze(llama_bridge, corpus, ns=[4, 2, 1, 1], batch_size=1, k_max=7, out_dir=tmp_path, progress=False)
    assert sorted(again.separability.n.unique()) == [1, 2, 4]
