"""What the ``tl-geometry`` commands share: exit codes, comma lists, the source and output options.

::

    tl-geometry run --model smollm2-135m --n-seqs 8 --seq-len 512 --out runs/default --resume
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shlex
import shutil
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from tl_geometry.errors import TLGeometryError
from tl_geometry.io.checksums import CHECKSUMS_FILE
from tl_geometry.io.files import write_json_atomic
from tl_geometry.io.lock import HOLDER_FILE, LOCK_FILE, RunLock

if TYPE_CHECKING:  # pandas, imported by torchrun, loads only with a command
    from tl_geometry.pipeline.torchrun import World

#: Exit code of an error the user can fix (a one-line message on stderr), as argparse's.
EXIT_USAGE = 2
#: Exit code of a command stopped by Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130
#: The file that marks a directory as written by ``tl-geometry`` (only such a directory is
#: replaced by ``--force``); it holds the command that started the run.
MARKER_FILE = ".tl-geometry-run"


# ----------------------------------------------------------------------------- comma lists


def parse_ints(text: str, option: str, words: tuple[str, ...]) -> str | list[int]:
    """``text`` if it is one of ``words``, else the comma-separated integers it lists."""
    if text in words:
        return text
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        choices = ", ".join(repr(w) for w in words) + " or " if words else ""
        raise TLGeometryError(f"{option} must be {choices}a comma-separated list of integers, got {text!r}") from None


def parse_names(text: str) -> list[str]:
    """The comma-separated names ``text`` lists (blanks dropped; may be empty)."""
    return [name.strip() for name in text.split(",") if name.strip()]


def parse_paths(text: str) -> list[str]:
    """The files ``text`` names: one existing file, even if its name holds a comma, or a comma list."""
    return [text] if Path(text).is_file() else parse_names(text)


# ----------------------------------------------------------------------------- the windows


def add_source_options(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--corpus`` / ``--dataset``, ``--n-seqs`` and ``--seq-len``: the model and its windows."""
    parser.add_argument(
        "--model", default="smollm2-135m", help="TransformerLens model name (default: the embedded smollm2-135m)"
    )
    parser.add_argument(
        "--corpus", default="python-docs", help="'python-docs' (embedded, default) or a path to a text file"
    )
    parser.add_argument(
        "--dataset", default=None, help="a Hugging Face datasets name (needs the internet), instead of --corpus"
    )
    parser.add_argument("--n-seqs", type=int, default=8, help="number of token windows (default 8)")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per window, BOS included (default 512)")


def check_window_options(args: argparse.Namespace, why_two: str) -> None:
    """``--n-seqs >= 1``, ``--seq-len >= 2`` (``why_two`` says why) and ``--batch-size >= 1`` (if given)."""
    if args.n_seqs < 1:
        raise TLGeometryError(f"--n-seqs must be at least 1, got {args.n_seqs}")
    if args.seq_len < 2:
        raise TLGeometryError(f"--seq-len must be at least 2 ({why_two}), got {args.seq_len}")
    if args.batch_size is not None and args.batch_size < 1:
        raise TLGeometryError(f"--batch-size must be at least 1, got {args.batch_size}")


@contextmanager
def named_option(flag: str) -> Iterator[None]:
    """Prefix ``flag`` to the error a check of its value raises: ``--local-n: n must be ...``."""
    try:
        yield
    except TLGeometryError as exc:
        raise type(exc)(f"{flag}: {exc}") from None


def corpus_from_args(args: argparse.Namespace) -> Any:
    """The windows of ``--corpus`` / ``--dataset``, ``--n-seqs`` and ``--seq-len``; ``--model``
    checked too (a path that does not exist), all before any model is loaded."""
    from tl_geometry import corpus
    from tl_geometry.models import check_model_name
    from tl_geometry.runtime.budget import memory_budget

    check_model_name(args.model)
    memory_budget()  # a TL_GEOMETRY_MEMORY_BUDGET that is not a size is refused now, not after the load
    check_context_length(args.model, args.seq_len, "--seq-len")
    if args.dataset:
        return corpus.from_dataset(args.dataset, n_seqs=args.n_seqs, seq_len=args.seq_len)
    if args.corpus == "python-docs":
        return corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len)
    try:
        texts = corpus.from_files(args.corpus, n_seqs=args.n_seqs, seq_len=args.seq_len)
    except TLGeometryError as exc:  # the advice for the API (encoding=) is no use to a user of the CLI
        raise type(exc)(str(exc).replace(f", or pass {corpus.ENCODING_HINT}", " (--corpus must be UTF-8)")) from None
    check_corpus_size(args.corpus, args.n_seqs, args.seq_len)
    return texts


