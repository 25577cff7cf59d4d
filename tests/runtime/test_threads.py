"""The thread count of an analysis: the CPUs free now, the user's choice first (runtime/threads.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tl_geometry.runtime import threads


@pytest.fixture
def no_thread_variables(monkeypatch):
    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "REUSE_SECONDS", 0.0)  # a fresh count every time


def test_free_threads_counts_the_idle_cpus():
    four = [0, 1, 2, 3]
    assert threads.free_threads(four, busy=0.0) == 4
    assert threads.free_threads(four, busy=1.0) == 3
    assert threads.free_threads(four, busy=2.6) == 1
    assert threads.free_threads(four, busy=9.0) == 1  # never fewer than one
    assert threads.free_threads([0], busy=0.0) == 1


@pytest.mark.parametrize(("busy", "expected"), [(0.0, 2), (0.2, 2), (0.25, 2), (0.3, 1), (0.5, 1), (1.2, 1)])
def test_a_cpu_shared_with_other_work_is_not_free(busy, expected):
    """A second thread only where other work takes at most a quarter of the second CPU (half a
    CPU taken made two threads slower than one)."""
    assert threads.free_threads([0, 1], busy=busy) == expected


def test_busy_cpus_is_within_the_cpus():
    cpus = threads.own_cpus()
    busy = threads.busy_cpus(cpus, seconds=0.02)
    assert 0.0 <= busy <= len(cpus) + 1e-9


class _Clock:
    """A stand-in for the ``time`` module: ``sleep`` advances the wall clock, and this process's CPU
    time by ``own`` CPUs' worth (its other threads at work meanwhile)."""

    def __init__(self, own: float):
        self.own, self.cpu, self.wall = own, 10.0, 100.0

    def process_time(self) -> float:
        return self.cpu

    def monotonic(self) -> float:
        return self.wall

    def sleep(self, seconds: float) -> None:
        self.wall += seconds
        self.cpu += self.own * seconds


@pytest.mark.parametrize(("own", "expected"), [(0.0, 1.5), (0.5, 1.0), (2.0, 0.0)])
def test_busy_cpus_leaves_out_this_processs_own_threads(monkeypatch, own, expected):
    """Two CPUs, 100 ticks each over the sample, 150 of them busy (1.5 CPUs); ``own`` CPUs of
    that were this process's other threads: ``1.5 - own`` CPUs of other work, at least 0."""
    readings = iter([(1000, 4000), (1150, 4200)])  # (busy, total) ticks before and after
    monkeypatch.setattr(threads, "_cpu_times", lambda cpus: next(readings))
    monkeypatch.setattr(threads, "time", _Clock(own))
    assert threads.busy_cpus([0, 1], seconds=0.05) == pytest.approx(expected)


def test_analysis_threads_follows_the_free_cpus_and_restores(monkeypatch, no_thread_variables):
    monkeypatch.setattr(threads, "busy_cpus", lambda cpus=None, seconds=0.0: float(len(cpus)))  # all taken
    outer = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "TORCH_DEFAULT_THREADS", 2)
    try:
        with threads.analysis_threads("cpu") as n:
            assert n == 1
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(outer)


def test_the_users_thread_count_wins(monkeypatch, no_thread_variables):
    monkeypatch.setattr(threads, "busy_cpus", lambda cpus=None, seconds=0.0: float(len(cpus)))
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "TORCH_DEFAULT_THREADS", before + 1)  # as if set_num_threads was called
    with threads.analysis_threads("cpu") as n:
        assert n == before == torch.get_num_threads()
    monkeypatch.setattr(threads, "TORCH_DEFAULT_THREADS", before)
    monkeypatch.setenv("OMP_NUM_THREADS", str(before))
    with threads.analysis_threads("cpu") as n:
        assert n == before == torch.get_num_threads()


def test_a_recent_count_is_reused(monkeypatch, no_thread_variables):
    calls = []
    monkeypatch.setattr(threads, "busy_cpus", lambda cpus=None, seconds=0.0: calls.append(1) or float(len(cpus)))
    monkeypatch.setattr(threads, "TORCH_DEFAULT_THREADS", torch.get_num_threads())
    with threads.analysis_threads("cpu") as n:  # REUSE_SECONDS = 0: a fresh sample
        assert n == 1
    monkeypatch.setattr(threads, "REUSE_SECONDS", 3600.0)
    for _ in range(3):
        with threads.analysis_threads("cpu") as n:
            assert n == 1
    assert len(calls) == 1


def test_other_devices_are_left_alone(monkeypatch, no_thread_variables):
    monkeypatch.setattr(threads, "busy_cpus", lambda cpus=None, seconds=0.0: float(len(cpus)))
    monkeypatch.setattr(threads, "TORCH_DEFAULT_THREADS", torch.get_num_threads())
    with threads.analysis_threads("meta") as n:
        assert n == torch.get_num_threads()


def _wait_policy(argv0: str) -> str:
    code = f"import sys; sys.argv = [{argv0!r}]; import tl_geometry, os; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_openmps_wait_policy_is_left_to_openmp_and_the_user():
    """Neither the command line nor a library import sets it: with the threads taken from the free
    CPUs, OpenMP's own policy (spin briefly, then sleep) is the faster one (docs/performance.md)."""
    assert _wait_policy("/usr/bin/tl-geometry").strip() == "None"
    assert _wait_policy("notebook").strip() == "None"


def test_a_nested_block_picks_afresh_and_the_users_count_inside_wins(monkeypatch, no_thread_variables):
    """The count an enclosing block set is not the user's choice: a block inside (one batch of a loop
    in a function that runs passes) samples again; a count the user sets inside is kept."""
    counts = iter([3, 5, 7])
    monkeypatch.setattr(threads, "free_threads", lambda cpus=None, busy=None: next(counts))
    outer = torch.get_num_threads()
    monkeypatch.setattr(threads, "TORCH_DEFAULT_THREADS", outer)
    try:
        with threads.analysis_threads("cpu") as first:
            with threads.analysis_threads("cpu") as second:
                assert (first, second, torch.get_num_threads()) == (3, 5, 5)
            assert torch.get_num_threads() == 3
            torch.set_num_threads(11)  # the user's, inside the block
            with threads.analysis_threads("cpu") as third:
                assert third == 11 == torch.get_num_threads()
        assert torch.get_num_threads() == outer
    finally:
        torch.set_num_threads(outer)
