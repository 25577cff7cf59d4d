"""The run directory of `tl-geometry`: one command at a time, `--force` deletes only its own files,
links, a full disk, and `report` on a run that has no result yet (issue 23, items 1, 3, 4, 5).

Each test failed before the fix.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import torchrun

import tl_geometry as tlg
import tl_geometry.cli.app as cli

REPO = Path(__file__).resolve().parents[2]
MARKER = ".tl-geometry-run"
SMALL = ["--n-seqs", "2", "--seq-len", "16", "--batch-size", "1", "--no-progress", "--no-diagnostics"]

# `tl-geometry ARGS...` on the tiny LLaMA, whose loading says so (argv[1]) and then waits for ever.
HOLDER = r"""
import os, pathlib, sys, time
sys.path.insert(0, sys.argv[2])
import tl_geometry as tlg
import tl_geometry.cli.app as cli

def load_model(name, **kwargs):
    pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))
    while True:
        time.sleep(1)

tlg.load_model = load_model
sys.exit(cli.main(sys.argv[3:]))
"""


@pytest.fixture()
def tiny_cli(monkeypatch, llama_bridge):
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: llama_bridge)
    return llama_bridge


@pytest.fixture()
def no_model(monkeypatch):
    monkeypatch.setattr(tlg, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))


def run(argv: list[str], capsys) -> tuple[int, str]:
    code = cli.main(argv)
    return code, capsys.readouterr().err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if "error" in line.lower()]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("tl-geometry: error: "), err
    return lines[0]


def start_holder(tmp_path: Path, argv: list[str]) -> subprocess.Popen:
    """A `tl-geometry` process that has taken its --out and is loading its model (for ever)."""
    loading = tmp_path / "loading"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(loading), str(REPO), *argv],
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
        stderr=subprocess.PIPE,
        text=True,
    )
    while not loading.exists():
        if proc.poll() is not None:
            pytest.fail(f"the first command ended ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.05)
    return proc


# ----------------------------------------------------------------------------- 1. the lock


def test_a_second_command_on_an_out_in_use_is_refused_and_a_dead_holder_is_replaced(
    tmp_path, capsys, monkeypatch, llama_bridge
) -> None:
    out = tmp_path / "run"
    first = ["run", "--ns", "1,2", "--out", str(out), *SMALL]
    holder = start_holder(tmp_path, first)
    try:
        monkeypatch.setattr(tlg, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
        for second in (
            ["run", "--ns", "1,4", "--out", str(out), *SMALL],  # other settings
            first,  # the same command
            ["run", "--resume", "--out", str(out), *SMALL],
            ["sparsify", "--out", str(out), *SMALL[:4]],
            ["context", "--out", str(out), "--contexts", "16,32", "--targets", "4", "--no-progress"],
            ["budgets", "--out", str(out), *SMALL[:4], "--budgets", "4"],
            ["fact", "--out", str(out), "--amounts", "0,8", "--ns", "4"],
            ["report", str(out)],
        ):
            code, err = run(second, capsys)
            line = one_error_line(err)
            assert code == 2 and f"pid {holder.pid}" in line and "in use" in line, second
            assert "run --ns 1,2" in line and "result.save" not in line
        assert holder.poll() is None  # the first one goes on
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: llama_bridge)
    code, err = run(first, capsys)  # the dead holder's lock is free: the same command now runs
    assert code == 0, err
    assert (out / "result.json").is_file() and not (out / ".tl-geometry-lock.json").exists()


#: Valid options of each command that a torchrun group can run.
OPTIONS = {"run": SMALL[:4], "sparsify": SMALL[:4], "context": ["--contexts", "16,32", "--targets", "4"]}


@pytest.mark.parametrize("command", list(OPTIONS))
def test_torchrun_group_is_refused_together(tmp_path, command) -> None:
    from tl_geometry.io.lock import RunLock

    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    with RunLock(out, command=["the", "first"]):
        proc = subprocess.run(
            [*torchrun(tmp_path), "-m", "tl_geometry", command, "--out", str(out), *OPTIONS[command]],
            env=env,
            capture_output=True,
            text=True,
        )
    # one line for the group, by rank 0 (issue 47: once per rank before); torchrun's report follows
    refusals = proc.stderr.split("tl-geometry: error: ")[1:]
    assert proc.returncode != 0 and len(refusals) == 1, proc.stderr
    assert all(f"pid {os.getpid()}" in line and "`the first`" in line for line in refusals)
    assert "loading smollm2" not in proc.stderr


# ----------------------------------------------------------------------------- 2. --force and links


def test_force_refuses_a_run_directory_holding_a_users_files(tmp_path, capsys, no_model) -> None:
    out = tmp_path / "run"
    (out / "progress").mkdir(parents=True)
    (out / MARKER).write_text('{"command": ["tl-geometry", "run"]}')
    (out / "separability.parquet").write_bytes(b"old")
    (out / "mydata").mkdir()
    (out / "mydata" / "x.parquet").write_bytes(b"mine")
    (out / "notes.txt").write_text("keep me")
    code, err = run(["run", "--force", "--out", str(out), *SMALL], capsys)
    line = one_error_line(err)
    assert code == 2 and f"will not delete {out / 'mydata'}" in line and "choose another --out" in line
    (out / "mydata" / "x.parquet").unlink()
    (out / "mydata").rmdir()
    code, err = run(["run", "--force", "--out", str(out), *SMALL], capsys)
    assert code == 2 and f"will not delete {out / 'notes.txt'}" in one_error_line(err)
    (out / "progress" / "notes.txt").write_text("keep me")  # in a folder tl-geometry writes, too
    (out / "notes.txt").unlink()
    code, err = run(["run", "--force", "--out", str(out), *SMALL], capsys)
    assert code == 2 and f"will not delete {out / 'progress' / 'notes.txt'}" in one_error_line(err)
    assert (out / "progress" / "notes.txt").read_text() == "keep me" and (out / "separability.parquet").exists()


def test_a_marker_that_is_a_link_is_no_marker(tmp_path, capsys, no_model) -> None:
    real = tmp_path / "real-run"
    real.mkdir()
    (real / MARKER).write_text("{}")
    out = tmp_path / "photos"
    out.mkdir()
    (out / "a.jpg").write_bytes(b"\xff\xd8")
    (out / MARKER).symlink_to(real / MARKER)
    code, err = run(["run", "--force", "--out", str(out), *SMALL], capsys)
    assert code == 2 and f"{out} does not" in one_error_line(err)
    assert (out / "a.jpg").read_bytes() == b"\xff\xd8"


def test_force_on_an_out_that_is_a_link_replaces_the_run_it_points_to(tmp_path, capsys, tiny_cli) -> None:
    target = tmp_path / "runs" / "real"
    code, err = run(["run", "--out", str(target), *SMALL], capsys)
    assert code == 0, err
    (target / "old.parquet").write_bytes(b"an older table")
    link = tmp_path / "latest"
    link.symlink_to(target, target_is_directory=True)
    code, err = run(["run", "--force", "--out", str(link), *SMALL], capsys)
    assert code == 0, err
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert (target / "result.json").is_file() and not (target / "old.parquet").exists()


def test_an_out_that_links_to_nothing_is_refused_before_the_model_loads(tmp_path, capsys, no_model) -> None:
    link = tmp_path / "latest"
    link.symlink_to(tmp_path / "gone", target_is_directory=True)
    code, err = run(["run", "--force", "--out", str(link), *SMALL], capsys)
    assert code == 2 and f"symbolic link to {tmp_path / 'gone'}" in one_error_line(err)
    assert link.is_symlink() and not (tmp_path / "gone").exists()


# ----------------------------------------------------------------------------- 3. a full disk


def test_a_full_disk_names_the_file_and_leaves_no_temporary_file(tmp_path, capsys, tiny_cli, monkeypatch) -> None:
    import pyarrow.parquet as pq

    real = pq.ParquetWriter.write_table

    def full(self, *args, **kwargs):
        if str(self.where).endswith("progress/separability.parquet.tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)  # the merge of the rows, after the last batch
    out = tmp_path / "run"
    code, err = run(["run", "--out", str(out), *SMALL], capsys)
    line = one_error_line(err)
    assert code == 2 and "No space left on device" in line and str(out / "progress" / "separability.parquet") in line
    assert not list(out.rglob("*.tmp"))
    monkeypatch.undo()
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: tiny_cli)
    code, err = run(["run", "--resume", "--out", str(out), *SMALL], capsys)  # space is free again
    assert code == 0, err


# ----------------------------------------------------------------------------- 4. report without a result


def test_report_on_a_run_that_saved_nothing_gives_the_command_not_python(tmp_path, capsys, no_model) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / MARKER).write_text('{"command": ["tl-geometry", "run", "--out", "runs/x"]}')  # stopped while loading
    code, err = run(["report", str(out)], capsys)
    line = one_error_line(err)
    assert code == 2 and "`tl-geometry run --out runs/x`" in line and "result.save" not in line
    (out / MARKER).unlink()
    code, err = run(["report", str(out)], capsys)
    line = one_error_line(err)
    assert code == 2 and "finished `tl-geometry run`" in line and "result.save" not in line


def test_a_refused_command_leaves_no_directory_behind(tmp_path, capsys, no_model) -> None:
    code, err = run(["run", "--resume", "--out", str(tmp_path / "new"), *SMALL], capsys)
    assert code == 2 and "--resume" in one_error_line(err)
    assert not (tmp_path / "new").exists()


# ----------------------------------------------------------------------------- a finished run (issue 20)


def test_a_finished_run_removes_its_progress_and_an_interrupted_one_keeps_it(
    tmp_path, capsys, tiny_cli, monkeypatch
) -> None:
    import tl_geometry.pipeline.loop as loop

    out = tmp_path / "run"
    argv = ["run", "--out", str(out), *SMALL]
    real = loop.run_streaming
    calls = {"n": 0}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "run_streaming", interrupted)
    assert run(argv, capsys)[0] == 130
    assert (out / "progress" / "progress.json").is_file()  # what --resume continues from
    monkeypatch.setattr(loop, "run_streaming", real)
    (out / "progress" / "notes.txt").write_text("mine")  # not written by tl-geometry: it stays
    assert run([*argv, "--resume"], capsys)[0] == 0
    assert sorted(p.name for p in (out / "progress").rglob("*")) == ["notes.txt"]
    assert sorted(tlg.load_result(out).separability.seq.unique()) == [0, 1]  # read from OUT, not progress/


def test_resume_of_a_finished_run_says_it_is_finished(tmp_path, capsys, tiny_cli) -> None:
    out = tmp_path / "run"
    assert run(["run", "--out", str(out), *SMALL], capsys)[0] == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    code, err = run(["run", "--out", str(out), *SMALL, "--resume"], capsys)
    line = one_error_line(err)
    assert code == 2 and "holds a finished run" in line and f"tl-geometry report {out}" in line
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before  # nothing recomputed
    assert run(["report", str(out)], capsys)[0] == 0  # the report still rebuilds without progress/
