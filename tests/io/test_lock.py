"""The lock of a run directory: one process at a time, a dead holder's lock taken over (issue 23, item 1).

Real processes: a helper process takes the lock and waits (or is killed); this process then tries.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tl_geometry as tlg
from tl_geometry.io.lock import HOLDER_FILE, LOCK_FILE, RunInUse, RunLock, lock_holder

REPO = Path(__file__).resolve().parents[2]
TEXT = ["The quick brown fox jumps over the lazy dog. " * 12]

# Takes the lock of argv[1], says so in argv[2], then waits for argv[3] to exist (or to be killed).
HOLD = r"""
import pathlib, sys, time
sys.path.insert(0, sys.argv[4])
from tl_geometry.io.lock import RunLock
with RunLock(sys.argv[1], command=["holder", "--of", sys.argv[1]]):
    pathlib.Path(sys.argv[2]).write_text("held")
    while not pathlib.Path(sys.argv[3]).exists():
        time.sleep(0.05)
"""


def wait_for(path: Path, proc: subprocess.Popen) -> None:
    """Until ``path`` exists (the helper reached its point); fails if the helper ended first."""
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"the helper process ended ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.05)


@pytest.fixture()
def holder(tmp_path):
    """A process holding the lock of ``tmp_path / "run"`` until the test ends (or kills it)."""
    ready, done = tmp_path / "ready", tmp_path / "done"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "run"), str(ready), str(done), str(REPO)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(ready, proc)
    yield proc
    done.write_text("done")
    proc.wait()


def test_a_second_process_is_refused_naming_the_first(tmp_path, holder) -> None:
    with pytest.raises(RunInUse) as caught:
        RunLock(tmp_path / "run").acquire()
    message = str(caught.value)
    assert f"pid {holder.pid}" in message and "holder --of" in message and "\n" not in message
    assert lock_holder(tmp_path / "run")["pid"] == holder.pid  # the refused one left the record alone


def test_the_lock_of_a_killed_holder_is_taken_over(tmp_path, holder) -> None:
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert lock_holder(tmp_path / "run")["pid"] == holder.pid  # the dead holder's record is still there
    with RunLock(tmp_path / "run", command=["second"]):
        assert lock_holder(tmp_path / "run")["pid"] == os.getpid()
    assert not (tmp_path / "run" / HOLDER_FILE).exists() and (tmp_path / "run" / LOCK_FILE).exists()


def test_analyze_refuses_a_directory_in_use_before_any_work(tmp_path, holder, monkeypatch) -> None:
    import tl_geometry.pipeline.analysis as analysis

    monkeypatch.setattr(analysis, "plan_analysis", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(RunInUse, match=f"pid {holder.pid}"):
        tlg.analyze("any-model", TEXT, out_dir=tmp_path / "run", progress=False)


def test_sparsification_curve_refuses_a_directory_in_use(tmp_path, holder, llama_bridge) -> None:
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=1, seq_len=16)
    with pytest.raises(RunInUse, match=f"pid {holder.pid}"):
        tlg.sparsification_curve(llama_bridge, corpus, ns=[1], rank_by="attention", out_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "curve.json").exists()


def test_one_process_may_nest_its_holds(tmp_path) -> None:
    run_dir = tmp_path / "run"
    with RunLock(run_dir, command=["outer"]):
        with RunLock(run_dir / ".." / "run", command=["inner"]):  # another path to the same directory
            assert lock_holder(run_dir)["command"] == "outer"
        assert lock_holder(run_dir)["command"] == "outer"  # still held after the inner release
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        probe = "import sys; sys.path.insert(0, sys.argv[2]); from tl_geometry.io.lock import RunLock; RunLock(sys.argv[1]).acquire()"
        proc = subprocess.run(
            [sys.executable, "-c", probe, str(run_dir), str(REPO)], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 1 and "RunInUse" in proc.stderr and f"pid {os.getpid()}" in proc.stderr
    assert lock_holder(run_dir) is None


def test_a_file_is_not_a_run_directory(tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(tlg.InputError, match="is a file"):
        RunLock(tmp_path / "file").acquire()


def test_a_directory_made_for_nothing_is_removed_again(tmp_path) -> None:
    with RunLock(tmp_path / "a" / "run"):
        pass
    assert not (tmp_path / "a" / "run").exists() and (tmp_path / "a").is_dir()
    with RunLock(tmp_path / "b"):
        (tmp_path / "b" / "result.json").write_text("{}")
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [LOCK_FILE, "result.json"]
    (tmp_path / "c").mkdir()
    with RunLock(tmp_path / "c"):  # a directory that was there stays
        pass
    assert (tmp_path / "c").is_dir()
