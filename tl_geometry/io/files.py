"""Writing files so that an interruption never leaves a half-written one: write aside, then rename.

A write that fails (a full disk, a refused permission, an exception in the writer) removes its
temporary file; a failing file system's :class:`OSError` names the file that was being written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


def write_atomic(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp)`` on ``path + ".tmp"``, then rename it to ``path`` (atomic on one file system).

    A reader sees either the old file or the complete new one. A write that fails removes the
    temporary file and raises (an :class:`OSError` with ``filename`` set to ``path``); only a killed
    process leaves it behind, and the next write replaces it.

    Parameters
    ----------
    path : str or Path
        The file to (re)write.
    write : callable
        Writes the content to the path it is given (e.g. ``lambda p: table.to_parquet(p)``).

    Examples
    --------
    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp()) / "note.txt"
    >>> write_atomic(target, lambda p: p.write_text("done")).read_text()
    'done'
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        tmp.replace(path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):  # name the file: pyarrow, numpy and torch often do not
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    return path


def write_json_atomic(path: str | Path, data: Any, indent: int | None = 2) -> Path:
    """:func:`write_atomic` of ``json.dumps(data)`` (values JSON does not know are written with ``str``)."""
    text = json.dumps(data, indent=indent, default=str)
    return write_atomic(path, lambda p: p.write_text(text, encoding="utf-8"))
