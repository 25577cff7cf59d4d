"""How many CPU threads torch uses during an analysis: the CPUs actually free, unless the user chose.

torch's default is one intra-op thread per core. On a shared machine every operation is then split
across cores that other processes are using, and each waits at a barrier for a thread that is not
running: on 2 cores at a load of 4 the analysis ran 23 x slower than on one thread
(docs/performance.md, "Threads on a busy machine"). :func:`analysis_threads` sets torch's intra-op threads, for the duration of
a ``with`` block, to the CPUs free right now::

    free = floor(len(os.sched_getaffinity(0)) - busy + 0.25)   # at least 1

(a CPU counts while other work takes at most a quarter of it), where ``busy`` is the number of
this process's CPUs that other processes kept busy over the next 50 ms
(``/proc/stat``, less this process's own CPU time, such as OpenMP threads still spinning after the
last operation; the 1-minute load average where that file does not exist). A user's choice wins:
with ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` set, or ``torch.set_num_threads`` called after
``import tl_geometry``, nothing is changed (a count set before the import cannot be told from
torch's own default).

Example::

    with analysis_threads(torch.device("cpu")) as n:
        ...  # torch runs on n intra-op threads here; the previous count is restored after

Every public function that runs a model's forward or backward passes takes its threads this way:
:func:`model_threads` (a ``with`` block on a model's device) and :func:`runs_model` (a decorator
for functions whose first argument, or ``model=``, is the model).
"""

from __future__ import annotations

import functools
import math
import os
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

import torch

#: The environment variables with which a user fixes the thread count (then it is never changed).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

#: torch's intra-op thread count when this module was imported: the count a user has not changed.
TORCH_DEFAULT_THREADS = torch.get_num_threads()

#: The share of a CPU that other work may take while it still counts as free (:func:`free_threads`).
FREE_SLACK = 0.25

#: How long :func:`busy_cpus` watches the CPUs.
SAMPLE_SECONDS = 0.05

#: For how many seconds :func:`analysis_threads` reuses its last count (short batches, such as the
#: intervention's passes, then pay for one sample a second at most).
REUSE_SECONDS = 1.0

_last_count: dict[str, float] = {}  # {"at": time.monotonic(), "threads": count}
_counts_set: list[int] = []  # the counts the enclosing analysis_threads blocks set, innermost last


