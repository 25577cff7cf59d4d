"""One process at a time in a run directory: an OS file lock, and who holds it.

:class:`RunLock` takes ``DIR/.tl-geometry-lock`` with :class:`filelock.FileLock` (``flock``: the
kernel releases it when its holder exits, however it exits) and records the holder (pid, host,
command, start) in ``DIR/.tl-geometry-lock.json``. A second process is refused at once with one
line naming the holder; a lock whose holder died is simply taken, and the record rewritten.
Every command that writes or reads a run directory, ``analyze(out_dir=)`` and
``sparsification_curve(out_dir=)`` take it before any expensive work. The same process may take
the lock of a directory it already holds (the count is kept; the last release frees it). A
directory the lock created is removed when released if nothing but the lock was written in it.

Examples
--------
>>> import tempfile
>>> run_dir = Path(tempfile.mkdtemp()) / "run"
>>> with RunLock(run_dir, command=["tl-geometry", "run"]):
...     lock_holder(run_dir)["command"]
'tl-geometry run'
>>> lock_holder(run_dir) is None  # released
True
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from filelock import FileLock, Timeout

from tl_geometry.errors import InputError
from tl_geometry.io.files import write_json_atomic

#: The lock file in a run directory (left in place when released: deleting a lock file is racy).
LOCK_FILE = ".tl-geometry-lock"
#: Who holds the lock: ``{"pid", "host", "command", "started"}`` (removed when released).
HOLDER_FILE = ".tl-geometry-lock.json"

_held: dict[Path, tuple[FileLock, int, bool]] = {}  # held here: lock, count, whether the directory was made
_held_guard = threading.Lock()


class RunInUse(InputError):
    """Another process holds the run directory's lock."""


def lock_holder(directory: str | Path) -> dict[str, Any] | None:
    """The holder recorded in ``directory`` (None if none is recorded, or the record is unreadable)."""
    try:
        holder = json.loads((Path(directory) / HOLDER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def describe_holder(holder: dict[str, Any] | None) -> str:
    """``pid 123 on host h, started 2026-01-01 10:00:00 UTC: `tl-geometry run ...```, or why it is unknown."""
    if holder is None:
        return "a process that has not yet recorded itself"
    return (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}: "
        f"`{holder.get('command', '?')}`"
    )


class RunLock:
    """The lock of one run directory (see the module docstring); a context manager.

    Parameters
    ----------
    directory : str or Path
        The run directory (created, with its parents, if it does not exist; a symbolic link is
        followed, so every path to one directory shares one lock).
    command : sequence of str, optional
        The command recorded for a second process to read (default: this process's ``sys.argv``).
    use_instead : str, default "another output directory"
        What the refusal tells the user to choose instead (``"another --out"`` on the command line).
    name : str, optional
        How messages name the directory (default: its path; ``"--out PATH"`` on the command line).

    Raises
    ------
    RunInUse
        On :meth:`acquire`: another process holds the lock (the message names it).
    InputError
        On :meth:`acquire`: ``directory`` is a file or cannot be created.
    """

    def __init__(
        self,
        directory: str | Path,
        command: Sequence[str] | None = None,
        use_instead: str = "another output directory",
        name: str | None = None,
    ) -> None:
        self.dir = Path(directory).expanduser()
        self.command = list(command) if command is not None else [Path(sys.executable).name, *sys.argv]
        self.use_instead = use_instead
        self.name = str(self.dir) if name is None else name
        self._key: Path | None = None

    def acquire(self) -> "RunLock":
        """Take the lock (at once or never: no waiting), record the holder, return ``self``."""
        if self.dir.exists() and not self.dir.is_dir():
            raise InputError(f"{self.name} is a file, not a directory: choose {self.use_instead}")
        created = not self.dir.exists()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot write to {self.name}: {exc.strerror or exc}; choose {self.use_instead}") from None
        key = self.dir.resolve()
        with _held_guard:
            if key in _held:  # this process holds it already (a command calling the Python API)
                lock, count, made = _held[key]
                _held[key] = (lock, count + 1, made)
                self._key = key
                return self
            lock = FileLock(key / LOCK_FILE, timeout=0)
            try:
                lock.acquire()
            except Timeout:
                raise RunInUse(
                    f"{self.name} is in use by another tl-geometry process ({describe_holder(lock_holder(key))}); "
                    f"wait for it to end (or stop it), or choose {self.use_instead}"
                ) from None
            except OSError as exc:
                raise InputError(
                    f"cannot lock {self.name} ({LOCK_FILE}): {exc.strerror or exc}; choose {self.use_instead}"
                ) from None
            holder = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "command": shlex.join(self.command),
                "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            }
            try:
                write_json_atomic(key / HOLDER_FILE, holder)
            except BaseException:
                lock.release()
                raise
            _held[key] = (lock, 1, created)
            self._key = key
        return self

    def release(self) -> None:
        """Give the lock back (the record is removed first); the last of nested holds frees it."""
        key, self._key = self._key, None
        if key is None:
            return
        with _held_guard:
            lock, count, created = _held[key]
            if count > 1:
                _held[key] = (lock, count - 1, created)
                return
            del _held[key]
            empty = False
            try:
                (key / HOLDER_FILE).unlink(missing_ok=True)
                # a directory made for a call that failed before writing anything is removed again
                empty = created and [p.name for p in key.iterdir()] == [LOCK_FILE]
                if empty:
                    (key / LOCK_FILE).unlink()
            finally:
                lock.release()
            if empty:
                try:
                    key.rmdir()
                except OSError:  # another process made something there meanwhile: leave it
                    pass

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._key is not None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


__all__ = ["HOLDER_FILE", "LOCK_FILE", "RunInUse", "RunLock", "describe_holder", "lock_holder"]
