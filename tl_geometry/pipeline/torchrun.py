"""Many processes under ``torchrun``: disjoint shards of the windows, one merged result.

Rank ``r`` of ``W`` (:meth:`World.from_env`) analyses the windows ``i`` with ``i % W == r``
(:func:`shard_windows`) into its own resumable store. The ranks then meet once (their timings),
leave the process group together, and rank 0 alone merges the stores from disk: the rows one range
of windows at a time (:func:`~tl_geometry.io.rows_on_disk.merge_parts`), the accumulators from their
saved states. No rank holds the whole table, and no rank is still talking when another one exits.
The rows equal a single-process run's; the tables of merged moments agree to rounding. Details
(process groups, store layout, resume after a lost rank): docs/architecture.md ("Under torchrun").

Examples
--------
>>> shard_windows(10, rank=1, world_size=3)
[1, 4, 7]
>>> World.from_env({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
World(rank=1, size=2, local_rank=1)
>>> World.from_env({}) is None
True
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch
import torch.distributed as dist

from tl_geometry.errors import InputError

#: Folder of one rank's store inside ``OUT/progress``.
SHARD_PATTERN = "shard-{rank:05d}-of-{size:05d}"
_SHARD_RE = re.compile(r"shard-(\d{5})-of-(\d{5})")


def shard_windows(n_windows: int, rank: int, world_size: int) -> list[int]:
    """The windows of rank ``rank`` among ``world_size``: ``i`` with ``i % world_size == rank``.

    Disjoint across ranks, together every window, and independent of anything but the three numbers.
    """
    return list(range(rank, n_windows, world_size))


@dataclass(frozen=True)
class World:
    """This process's place among the processes ``torchrun`` started.

    Attributes
    ----------
    rank : int
        ``RANK``: 0 .. size - 1 over every node; rank 0 merges and writes the result.
    size : int
        ``WORLD_SIZE``: the number of processes.
    local_rank : int
        ``LOCAL_RANK``: the process's index on its node (its GPU, ``cuda:LOCAL_RANK``).
    """

    rank: int
    size: int
    local_rank: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "World | None":
        """The world ``torchrun`` describes in the environment, or None outside torchrun."""
        env = os.environ if environ is None else environ
        if "WORLD_SIZE" not in env:
            return None
        try:
            size, rank = int(env["WORLD_SIZE"]), int(env.get("RANK", "0"))
            local = int(env.get("LOCAL_RANK", str(rank)))
        except ValueError:
            raise InputError(
                "WORLD_SIZE, RANK and LOCAL_RANK must be integers: start the processes with torchrun"
            ) from None
        if size < 1 or not 0 <= rank < size:
            raise InputError(f"RANK={rank} is outside WORLD_SIZE={size}: start the processes with torchrun")
        return cls(rank, size, local)

    @classmethod
    def sharding_from_env(cls, environ: Mapping[str, str] | None = None) -> "World | None":
        """The torchrun world when it has more than one process; None otherwise (one process has
        nothing to shard or gather, and runs as without torchrun)."""
        world = cls.from_env(environ)
        return world if world is not None and world.size > 1 else None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, requested: str | None) -> torch.device:
        """``cuda:LOCAL_RANK`` when ``requested`` is ``"cuda"`` (one GPU per process), else ``requested``."""
        if requested is None:
            return torch.device("cpu")
        device = torch.device(requested)
        if device.type == "cuda" and device.index is None:
            return torch.device("cuda", self.local_rank)
        return device

    def start(self, device: torch.device) -> None:
        """Join the process group: ``nccl`` for CUDA devices, ``gloo`` otherwise."""
        if dist.is_initialized():
            return
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")

    def barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def stop(self) -> None:
        """Leave the process group (nothing once left)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def finish(self) -> None:
        """Every rank leaves the process group at the same point: a barrier, then :meth:`stop`.

        The last collective is over on every rank before any of them tears its connections down, so
        no rank exits (or tears down gloo) while a peer still waits on it; what follows (rank 0's
        merge from disk, the report) needs no process group.
        """
        if dist.is_initialized():
            dist.barrier()
            self.stop()

    @contextmanager
    def session(self, device: torch.device) -> Iterator["World"]:
        """:meth:`start` on entry, :meth:`stop` on exit (also when the body raises)."""
        self.start(device)
        try:
            yield self
        finally:
            self.stop()

    def shard_dir(self, progress: Path) -> Path:
        """This rank's store: ``progress/shard-RRRRR-of-WWWWW``."""
        return progress / SHARD_PATTERN.format(rank=self.rank, size=self.size)

    def merge_dicts(self, part: dict) -> dict:
        """Every rank's ``part`` merged into one dict, on every rank (``all_gather_object``)."""
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, part)
        return {key: value for other in out for key, value in other.items()}

    def all_gather(self, payload: Any) -> list[Any]:
        """Every rank's (small) ``payload``, in rank order, on every rank (``all_gather_object``)."""
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, payload)
        return out

    def share(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (``broadcast_object_list``; every rank must call it)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, payload: Any) -> list[Any] | None:
        """Every rank's ``payload`` on rank 0 (in rank order), None on the others."""
        out = [None] * self.size if self.is_main else None
        dist.gather_object(payload, out, dst=0)
        return out


