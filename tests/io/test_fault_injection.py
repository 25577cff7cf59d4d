"""Kill a run at every point of its writes, resume it, and get every table bit for bit.

A real SIGKILL (a subprocess kills itself inside a write: no ``finally``, no ``except`` runs) at a
few points, and, in-process, an exception at every write of a run (after the file, or with the
temporary file written and not yet renamed). Each time the resumed run must equal an uninterrupted
one exactly: every table, the windows, and nothing counted twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import tl_geometry as tlg
import tl_geometry.io.store as store

TEXT = ["The quick brown fox jumps over the lazy dog. " * 12, "Attention is a weighting of values. " * 10]
SETTINGS = dict(batch_size=2, diagnostics=True, k_max=4, bounds=True, progress=False)
WRITES_PER_BATCH = 4  # the part, the diagnostics and taxonomy states, progress.json

KILL_SCRIPT = r"""
import json, os, signal, sys
repo, kill_at, mode, out, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
sys.path[:0] = [repo, os.path.join(repo, "tests"), os.path.join(repo, "tests", "io")]
import tl_geometry as tlg
import tl_geometry.io.store as store
from conftest import tiny_llama_bridge
from test_fault_injection import TEXT, failing_writer

store.write_atomic = failing_writer(store.write_atomic, kill_at, mode, lambda: os.kill(os.getpid(), signal.SIGKILL))
tlg.analyze(tiny_llama_bridge(), tlg.corpus.from_texts(TEXT, n_seqs=5, seq_len=16), out_dir=out, **settings)
sys.exit(3)  # the kill did not happen
"""


class Killed(BaseException):
    """Stands for a kill inside the process (a BaseException: no ``except Exception`` catches it)."""


def failing_writer(real, kill_at: int, mode: str, kill):
    """``store.write_atomic`` that calls ``kill()`` at its ``kill_at``-th call: ``"after"`` the file is
    in place, or ``"during"`` the write (temporary file written, not renamed)."""
    calls = {"n": 0}

    def write(path, writer):
        calls["n"] += 1
        if calls["n"] == kill_at and mode == "during":
            path = Path(path)
            writer(path.with_name(path.name + ".tmp"))
            kill()
        out = real(path, writer)
        if calls["n"] == kill_at and mode == "after":
            kill()
        return out

    return write


@pytest.fixture(scope="module")
def corpus():
    return tlg.corpus.from_texts(TEXT, n_seqs=5, seq_len=16)


@pytest.fixture(scope="module")
def reference(llama_bridge, corpus):
    return tlg.analyze(llama_bridge, corpus, **SETTINGS)


def assert_same(resumed, reference) -> None:
    assert set(resumed.tables()) == set(reference.tables())
    for name, table in reference.tables().items():
        pd.testing.assert_frame_equal(resumed.tables()[name], table, check_exact=True, obj=name)
    assert resumed.tokens.equal(reference.tokens)


@pytest.mark.parametrize(("kill_at", "mode"), [(2, "during"), (WRITES_PER_BATCH + 4, "after")])
def test_sigkill_then_resume_gives_every_table_bit_for_bit(tmp_path, llama_bridge, corpus, reference, kill_at, mode):
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    settings = json.dumps({k: v for k, v in SETTINGS.items()})
    proc = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, str(repo), str(kill_at), mode, str(tmp_path / "run"), settings],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    resumed = tlg.analyze(llama_bridge, corpus, out_dir=tmp_path / "run", **SETTINGS)
    assert_same(resumed, reference)


@pytest.mark.parametrize("mode", ["during", "after"])
# the writes of the first two batches (5 windows, 2 per batch): every kind of point, the deletion of
# the previous states included
@pytest.mark.parametrize("kill_at", range(1, 2 * WRITES_PER_BATCH + 1))
def test_killed_at_any_write_then_resumed_gives_every_table_bit_for_bit(
    tmp_path, llama_bridge, corpus, reference, monkeypatch, kill_at, mode
):
    def kill():
        raise Killed

    monkeypatch.setattr(store, "write_atomic", failing_writer(store.write_atomic, kill_at, mode, kill))
    with pytest.raises(Killed):
        tlg.analyze(llama_bridge, corpus, out_dir=tmp_path / "run", **SETTINGS)
    monkeypatch.undo()
    resumed = tlg.analyze(llama_bridge, corpus, out_dir=tmp_path / "run", **SETTINGS)
    assert_same(resumed, reference)
    if mode == "after":
        assert not list((tmp_path / "run").rglob("*.tmp"))
