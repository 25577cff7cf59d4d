"""SHA-256 of the files a run writes, so that a file changed after it was written is named, not read.

A directory's manifest (:data:`CHECKSUMS_FILE`) maps each file's name to its SHA-256, recorded
(atomically) as each file is finished (:func:`write_checked`); :func:`verify_checksums` recomputes
them. A directory without a manifest (written before checksums were recorded) is not checked.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Iterable

from tl_geometry.errors import InputError
from tl_geometry.io.files import write_atomic, write_json_atomic

#: The manifest in a run directory: ``{"format": 1, "sha256": {file name: hex digest}}``.
CHECKSUMS_FILE = "checksums.json"


class ChecksumError(InputError):
    """A file whose content is not what was written: changed or damaged since."""


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes, as hex, read ``chunk`` bytes at a time."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as file:
        while block := file.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_checksums(directory: str | Path) -> dict[str, str]:
    """The manifest of ``directory`` (empty if it has none or it is unreadable: nothing to check)."""
    try:
        data = json.loads((Path(directory) / CHECKSUMS_FILE).read_text(encoding="utf-8"))
        sums = data["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {str(k): str(v) for k, v in sums.items()} if isinstance(sums, dict) else {}


def record_checksums(directory: str | Path, digests: dict[str, str]) -> None:
    """Add (or replace) ``digests`` (file name: hex) in ``directory``'s manifest, atomically."""
    sums = {**read_checksums(directory), **digests}
    write_json_atomic(Path(directory) / CHECKSUMS_FILE, {"format": 1, "sha256": dict(sorted(sums.items()))})


def write_checked(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """:func:`~tl_geometry.io.files.write_atomic` of ``path``, then its SHA-256 recorded in its
    directory's manifest.

    Examples
    --------
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = write_checked(folder / "a.txt", lambda p: p.write_text("done"))
    >>> verify_checksums(folder)
    >>> _ = (folder / "a.txt").write_text("edited")
    >>> verify_checksums(folder)
    Traceback (most recent call last):
    ...
    tl_geometry.io.checksums.ChecksumError: .../a.txt is damaged: its SHA-256 differs from the one recorded ...
    """
    path = write_atomic(path, write)
    record_checksums(path.parent, {path.name: file_sha256(path)})
    return path


def verify_checksums(directory: str | Path, names: Iterable[str] | None = None, advice: str = "write it again") -> None:
    """Recompute the SHA-256 of every file the manifest of ``directory`` lists (or of ``names``
    among them) that is there; the first that differs raises :class:`ChecksumError` naming it and
    ending with ``advice``."""
    sums = read_checksums(directory)
    for name in sorted(sums if names is None else set(names) & set(sums)):
        path = Path(directory) / name
        if path.is_file() and file_sha256(path) != sums[name]:
            raise ChecksumError(
                f"{path} is damaged: its SHA-256 differs from the one recorded in {CHECKSUMS_FILE} when it "
                f"was written (it was changed since); {advice}"
            )


__all__ = [
    "CHECKSUMS_FILE",
    "ChecksumError",
    "file_sha256",
    "read_checksums",
    "record_checksums",
    "verify_checksums",
    "write_checked",
]