def check_shards(progress: Path, world_size: int) -> None:
    """Refuse to resume shards written by another number of processes (their windows differ)."""
    if not progress.is_dir():
        return
    sizes = {int(m.group(2)) for p in progress.iterdir() if (m := _SHARD_RE.fullmatch(p.name))}
    other = sorted(sizes - {world_size})
    if other:
        raise InputError(
            f"{progress} holds shards of a run with {other[0]} processes, and this one has {world_size}: "
            f"resume with --nproc-per-node so that WORLD_SIZE = {other[0]}, or start over with --force"
        )


def has_progress(progress: Path) -> bool:
    """Whether ``progress`` holds a single-process store or any rank's store."""
    if (progress / "progress.json").is_file():
        return True
    return progress.is_dir() and any((p / "progress.json").is_file() for p in progress.glob("shard-*-of-*"))


def run_sharded(plan: Any, progress: Path, world: World, *, show_progress: bool = True) -> Any:
    """Analyse this rank's shard of ``plan``'s windows into its store, then merge on rank 0.

    Returns the merged :class:`~tl_geometry.pipeline.result.AnalysisResult` on rank 0 and None on the
    other ranks. Every rank must call it: the ranks exchange their timings, then leave the process
    group together (:meth:`World.finish`), and rank 0 reads every rank's store from ``progress``
    (a folder every rank can reach: a shared file system when the ranks are on several nodes).
    """
    import time

    from tl_geometry.capture.tables import empty_table
    from tl_geometry.io.rows_on_disk import merge_parts
    from tl_geometry.io.store import ROWS_FILE, RunStore
    from tl_geometry.pipeline.loop import Wiring, assemble, run_batches
    from tl_geometry.pipeline.result import ROW_ORDER

    start = time.perf_counter()
    store = RunStore(world.shard_dir(progress), plan.identity(), resume=True)
    wiring = Wiring.build(plan)
    wiring.load_states(store.states)
    done = store.done_seqs()
    todo = [i for i in shard_windows(plan.n_seqs, world.rank, world.size) if i not in done]
    _, analysis = run_batches(plan, wiring, store, todo, show_progress and world.is_main, initial=len(done))
    total_s = time.perf_counter() - start
    gathered = world.all_gather({**analysis, "total_s": total_s})
    world.finish()
    if not world.is_main:
        return None
    merged = Wiring.build(plan)
    parts = []
    for rank in range(world.size):
        shard = RunStore(progress / SHARD_PATTERN.format(rank=rank, size=world.size), plan.identity(), resume=True)
        other = Wiring.build(plan)
        other.load_states(shard.states)
        for name, acc in merged.accumulators.items():
            acc.merge(other.accumulators[name])
        parts.extend(shard.part_paths())
    empty = empty_table(wiring.columns())
    rows = merge_parts(parts, progress / ROWS_FILE, ROW_ORDER, list(plan.settings.rank_by), empty)
    total_s = max(p["total_s"] for p in gathered)  # the slowest rank's wall time
    analysis = {name: sum(p[name] for p in gathered) / world.size for name in analysis}  # a mean over the ranks
    timings = {"total_s": total_s, "forward_s": total_s - analysis["analysis_s"], **analysis, "world_size": world.size}
    return assemble(plan, merged, rows, timings)


__all__ = ["World", "check_shards", "has_progress", "run_sharded", "shard_windows"]
