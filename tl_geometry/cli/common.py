"""What the ``tl-geometry`` commands share: exit codes, comma lists, the source and output options.

::

    tl-geometry run --model smollm2-135m --n-seqs 8 --seq-len 512 --out runs/default --resume
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tl_geometry.errors import TLGeometryError
from tl_geometry.io.files import write_json_atomic

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
        choices = ", ".join(repr(w) for w in words)
        raise TLGeometryError(
            f"{option} must be {choices} or a comma-separated list of integers, got {text!r}"
        ) from None


def parse_names(text: str) -> list[str]:
    """The comma-separated names ``text`` lists (blanks dropped; may be empty)."""
    return [name.strip() for name in text.split(",") if name.strip()]


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


def corpus_from_args(args: argparse.Namespace) -> Any:
    """The windows of ``--corpus`` / ``--dataset``, ``--n-seqs`` and ``--seq-len``; ``--model``
    checked too (a path that does not exist), all before any model is loaded."""
    from tl_geometry import corpus
    from tl_geometry.models import check_model_name

    check_model_name(args.model)

    if args.dataset:
        return corpus.from_dataset(args.dataset, n_seqs=args.n_seqs, seq_len=args.seq_len)
    if args.corpus == "python-docs":
        return corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len)
    return corpus.from_files(args.corpus, n_seqs=args.n_seqs, seq_len=args.seq_len)


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


def add_out_options(parser: argparse.ArgumentParser, default: str, what: str) -> None:
    """``--out``, ``--resume`` / ``--force`` (one or the other) and ``--no-progress`` of a command writing a ``what``."""
    parser.add_argument("--out", default=default, help=f"output directory (default {default})")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help=f"continue an interrupted {what} in --out")
    group.add_argument("--force", action="store_true", help="replace --out if it exists")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def is_run_dir(out: Path) -> bool:
    """Whether ``out`` was written by ``tl-geometry`` (it holds :data:`MARKER_FILE`)."""
    return (out / MARKER_FILE).is_file()


def holds_results(out: Path) -> bool:
    """Whether ``out`` holds anything besides the marker (a run that failed before its first batch holds only that)."""
    return out.is_dir() and any(p.name != MARKER_FILE for p in out.iterdir())


def has_saved_run(out: Path) -> bool:
    """Whether ``out`` holds an interrupted ``tl-geometry run`` (``progress/progress.json``)."""
    from tl_geometry.pipeline.torchrun import has_progress

    return has_progress(out / "progress")


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
    says what is missing otherwise).
    """
    if not args.out.strip():
        raise TLGeometryError(f"--out is empty: give the directory to write the {what} to, e.g. --out {example}")
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise TLGeometryError(f"--out {out} is a file, not a directory")
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
        raise TLGeometryError(f"--resume: {out} {nothing_saved}; drop --resume")
    return out


def check_replaceable(out: Path) -> None:
    """Refuse ``--force`` on anything but a run directory, and always on ``/``, home and the working directory."""
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


def claim_out(out: Path, args: argparse.Namespace) -> None:
    """Create ``out`` (replacing it with ``--force``) and mark it as a run directory."""
    try:
        if args.force and holds_results(out):
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        if not is_run_dir(out) or args.force:
            write_json_atomic(out / MARKER_FILE, {"command": command_line(args)})
    except OSError as exc:
        raise TLGeometryError(f"cannot write to --out {out}: {exc.strerror or exc}; choose another --out") from None


# ----------------------------------------------------------------------------- the command line


def command_line(args: argparse.Namespace) -> list[str]:
    """The command as typed: ``tl-geometry`` and the arguments ``main`` was given."""
    return ["tl-geometry", *getattr(args, "argv", [])]


def resume_command(command: list[str] | None, out: Path) -> str:
    """The command that continues an interrupted run: its own, without ``--force``, with ``--resume``."""
    if not command:
        return f"tl-geometry run --resume --out {shlex.quote(str(out))} with the options it was started with"
    words = [w for w in command if w != "--force"]
    return shlex.join(words if "--resume" in words else [*words, "--resume"])


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
    "MARKER_FILE",
    "add_out_options",
    "add_source_options",
    "check_out",
    "check_replaceable",
    "check_window_options",
    "claim_out",
    "command_line",
    "corpus_from_args",
    "device_from_args",
    "has_saved_run",
    "holds_results",
    "is_run_dir",
    "marked_command",
    "parse_ints",
    "parse_names",
    "resume_command",
]
