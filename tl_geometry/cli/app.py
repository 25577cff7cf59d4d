"""The ``tl-geometry`` command line: the parser of every command and ``main``, which runs one.

::

    tl-geometry run --out runs/default      # analyse, write the tables and the report
    tl-geometry sparsify --out runs/sparsify
    tl-geometry budgets --out runs/budgets
    tl-geometry context --out runs/context  # context scaling
    tl-geometry fact --out runs/fact        # a supporting fact under background
    tl-geometry report runs/default

Errors a user can fix are one line on stderr and exit code 2; Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import errno
import sys
from typing import NoReturn

from tl_geometry.cli import budgets, context, fact, report, run, sparsify
from tl_geometry.cli.common import EXIT_INTERRUPTED, EXIT_USAGE, GroupError, SavedInterrupt
from tl_geometry.errors import TLGeometryError
from tl_geometry.runtime.allocator import keep_freed_memory


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (the usage stays one ``--help`` away), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``tl-geometry`` and its commands (each sets ``handler``, the function that runs it)."""
    parser = OneLineParser(
        prog="tl-geometry", description="Geometry of token selection in attention heads (tl_geometry)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run.add_parser(sub)
    sparsify.add_parser(sub)
    budgets.add_parser(sub)
    context.add_parser(sub)
    fact.add_parser(sub)
    report.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command of ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    keep_freed_memory()  # the command owns its process: no page faults for every freed block
    args.argv = argv
    try:
        return int(args.handler(args))
    except TLGeometryError as exc:
        if not isinstance(exc, GroupError) or exc.shown:  # a torchrun group's error: once, not once per rank
            print(f"tl-geometry: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a file system that refuses a write: say which file, not a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        advice = "; free some space, then run the command again" if exc.errno == errno.ENOSPC else ""
        print(f"tl-geometry: error: {exc.strerror or exc}{where}{advice}", file=sys.stderr)
        return EXIT_USAGE
    except SavedInterrupt as exc:  # what is saved, and the command that continues
        print(f"tl-geometry: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        print("tl-geometry: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


__all__ = ["OneLineParser", "build_parser", "main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
