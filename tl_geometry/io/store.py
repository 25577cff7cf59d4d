"""The on-disk store of a resumable run: per-batch parts, observer states, and the run's identity.

A part and the states are written aside and renamed before ``progress.json`` records them, so an
interruption at any moment leaves a store that resumes without loss or duplicates. Resuming with
another identity (:func:`run_identity`: model, token windows, result-changing settings) or from a
damaged store is refused with one line naming what differs or which file. Layout and rules:
docs/architecture.md ("The resumable store").
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
import torch
from torch import Tensor

from tl_geometry.errors import InputError
from tl_geometry.io.checksums import file_sha256
from tl_geometry.io.files import write_atomic
from tl_geometry.io.rows_on_disk import RowsOnDisk, merge_parts
from tl_geometry.models import ModelInfo

#: Version of the store's layout and of ``progress.json``.
STORE_FORMAT = 1
PROGRESS_FILE = "progress.json"
PARTS_DIR = "separability"
#: Every saved row in key order, merged from the parts when a run ends (:meth:`RunStore.merge_rows`).
ROWS_FILE = "separability.parquet"
STATES_DIR = "state"


class StoreError(InputError):
    """A saved run that cannot be resumed: damaged, of another version, or of another run."""


#: Accumulator states of this version and below hold sums of squares (tl_geometry 0.2), which
#: cannot give standard deviations that agree across batchings, resumes and ranks.
SUMS_OF_SQUARES_STATES = 1


def check_state_version(state: Mapping[str, Any], expected: int, what: str) -> None:
    """Refuse a saved accumulator state of another version, with one line saying what to do.

    States of version :data:`SUMS_OF_SQUARES_STATES` (tl_geometry 0.2: sums of squares) are refused
    rather than converted: their standard deviations carry the cancellation error that the
    ``(count, mean, M2)`` states of this version remove, so a resumed run would not equal a fresh one.

    Examples
    --------
    >>> check_state_version({"version": 2}, 2, "taxonomy")
    >>> check_state_version({"version": 1}, 2, "taxonomy")
    Traceback (most recent call last):
    ...
    tl_geometry.io.store.StoreError: this taxonomy state was saved by tl_geometry 0.2 (sums of squares, ...
    """
    found = state.get("version")
    if found == expected:
        return
    if found == SUMS_OF_SQUARES_STATES:
        raise StoreError(
            f"this {what} state was saved by tl_geometry 0.2 (sums of squares, whose standard deviations "
            "are not exact) and cannot be resumed: start the run over in another output directory"
        )
    raise StoreError(f"this {what} state has version {found}, and this tl_geometry reads {expected}: start over")


# ----------------------------------------------------------------------------- identity


def model_fingerprint(model: Any, n_values: int = 8) -> str:
    """A cheap fingerprint of a model's weights: SHA-256 (first 16 hex digits) of every parameter's
    name, shape, dtype and first and last ``n_values`` values.

    Two models of the same architecture with other weights get other fingerprints (barring
    weights that agree at both ends of every tensor); it reads a few values per tensor, not the
    weights.

    Parameters
    ----------
    model : torch.nn.Module
        The model (any object with ``named_parameters``; ``"unknown"`` otherwise).
    n_values : int, default 8
        Values read at each end of every parameter.

    Examples
    --------
    >>> import torch
    >>> a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    >>> with torch.no_grad():
    ...     _ = b.weight.copy_(a.weight), b.bias.copy_(a.bias)
    >>> model_fingerprint(a) == model_fingerprint(b)
    True
    >>> with torch.no_grad():
    ...     _ = b.bias.add_(1.0)
    >>> model_fingerprint(a) == model_fingerprint(b)
    False
    """
    named = getattr(model, "named_parameters", None)
    if not callable(named):
        return "unknown"
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in named():
            flat = param.detach().reshape(-1)
            ends = torch.cat([flat[:n_values], flat[-n_values:]]).to(torch.float64).cpu()
            digest.update(f"{name}|{tuple(param.shape)}|{param.dtype}|".encode())
            digest.update(ends.numpy().tobytes())
    return digest.hexdigest()[:16]


def tokens_sha256(tokens: Tensor) -> str:
    """SHA-256 of the token windows (int64, row-major), as hex."""
    return hashlib.sha256(tokens.to(torch.int64).contiguous().cpu().numpy().tobytes()).hexdigest()


def run_identity(model: Any, info: ModelInfo, tokens: Tensor, settings: Mapping[str, Any]) -> dict[str, Any]:
    """What must agree for a saved run to be resumed, as a flat JSON-able dict.

    Keys: ``model`` (its name), ``model geometry`` (the rest of :class:`ModelInfo`), ``model
    weights`` (:func:`model_fingerprint`), ``n_seqs``, ``seq_len``, ``token windows``
    (:func:`tokens_sha256`), then every result-changing setting
    (``settings``: :meth:`~tl_geometry.pipeline.settings.AnalysisSettings.identity`).
    """
    geometry = {k: v for k, v in asdict(info).items() if k != "name"}
    if not geometry["sliding_windows"]:
        del geometry["sliding_windows"]  # as before windows were read: runs of global models resume
    else:
        geometry["sliding_windows"] = list(geometry["sliding_windows"])
    return {
        "model": info.name,
        "model geometry": geometry,
        "model weights": model_fingerprint(model),
        "n_seqs": int(tokens.shape[0]),
        "seq_len": int(tokens.shape[1]),
        "token windows": tokens_sha256(tokens),
        **settings,
    }


def describe_differences(mine: Mapping[str, Any], theirs: Mapping[str, Any], limit: int = 60) -> list[str]:
    """``"key (mine vs theirs)"`` for every key whose values differ (values shortened to ``limit`` chars).

    A key held by one side only (a setting that matters only when a switch is on) is named only
    when no key held by both sides differs: it is then the difference, else a consequence of one.

    Examples
    --------
    >>> describe_differences({"ns": "log", "bounds": True, "kappa": 0.5}, {"ns": "log", "bounds": False})
    ['bounds (True vs False)']
    """

    def short(value: Any) -> str:
        text = "unset" if value is None else str(value)
        return text if len(text) <= limit else text[: limit - 3] + "..."

    both = [k for k in mine if k in theirs and mine[k] != theirs[k]]
    if not both:
        both = [k for k in [*mine, *theirs] if (k in mine) != (k in theirs)]
    return [f"{k} ({short(mine.get(k))} vs {short(theirs.get(k))})" for k in both]


# ----------------------------------------------------------------------------- the store


class RunStore:
    """A resumable run's store in ``directory`` (see the module docstring).

    Parameters
    ----------
    directory : str or Path
        Where the store lives (created if needed; ``progress.json`` only with the first batch).
    identity : dict
        The run's identity (:func:`run_identity`), recorded, and compared with a saved one.
    resume : bool, default True
        Continue a saved run with the same identity; False refuses a directory that holds one.
    repair : bool, default False
        A part that is missing, unreadable or not as written (its SHA-256) is listed in
        :attr:`damaged` (part name: its windows) for the caller to compute again and
        :meth:`replace_part`, instead of refused; a part of a store that did not record its
        windows (before tl_geometry recorded them) is still refused.

    Raises
    ------
    StoreError
        The directory holds another run, a damaged store, or a store of another version.
    InputError
        The directory holds a run and ``resume`` is False, or cannot be created.
    """

    def __init__(
        self, directory: str | Path, identity: dict[str, Any], *, resume: bool = True, repair: bool = False
    ) -> None:
        self.dir = Path(directory)
        self.parts_dir = self.dir / PARTS_DIR
        self.states_dir = self.dir / STATES_DIR
        self.progress_file = self.dir / PROGRESS_FILE
        self.identity = json.loads(json.dumps(identity, default=str))  # as it reads back from JSON
        self.repair = repair
        self.damaged: dict[str, list[int]] = {}
        self._make_directory()
        if self.progress_file.exists():
            if not resume:
                raise InputError(f"{self.dir} already holds results: pass resume=True to continue, or another out_dir")
            self.progress = self._read_progress()
            self._check_identity()
            self.states = self._load_states()
            self._check_parts()
        else:
            self.progress = {"format": STORE_FORMAT, "identity": self.identity, "done": [], "parts": [], "states": {}}
            self.states = {}

    # ------------------------------------------------------------------ reading
    def done_seqs(self) -> set[int]:
        """The sequences whose rows and states are saved."""
        return set(self.progress["done"])

    def read(self, empty: pd.DataFrame) -> pd.DataFrame:
        """Every saved row, part after part (``empty`` when nothing is saved)."""
        frames = [self._read_part(name) for name in self.progress["parts"]]
        return pd.concat(frames, ignore_index=True) if frames else empty

    def part_paths(self) -> list[Path]:
        """The files of the saved parts, in the order they were written."""
        return [self.parts_dir / name for name in self.progress["parts"]]

    def merge_rows(self, key: list[str], rank_order: list[str], empty: pd.DataFrame) -> RowsOnDisk:
        """Every saved row in ``key`` order, written to ``ROWS_FILE`` one range of windows at a time
        (not held in memory)."""
        return merge_parts(self.part_paths(), self.dir / ROWS_FILE, key, rank_order, empty)

    # ------------------------------------------------------------------ writing
    def write(self, seq_ids: list[int], table: pd.DataFrame, states: dict[str, dict]) -> None:
        """Save one batch: its rows, the accumulators' states after it, then the record of both."""
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        self.states_dir.mkdir(parents=True, exist_ok=True)
        name = f"part-{seq_ids[0]:06d}-{seq_ids[-1]:06d}.parquet"
        write_atomic(self.parts_dir / name, lambda p: table.to_parquet(p, index=False))
        self.progress.setdefault("checksums", {})[name] = file_sha256(self.parts_dir / name)
        self.progress.setdefault("part_seqs", {})[name] = [int(i) for i in seq_ids]
        n_done = len(self.progress["done"]) + len(seq_ids)
        old_files = set(self.progress["states"].values())
        new_files = {}
        for key, state in states.items():
            file = f"{key}-{n_done:06d}.pt"
            write_atomic(self.states_dir / file, functools.partial(torch.save, state))
            new_files[key] = file
        self.progress["done"].extend(int(i) for i in seq_ids)
        self.progress["parts"].append(name)
        self.progress["states"] = new_files
        record = json.dumps(self.progress)
        write_atomic(self.progress_file, lambda p: p.write_text(record, encoding="utf-8"))
        for file in old_files - set(new_files.values()):
            (self.states_dir / file).unlink(missing_ok=True)

    def replace_part(self, name: str, table: pd.DataFrame) -> None:
        """Write ``table`` (the rows computed again) as the damaged part ``name`` (of :attr:`damaged`),
        and record its new SHA-256; the windows done and the states are unchanged."""
        if name not in self.damaged:
            raise ValueError(f"{name} is not a damaged part of {self.dir}")
        path = self.parts_dir / name
        write_atomic(path, lambda p: table.to_parquet(p, index=False))
        self.progress.setdefault("checksums", {})[name] = file_sha256(path)
        record = json.dumps(self.progress)
        write_atomic(self.progress_file, lambda p: p.write_text(record, encoding="utf-8"))
        del self.damaged[name]

    def discard_if_unused(self) -> None:
        """Remove the directories this store made if no batch was recorded (after a failed first batch),
        so that nothing is left to block the next run. Only empty directories are removed."""
        if self.progress_file.exists():
            return
        for folder in (self.parts_dir, self.states_dir, self.dir):
            try:
                folder.rmdir()
            except OSError:  # not empty, or not there: leave it
                pass

    # ------------------------------------------------------------------ checks
    def _damaged(self, path: Path, why: str) -> StoreError:
        return StoreError(
            f"{path} is damaged ({why}): the saved run in {self.dir} cannot be resumed; delete {self.dir} "
            "or use another output directory to start over"
        )

    def _make_directory(self) -> None:
        if self.dir.exists() and not self.dir.is_dir():
            raise InputError(f"{self.dir} is a file, not a directory: choose another out_dir")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create {self.dir}: {exc.strerror or exc}; choose another out_dir") from None

    def _read_progress(self) -> dict[str, Any]:
        try:
            progress = json.loads(self.progress_file.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise self._damaged(self.progress_file, f"not readable JSON: {type(exc).__name__}") from None
        if not isinstance(progress, dict) or progress.get("format") != STORE_FORMAT or "identity" not in progress:
            found = progress.get("format") if isinstance(progress, dict) else None
            raise StoreError(
                f"{self.progress_file} was written by another version of tl_geometry (store format {found}, this "
                f"one reads {STORE_FORMAT}): delete {self.dir} or use another output directory to start over"
            )
        for key, kind in (("done", list), ("parts", list), ("states", dict)):
            if not isinstance(progress.get(key), kind):
                raise self._damaged(self.progress_file, f"no valid {key!r} entry")
        return progress

    def _check_identity(self) -> None:
        differences = describe_differences(self.identity, self.progress["identity"])
        if differences:
            raise StoreError(
                f"{self.dir} holds a run with other settings: {'; '.join(differences)} (here vs saved); "
                "use the saved settings to resume, or another output directory"
            )

    def _load_states(self) -> dict[str, dict]:
        states = {}
        for key, file in self.progress["states"].items():
            path = self.states_dir / file
            if not path.is_file():
                raise self._damaged(path, "missing")
            try:
                states[key] = torch.load(path)
            except Exception as exc:  # torch raises many kinds on a truncated file
                raise self._damaged(path, f"not a readable state: {type(exc).__name__}") from None
        return states

    def _check_parts(self) -> None:
        import pyarrow.parquet as pq

        checksums = self.progress.get("checksums")
        checksums = checksums if isinstance(checksums, dict) else {}
        seqs = self.progress.get("part_seqs")
        seqs = seqs if isinstance(seqs, dict) else {}
        for name in self.progress["parts"]:
            path = self.parts_dir / name
            why = None
            if not path.is_file():
                why = "missing"
            else:
                try:
                    pq.read_metadata(path)
                except Exception as exc:  # pyarrow raises ArrowInvalid / OSError on a truncated file
                    why = f"not a readable parquet file: {type(exc).__name__}"
            recorded = checksums.get(name)  # a store of a version before checksums has none
            if why is None and recorded is not None and file_sha256(path) != recorded:
                why = "its SHA-256 differs from the one recorded when it was written"
            if why is None:
                continue
            windows = seqs.get(name)
            if self.repair and isinstance(windows, list) and all(isinstance(i, int) for i in windows) and windows:
                self.damaged[name] = windows
                continue
            raise self._damaged(path, why)

    def _read_part(self, name: str) -> pd.DataFrame:
        path = self.parts_dir / name
        try:
            return pd.read_parquet(path)
        except Exception as exc:
            raise self._damaged(path, f"not a readable parquet file: {type(exc).__name__}") from None


__all__ = [
    "RunStore",
    "STORE_FORMAT",
    "SUMS_OF_SQUARES_STATES",
    "StoreError",
    "check_state_version",
    "describe_differences",
    "model_fingerprint",
    "run_identity",
    "tokens_sha256",
]