def check_context_length(model: str, length: int, flag: str) -> None:
    """Refuse, before the model loads, a window of ``length`` tokens beyond the context of ``model``
    (read from its configuration; nothing is refused when that cannot be read here)."""
    from tl_geometry.models import model_shape

    shape = model_shape(model)
    if shape is not None and length > shape.n_ctx:
        raise TLGeometryError(
            f"{flag} {length} is longer than the context of {model} ({shape.n_ctx} tokens): use {flag} <= {shape.n_ctx}"
        )


def check_corpus_size(paths: Any, n_seqs: int | None, seq_len: int) -> None:
    """Refuse, before the model loads, corpus files too short for ``n_seqs`` windows of ``seq_len`` tokens.

    A tokenizer makes at most one token per byte of UTF-8 text, plus one between documents and one
    at the start of a text (a prefix-space token): a bound that needs no tokenizer, so it refuses
    only what cannot fit (a corpus that passes it may still be short, which the tokenizer says).
    """
    files = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    most_tokens = sum(path.stat().st_size for path in files) + 2 * len(files)
    windows = n_seqs or 1
    needed = windows * (seq_len - 1)  # the BOS of each window is not text
    if most_tokens < needed:
        raise TLGeometryError(
            f"--corpus holds at most {most_tokens} tokens ({most_tokens - 2 * len(files)} bytes of text), fewer than "
            f"{windows} window{'s' if windows > 1 else ''} of --seq-len {seq_len} need: lower --n-seqs or --seq-len, "
            "or give more text"
        )


def device_from_args(args: argparse.Namespace, world: World | None) -> Any:
    """The torch device of ``--device`` (None if not given; under torchrun, this rank's device)."""
    from tl_geometry.models import check_device

    if args.device is None:
        return None
    try:
        device = check_device(args.device)
    except TLGeometryError as exc:
        raise TLGeometryError(f"--device: {exc}") from None
    return world.device(args.device) if world is not None else device


# ----------------------------------------------------------------------------- the output directory


def add_out_options(
    parser: argparse.ArgumentParser, default: str, what: str, not_settings: tuple[str, ...] = ()
) -> None:
    """``--out``, ``--resume`` / ``--force`` (one or the other) and ``--no-progress`` of a command writing a ``what``.

    ``not_settings`` names (as argparse dests) the command's other options that change no number
    it writes, or that it replaces by their resolved values (:func:`run_settings`)."""
    parser.add_argument("--out", default=default, help=f"output directory (default {default})")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help=f"continue an interrupted {what} in --out")
    group.add_argument("--force", action="store_true", help="replace --out if it exists")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.set_defaults(not_settings=not_settings)


# ----------------------------------------------------------------------------- the run's settings

