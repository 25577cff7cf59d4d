"""``tl-geometry report DIR``: rebuild ``DIR/index.html`` from the results saved in ``DIR``
(a ``run``, or a finished ``fact`` or ``context``).

::

    tl-geometry report runs/default
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from tl_geometry.cli.common import (
    command_line,
    has_saved_run,
    is_run_dir,
    marked_command,
    marked_settings,
    resume_command,
)
from tl_geometry.cli.sparsify import CURVE_FILE
from tl_geometry.errors import TLGeometryError
from tl_geometry.io.lock import RunLock


def add_parser(sub: Any) -> None:
    """The ``report`` sub-command."""
    report = sub.add_parser("report", help="rebuild DIR/index.html from the results saved in DIR")
    report.add_argument("dir", help="a directory written by `tl-geometry run`")
    report.set_defaults(handler=report_command)


def report_command(args: argparse.Namespace) -> int:
    """Check that ``args.dir`` holds a finished run with readable tables, then write its report."""
    from tl_geometry.report import build_report

    src = Path(args.dir)
    if not src.is_dir():
        raise TLGeometryError(f"{src} is not a directory: give the --out directory of a `tl-geometry run`")
    if not is_run_dir(src):
        check_finished(src)  # a directory tl-geometry did not write is refused before its lock is made there
    with RunLock(src, command_line(args), use_instead="a finished run's directory"):
        page = competition_page(src)
        if page is None:
            check_finished(src)
            check_saved_tables(src)
            page = build_report(src, src)
    print(f"wrote {page}")
    return 0


def competition_page(src: Path) -> Path | None:
    """Rebuild the page of a finished ``tl-geometry fact`` or ``context`` run in ``src`` from its
    saved tables (checksums verified first); None if ``src`` holds neither, one line if unfinished."""
    from tl_geometry.competition.retrieval import PROGRESS_FILE

    fact, context = (src / PROGRESS_FILE).is_file(), any(src.glob("context_*/curve.json"))
    if not (fact or context):
        return None
    import pandas as pd

    from tl_geometry.io.checksums import verify_checksums
    from tl_geometry.report.competition import write_context_report, write_retrieval_report

    finished = ("summary.parquet", "examples.parquet") if fact else ("context.parquet",)
    if not all((src / name).is_file() for name in finished):
        raise TLGeometryError(
            f"{src} holds an interrupted `tl-geometry {'fact' if fact else 'context'}` run: finish it with "
            f"`{resume_command(marked_command(src), src)}`, which writes its page"
        )
    again = f"run it again (`{resume_command(marked_command(src), src).replace('--resume', '--force')}`)"
    verify_checksums(src, advice=again)
    try:
        if fact:
            from tl_geometry.competition.retrieval import Retrieval, read_progress

            progress = read_progress(src) or {}
            tables = {name: pd.read_parquet(src / f"{name}.parquet") for name in ("heads", "answers", "examples")}
            return write_retrieval_report(src, Retrieval(**tables, config=progress.get("identity", {})))
        table = pd.read_parquet(src / "context.parquet")
    except (OSError, ValueError) as exc:
        raise TLGeometryError(f"{src}: a saved table cannot be read ({type(exc).__name__}); {again}") from None
    settings = marked_settings(src) or {}
    notes = {"model": settings.get("--model", ""), "skipped documents": table.attrs.get("skipped_docs", "")}
    return write_context_report(src, table, notes)


def check_finished(src: Path) -> None:
    """``src`` holds the result of a finished ``tl-geometry run`` (else one line saying what to run)."""
    if (src / "result.json").is_file():
        return
    if has_saved_run(src):
        raise TLGeometryError(
            f"{src} holds an interrupted run and no result yet: finish it with `{resume_command(marked_command(src), src)}`"
        )
    if (src / CURVE_FILE).is_file():
        raise TLGeometryError(
            f"{src} holds a curve of `tl-geometry sparsify`, whose report (index.html) sparsify writes itself: "
            "give the --out directory of a finished `tl-geometry run`"
        )
    if is_run_dir(src):
        command = marked_command(src)
        again = f"`{shlex.join(command)}`" if command else "the command that started it"
        raise TLGeometryError(
            f"{src} holds no result (no result.json): its run stopped before saving any window; run {again} again"
        )
    raise TLGeometryError(
        f"{src} holds no result of tl-geometry run (no result.json): give the --out directory of a finished "
        "`tl-geometry run`"
    )


def check_saved_tables(src: Path) -> None:
    """Every table of a run directory readable (a truncated one is named, not a traceback), and
    every file its checksums list as it was written (:mod:`tl_geometry.io.checksums`)."""
    import pyarrow.parquet as pq

    from tl_geometry.io.checksums import verify_checksums
    from tl_geometry.pipeline.result import load_result

    load_result(src)
    verify_checksums(src, advice=f"run the analysis again (tl-geometry run --force --out {src})")
    for path in sorted(src.glob("*.parquet")):
        try:
            pq.read_metadata(path)
        except Exception as exc:  # pyarrow raises several kinds on a damaged file
            raise TLGeometryError(
                f"{path} is damaged ({type(exc).__name__}): run the analysis again (tl-geometry run --force --out {src})"
            ) from None


__all__ = ["add_parser", "check_finished", "competition_page", "check_saved_tables", "report_command"]