def own_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity; every CPU where the OS does not say)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _cpu_times(cpus: list[int]) -> tuple[int, int] | None:
    """(busy, total) jiffies of ``cpus`` from ``/proc/stat``, or None where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cpus}
    busy = total = 0
    for line in lines:
        name, *fields = line.split()
        if name in wanted:
            ticks = [int(x) for x in fields[:8]]
            idle = ticks[3] + ticks[4]  # idle, iowait
            busy += sum(ticks) - idle
            total += sum(ticks)
    return (busy, total) if total else None


def busy_cpus(cpus: list[int] | None = None, seconds: float = SAMPLE_SECONDS) -> float:
    """How many of ``cpus`` (default :func:`own_cpus`) other processes kept busy over the next ``seconds``.

    Measured while this thread sleeps: the CPUs' busy share (``/proc/stat``) less the CPU time
    this process spent meanwhile (its other threads: OpenMP's workers spin for a while after an
    operation before they sleep), at least 0. Without ``/proc/stat`` (not Linux) the 1-minute
    load average, capped at the number of CPUs.
    """
    cpus = own_cpus() if cpus is None else cpus
    before = _cpu_times(cpus)
    if before is None:
        try:
            return min(float(os.getloadavg()[0]), float(len(cpus)))
        except OSError:  # no load average either (Windows)
            return 0.0
    own_before, wall_before = time.process_time(), time.monotonic()
    time.sleep(seconds)
    after = _cpu_times(cpus)
    own, wall = time.process_time() - own_before, time.monotonic() - wall_before
    if after is None or after[1] <= before[1]:
        return 0.0
    busy = len(cpus) * (after[0] - before[0]) / (after[1] - before[1])
    return max(0.0, busy - own / wall) if wall > 0 else busy


def free_threads(cpus: list[int] | None = None, busy: float | None = None) -> int:
    """The intra-op thread count for the CPUs free now: ``floor(len(cpus) - busy + FREE_SLACK)``, at least 1.

    A CPU counts only if other work takes at most :data:`FREE_SLACK` of it: a thread on a CPU
    shared with another process makes every parallel operation wait for it at OpenMP's barrier
    (with half a CPU taken, two threads ran the analysis 1.3-1.45 x slower than one; docs/performance.md).

    >>> free_threads(cpus=[0, 1], busy=0.2), free_threads(cpus=[0, 1], busy=0.5), free_threads(cpus=[0, 1], busy=4.0)
    (2, 1, 1)
    """
    cpus = own_cpus() if cpus is None else cpus
    busy = busy_cpus(cpus) if busy is None else busy
    busy = min(max(busy, 0.0), float(len(cpus)))  # a load average may exceed the CPUs
    return max(1, math.floor(len(cpus) - busy + FREE_SLACK))


def user_chose_threads() -> bool:
    """Whether the user fixed torch's thread count: an environment variable of :data:`THREAD_VARIABLES`,
    or ``torch.set_num_threads`` called since this module was imported (a count that an enclosing
    :func:`analysis_threads` set is not the user's: a nested block picks afresh)."""
    if any(os.environ.get(v) for v in THREAD_VARIABLES):
        return True
    now = torch.get_num_threads()
    return now != TORCH_DEFAULT_THREADS and not (_counts_set and now == _counts_set[-1])


@contextmanager
def analysis_threads(device: torch.device | str = "cpu") -> Iterator[int]:
    """Run the ``with`` block on :func:`free_threads` intra-op threads (CPU work only); yields the count.

    Leaves torch alone where the user chose (:func:`user_chose_threads`) and for other devices
    (yields the current count). The previous count is restored on exit.
    """
    previous = torch.get_num_threads()
    if torch.device(device).type != "cpu" or user_chose_threads():
        yield previous
        return
    now = time.monotonic()
    if _last_count and now - _last_count["at"] < REUSE_SECONDS:
        threads = int(_last_count["threads"])
    else:
        threads = free_threads()
        _last_count.update(at=time.monotonic(), threads=threads)
    torch.set_num_threads(threads)
    _counts_set.append(threads)
    try:
        yield threads
    finally:
        _counts_set.pop()
        torch.set_num_threads(previous)


def parameter_device(model: Any) -> torch.device:
    """The device of ``model``'s parameters (else ``model.cfg.device``, else the CPU)."""
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return torch.device(getattr(getattr(model, "cfg", None), "device", None) or "cpu")


@contextmanager
def model_threads(model: Any) -> Iterator[int]:
    """:func:`analysis_threads` on the device of ``model``'s parameters: the ``with`` block runs on
    the CPUs free now unless the user chose (yields the count; the previous count is restored)."""
    with analysis_threads(parameter_device(model)) as threads:
        yield threads


Function = TypeVar("Function", bound=Callable[..., Any])


def runs_model(function: Function) -> Function:
    """Decorator: run ``function`` under :func:`model_threads` of its model (the first positional
    argument, or ``model=``). Blocks nested inside (one per batch of an inner loop) pick afresh."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        model = kwargs["model"] if "model" in kwargs else (args[0] if args else None)
        with model_threads(model):
            return function(*args, **kwargs)

    return run  # type: ignore[return-value]


__all__ = [
    "FREE_SLACK",
    "REUSE_SECONDS",
    "SAMPLE_SECONDS",
    "THREAD_VARIABLES",
    "TORCH_DEFAULT_THREADS",
    "analysis_threads",
    "busy_cpus",
    "free_threads",
    "model_threads",
    "own_cpus",
    "parameter_device",
    "runs_model",
    "user_chose_threads",
]