#: The parsed options that change no number a command writes (where it writes, whether it
#: continues or replaces, whether it shows progress) and what ``main`` and the parser add.
PRESENTATION_OPTIONS = frozenset(
    {"out", "resume", "force", "no_progress", "handler", "argv", "not_settings", "resolved_settings"}
)


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of a command's run: what a ``--resume`` must share with the saved run.

    Every parsed option (``--name``: value) except :data:`PRESENTATION_OPTIONS` and the command's
    ``not_settings`` (argparse dests, :func:`add_out_options`), then the command's
    ``resolved_settings`` if it set any (a dict: options resolved into their values, such as
    ``run``'s preset), as it reads back from JSON. :func:`claim_out` records it in :data:`MARKER_FILE`; :func:`check_out`
    compares it with ``--resume``, before the model loads. A command gets both by calling those
    two; a new option is a setting unless the command names it in ``not_settings``.

    Examples
    --------
    >>> args = argparse.Namespace(command="budgets", out="b", resume=True, seed=5, not_settings=())
    >>> run_settings(args)
    {'--seed': 5, 'command': 'budgets'}
    """
    skip = PRESENTATION_OPTIONS | set(getattr(args, "not_settings", ()))
    settings = {option_name(key): value for key, value in vars(args).items() if key not in skip}
    settings.update(getattr(args, "resolved_settings", None) or {})
    return dict(sorted(json.loads(json.dumps(settings, default=str)).items()))


def option_name(dest: str) -> str:
    """``--seq-len`` for the argparse dest ``seq_len`` (``command``, the sub-command, stays)."""
    return dest if dest == "command" else "--" + dest.replace("_", "-")


def marked_settings(out: Path) -> dict[str, Any] | None:
    """The settings recorded in ``out``'s :data:`MARKER_FILE` (None if absent: a run of tl_geometry
    before they were recorded, or an unreadable marker)."""
    try:
        settings = json.loads((out / MARKER_FILE).read_text())["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return settings if isinstance(settings, dict) else None


def check_saved_settings(out: Path, args: argparse.Namespace, what: str) -> None:
    """Refuse ``--resume`` of a ``what`` saved with other settings (:func:`run_settings`) in one line
    naming each difference; nothing to compare in a run recorded before settings were."""
    saved = marked_settings(out)
    if saved is None:
        return
    from tl_geometry.io.store import describe_differences  # pandas and torch: only when there is a run

    differences = describe_differences(run_settings(args), saved)
    if differences:
        raise TLGeometryError(
            f"--resume: {out} holds a {what} with other settings: {'; '.join(differences)} (here vs saved); "
            "resume with the saved settings, start over with --force, or choose another --out"
        )


def is_run_dir(out: Path) -> bool:
    """Whether ``out`` was written by ``tl-geometry`` (it holds :data:`MARKER_FILE`, a file: a link is no marker)."""
    try:
        return stat.S_ISREG((out / MARKER_FILE).lstat().st_mode)
    except OSError:
        return False


def holds_results(out: Path) -> bool:
    """Whether ``out`` holds anything besides the marker and the lock (a run that failed before its
    first batch holds only those)."""
    return out.is_dir() and any(p.name not in (MARKER_FILE, LOCK_FILE, HOLDER_FILE) for p in out.iterdir())


def has_saved_run(out: Path) -> bool:
    """Whether ``out`` holds an interrupted ``tl-geometry run`` (``progress/progress.json``)."""
    from tl_geometry.pipeline.torchrun import has_progress

    return has_progress(out / "progress")


def has_finished_run(out: Path) -> bool:
    """Whether ``out`` holds a finished ``tl-geometry run`` (``result.json``; its ``progress/`` is gone)."""
    return (out / "result.json").is_file()


def out_path(args: argparse.Namespace, what: str = "run", example: str = "runs/my-run") -> Path:
    """The directory of ``--out``, checked as far as it can be without touching it.

    A symbolic link is followed: the command works in (and ``--force`` empties) the directory it
    points to, never deleting the link; a link to nothing is refused, naming its target.
    """
    if not args.out.strip():
        raise TLGeometryError(f"--out is empty: give the directory to write the {what} to, e.g. --out {example}")
    out = Path(args.out).expanduser()
    if out.is_symlink():
        target = out.resolve()
        if not target.exists():
            raise TLGeometryError(
                f"--out {out} is a symbolic link to {target}, which does not exist: create it or choose another --out"
            )
        out = target
    if out.exists() and not out.is_dir():
        raise TLGeometryError(f"--out {out} is a file, not a directory")
    return out


@contextmanager
def locked_out(out: Path, args: argparse.Namespace, world: World | None = None) -> Iterator[RunLock]:
    """Hold ``out``'s :class:`~tl_geometry.io.lock.RunLock` while the command runs; call it before
    any expensive work (the model, the corpus), right after :func:`out_path`.

    A directory another process holds is refused with one line naming that process; one that
    tl-geometry did not write (:func:`check_not_foreign`) before the lock file is made in it. Under torchrun
    (``world``, started) rank 0 takes the lock for the group and every rank learns the outcome: if
    rank 0 cannot, every rank raises the same error.
    """
    check_not_foreign(out, args)  # before the lock file is made there
    lock = RunLock(out, command_line(args), use_instead="another --out", name=f"--out {out}")
    refused = None
    if world is None or world.is_main:
        try:
            lock.acquire()
        except TLGeometryError as exc:
            refused = str(exc)
    if world is not None:
        refused = world.share(refused)
    if refused is not None:
        raise TLGeometryError(refused) if world is None else GroupError(refused, shown=world.is_main)
    try:
        yield lock
    finally:
        lock.release()


def check_not_foreign(out: Path, args: argparse.Namespace) -> None:
    """Refuse ``--out`` if it holds a file tl-geometry does not write (:func:`first_foreign_file`)
    and no :data:`MARKER_FILE`: a folder of the user's, where no command (``--resume`` and
    ``--force`` included) may leave its lock file; what :func:`check_out` would refuse, said earlier."""
    if not holds_results(out) or is_run_dir(out) or first_foreign_file(out) is None:
        return
    if getattr(args, "force", False):
        check_replaceable(out)
    flag = "--resume: " if getattr(args, "resume", False) else ""
    raise TLGeometryError(
        f"{flag}{out} already exists and was not written by tl-geometry (no {MARKER_FILE}): choose another --out"
    )


def run_locked(
    args: argparse.Namespace, out: Path, check: Callable[[], Any], body: Callable[[World | None], int]
) -> int:
    """Run a command that torchrun may shard on ``out``: hold its lock (:func:`locked_out`; rank 0
    for the group), run ``check()`` (``--resume`` / ``--force``, :func:`check_out`) on every rank,
    then ``body(world)``; ``world`` is None in a single process."""
    from tl_geometry.pipeline.torchrun import World

    world = World.sharding_from_env()
    if world is None:
        with locked_out(out, args):
            check()
            return body(None)
    import torch

    with world.session(torch.device("cpu")), locked_out(out, args, world):
        check()  # every rank, before any of them claims the directory
        world.barrier()
        return body(world)


def check_out(
    args: argparse.Namespace,
    *,
    what: str = "run",
    example: str = "runs/my-run",
    saved: Callable[[Path], bool] = has_saved_run,
    nothing_saved: str = "holds no interrupted run (no progress/progress.json)",
) -> Path:
    """``--out`` with ``--resume`` / ``--force`` checked for a command that writes a ``what``; nothing is deleted here.

    ``saved(out)`` says whether ``out`` holds something ``--resume`` can continue (``nothing_saved``
    says what is missing otherwise); ``--resume`` with other settings than the saved ones
    (:func:`check_saved_settings`) is refused. Call it holding the lock (:func:`locked_out`), before
    the model loads.
    """
    out = out_path(args, what, example)
    if args.force and holds_results(out):
        check_replaceable(out)
    elif holds_results(out) and not args.resume:
        if is_run_dir(out):
            raise TLGeometryError(
                f"{out} already exists: pass --resume to continue that {what} or --force to replace it"
            )
        raise TLGeometryError(
            f"{out} already exists and was not written by tl-geometry (no {MARKER_FILE}): choose another --out"
        )
    if args.resume and not saved(out):
        if has_finished_run(out):
            raise TLGeometryError(
                f"--resume: {out} holds a finished run (result.json), nothing is left to compute: rebuild its "
                f"report with `tl-geometry report {shlex.quote(str(out))}`, or start over with --force"
            )
        raise TLGeometryError(f"--resume: {out} {nothing_saved}; drop --resume")
    if args.resume:
        check_saved_settings(out, args, what)
    return out


def check_replaceable(out: Path) -> None:
    """Refuse ``--force`` on anything but a run directory holding only what tl-geometry writes
    (:data:`WRITTEN_FILES`), and always on ``/``, home and the working directory."""
    target = out.resolve()
    cwd = Path.cwd().resolve()
    if target == Path(target.anchor) or target == Path.home().resolve() or cwd.is_relative_to(target):
        raise TLGeometryError(
            f"--force will not delete {out}: it is /, the home directory, or the working directory or one above it"
        )
    if not is_run_dir(out):
        raise TLGeometryError(
            f"--force replaces only a directory written by tl-geometry run (it holds {MARKER_FILE}); {out} does not: "
            "choose another --out"
        )
    foreign = first_foreign_file(out)
    if foreign is not None:
        raise TLGeometryError(
            f"--force will not delete {foreign}: tl-geometry did not write it; move it out of {out} "
            "(or delete it yourself), or choose another --out"
        )


#: What the commands write in a run directory, as glob patterns relative to it (``*`` within one
#: name). ``--force`` empties a directory only if every file and folder in it matches (a new
#: command that writes other names adds them here); a symbolic link never matches.
WRITTEN_FILES = tuple(
    name
    for pattern in (
        MARKER_FILE,
        LOCK_FILE,
        HOLDER_FILE,
        "*.parquet",
        "*.html",
        "*.csv",
        "run.json",
        "result.json",
        CHECKSUMS_FILE,
        "curve.json",
        *(f"context_*/{name}" for name in ("curve.json", LOCK_FILE, HOLDER_FILE)),  # context: a curve per length
        "retrieval.json",
        "tokens.npy",
        *(
            f"{store}/{file}"
            for store in ("progress", "progress/shard-*")
            for file in ("progress.json", "separability.parquet", "separability/part-*.parquet", "state/*.pt")
        ),
    )
    for name in (pattern, f"{pattern}.tmp")
)
#: The folders of :data:`WRITTEN_FILES`.
WRITTEN_DIRS = (
    *(f"{store}{sub}" for store in ("progress", "progress/shard-*") for sub in ("", "/separability", "/state")),
    "context_*",
)


def _written(relative: str, patterns: tuple[str, ...]) -> bool:
    parts = relative.split("/")
    return any(
        len(p := pattern.split("/")) == len(parts) and all(map(fnmatch.fnmatchcase, parts, p)) for pattern in patterns
    )


def first_foreign_file(out: Path) -> Path | None:
    """The first file or folder in ``out`` (sorted, top down) that tl-geometry does not write
    (:data:`WRITTEN_FILES`, :data:`WRITTEN_DIRS`), or None."""
    for root, dirs, files in os.walk(out):
        dirs.sort()
        here = Path(root)
        relative = here.relative_to(out).as_posix()
        prefix = "" if relative == "." else f"{relative}/"
        for name in sorted([*files, *dirs]):
            patterns = WRITTEN_DIRS if name in dirs else WRITTEN_FILES
            if (here / name).is_symlink() or not _written(prefix + name, patterns):
                return here / name
    return None


def remove_written(out: Path, folder: str) -> None:
    """Delete what tl-geometry wrote in ``out/folder`` (:data:`WRITTEN_FILES`, :data:`WRITTEN_DIRS`,
    bottom up), then the folders left empty; anything else (a file of the user's, a link) stays,
    and so do the folders that hold it."""
    top = out / folder
    if top.is_symlink() or not top.is_dir() or not _written(folder, WRITTEN_DIRS):
        return
    for root, dirs, files in os.walk(top, topdown=False):
        here = Path(root)
        prefix = here.relative_to(out).as_posix()
        for name in files:
            path = here / name
            if not path.is_symlink() and _written(f"{prefix}/{name}", WRITTEN_FILES):
                path.unlink()
        for name in dirs:
            path = here / name
            if not path.is_symlink() and _written(f"{prefix}/{name}", WRITTEN_DIRS):
                try:
                    path.rmdir()
                except OSError:  # it holds something tl-geometry did not write
                    pass
    try:
        top.rmdir()
    except OSError:
        pass


def load_model_and_claim(args: argparse.Namespace, out: Path, world: World | None = None) -> Any:
    """Load ``--model`` (saying so on stderr), then :func:`claim_out` ``out`` (rank 0 under
    torchrun) before any rank goes on; the model."""
    import sys

    import tl_geometry as tlg

    print(f"loading {args.model} ...", file=sys.stderr)
    model = tlg.load_model(args.model, progress=not args.no_progress)
    if world is None or world.is_main:
        claim_out(out, args)
    if world is not None:
        world.barrier()
    return model


def claim_out(out: Path, args: argparse.Namespace) -> None:
    """Create ``out`` (emptied with ``--force``: only what tl-geometry wrote, checked again now) and mark it.

    The mark (:data:`MARKER_FILE`) records the command, its settings (:func:`run_settings`) and the
    version of tl_geometry; it is rewritten unless a run is resumed (``out`` holds results). ``out``
    itself is never deleted, only its contents: the lock it holds stays in place.
    """
    from tl_geometry.io.environment import package_version

    try:
        if args.force and holds_results(out):
            check_replaceable(out)  # nothing foreign appeared while the model loaded
            for entry in sorted(out.iterdir()):
                if entry.name in (LOCK_FILE, HOLDER_FILE):
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        out.mkdir(parents=True, exist_ok=True)
        if not is_run_dir(out) or args.force or not holds_results(out):
            mark = {"command": command_line(args), "settings": run_settings(args), "version": package_version()}
            write_json_atomic(out / MARKER_FILE, mark)
    except OSError as exc:
        raise TLGeometryError(f"cannot write to --out {out}: {exc.strerror or exc}; choose another --out") from None


# ----------------------------------------------------------------------------- a resumable command


class GroupError(TLGeometryError):
    """An error every rank of a torchrun group raises alike (the lock refused to the group):
    ``main`` prints it on the rank where ``shown`` is True (rank 0) only."""

    def __init__(self, message: str, shown: bool) -> None:
        super().__init__(message)
        self.shown = shown


class SavedInterrupt(KeyboardInterrupt):
    """Ctrl-C in a command whose work so far is saved; its message is the line ``main`` prints
    (after ``tl-geometry: ``) before exiting with :data:`EXIT_INTERRUPTED`."""


@contextmanager
def resumable(args: argparse.Namespace, out: Path, saved: str) -> Iterator[None]:
    """The body of a command that saves as it goes into ``out`` (``saved`` says where).

    A saved run that cannot be resumed (:class:`~tl_geometry.io.store.StoreError`) becomes one line
    that also offers ``--force``; Ctrl-C becomes a :class:`SavedInterrupt` naming what is saved and
    the command that continues (:func:`resume_command`).
    """
    from tl_geometry.io.store import StoreError  # pandas and torch: only once a command runs

    try:
        yield
    except StoreError as exc:
        raise TLGeometryError(f"{exc}; or start over with --force") from None
    except KeyboardInterrupt:
        command = resume_command(command_line(args), out)
        raise SavedInterrupt(f"interrupted; {saved}; continue with `{command}`") from None


# ----------------------------------------------------------------------------- the command line


def command_line(args: argparse.Namespace) -> list[str]:
    """The command as typed: ``tl-geometry`` and the arguments ``main`` was given."""
    return ["tl-geometry", *getattr(args, "argv", [])]


def resume_command(command: list[str] | None, out: Path) -> str:
    """The command that continues an interrupted run in ``out``: its own, without ``--force``, with
    ``--resume``, and with ``--out out`` unless its ``--out`` is that directory (a run copied or
    moved elsewhere continues where it is now)."""
    if not command:
        return f"tl-geometry run --resume --out {shlex.quote(str(out))} with the options it was started with"
    words = [w for w in command if w != "--force"]
    words = words if "--resume" in words else [*words, "--resume"]
    at = next((i for i, w in enumerate(words) if w == "--out" or w.startswith("--out=")), None)
    given = None if at is None else words[at + 1 : at + 2] if words[at] == "--out" else [words[at][len("--out=") :]]
    if given and same_directory(given[0], out):
        return shlex.join(words)
    if at is not None:
        words = [*words[:at], *words[at + (2 if words[at] == "--out" else 1) :]]
    return shlex.join([*words, "--out", str(out)])


def same_directory(path: str, out: Path) -> bool:
    """Whether ``path`` (as typed, from the working directory) is the directory ``out``."""
    try:
        return Path(path).expanduser().resolve() == Path(out).resolve()
    except OSError:
        return False


def marked_command(out: Path) -> list[str] | None:
    """The command recorded in ``out``'s :data:`MARKER_FILE` (None if absent or unreadable)."""
    try:
        command = json.loads((out / MARKER_FILE).read_text())["command"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return command if isinstance(command, list) and all(isinstance(w, str) for w in command) else None


__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "GroupError",
    "MARKER_FILE",
    "PRESENTATION_OPTIONS",
    "SavedInterrupt",
    "WRITTEN_DIRS",
    "WRITTEN_FILES",
    "add_out_options",
    "add_source_options",
    "check_not_foreign",
    "check_out",
    "check_replaceable",
    "check_saved_settings",
    "check_window_options",
    "claim_out",
    "command_line",
    "corpus_from_args",
    "device_from_args",
    "first_foreign_file",
    "has_finished_run",
    "has_saved_run",
    "holds_results",
    "is_run_dir",
    "load_model_and_claim",
    "locked_out",
    "marked_command",
    "marked_settings",
    "option_name",
    "out_path",
    "parse_ints",
    "parse_names",
    "remove_written",
    "resumable",
    "resume_command",
    "same_directory",
    "run_locked",
    "run_settings",
]
