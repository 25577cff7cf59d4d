"""``tl-geometry context``: context scaling, the same last T tokens from longer contexts (definitions §9).

::

    tl-geometry context --contexts 128,256,512 --targets 32 --n-docs 8 --skip-short --out runs/context

writes into ``--out``: ``context_{L}/curve.json`` per context (every point as measured;
``--resume`` continues from them), ``context.parquet`` (the tidy table), ``context_n_star.parquet``
(``N*`` with paired-document bootstrap intervals, relative and ``--absolute-tolerance``),
``context_slopes.parquet`` (the log-log slope of ``N*`` against ``L``), ``context_windows.parquet``
(each document's loss per point) and ``index.html``.
Same conventions as ``tl-geometry sparsify``: progress bars, ``--resume``, ``--force``, torchrun,
one-line errors and exit code 2.
"""

from __future__ import annotations

import argparse
import math
from functools import partial
from pathlib import Path
from typing import Any

from tl_geometry.cli.common import (
    add_out_options,
    check_context_length,
    check_out,
    load_model_and_claim,
    out_path,
    parse_ints,
    parse_names,
    parse_paths,
    resumable,
    run_locked,
)
from tl_geometry.errors import TLGeometryError

#: The most bootstrap draws ``--bootstrap`` asks for (each resamples every document's curve).
MAX_BOOTSTRAP = 100_000


def add_parser(sub: Any) -> None:
    """The ``context`` sub-command."""
    p = sub.add_parser("context", help="context scaling: N* of the same targets from longer contexts")
    p.add_argument("--model", default="smollm2-135m", help="TransformerLens model name (default smollm2-135m)")
    p.add_argument(
        "--corpus", default="python-docs", help="'python-docs' (embedded, default) or text files, comma-separated"
    )
    p.add_argument("--n-docs", type=int, default=8, help="number of documents (default 8)")
    p.add_argument("--skip-short", action="store_true", help="skip documents too short for the longest context")
    p.add_argument(
        "--documents",
        default="texts",
        choices=("texts", "stretches"),
        help="each text of the corpus one document (texts, default), or the texts joined and cut into "
        "consecutive stretches of max(--contexts) + --targets tokens (stretches)",
    )
    p.add_argument("--contexts", default="128,256,512,1024", help="context lengths L, comma list (default %(default)s)")
    p.add_argument(
        "--targets", type=int, default=64, help="T, the last tokens of each document predicted (default %(default)s)"
    )
    p.add_argument("--ns", default="pow2", help="sizes N: 'pow2' or a comma list (default %(default)s)")
    p.add_argument("--rank-by", default="attention", help="comma list of rankings (default attention)")
    p.add_argument(
        "--renormalize",
        default="both",
        choices=("both", "deletion", "renormalize"),
        help="deletion, renormalize or both (default)",
    )
    p.add_argument("--tolerance", type=float, default=0.05, help="tau of N*_tau (default 0.05)")
    p.add_argument("--refine", action="store_true", help="bisect N* between the grid's sizes")
    p.add_argument(
        "--scoring",
        default="final",
        choices=("final", "all"),
        help="loss over the last T tokens (final, default) or every token of each window (all)",
    )
    p.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        help="paired-document bootstrap draws of N* and the slope (default 1000, at most 100000; 0: none)",
    )
    p.add_argument(
        "--absolute-tolerance",
        type=float,
        default=None,
        help="also N* with this absolute tolerance (nats per target) in context_n_star.parquet",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random ranking (default 0)")
    p.add_argument("--batch-size", type=int, default=1, help="windows per forward pass (default 1)")
    add_out_options(p, "runs/context", "context scaling")
    p.set_defaults(handler=context_command)


def _options(args: argparse.Namespace) -> dict:
    """Every option checked, before the model is loaded."""
    from tl_geometry.competition.context import check_contexts
    from tl_geometry.core.rankings import check_rankings
    from tl_geometry.intervention.curve import check_tolerance

    contexts = check_contexts(parse_ints(args.contexts, "--contexts", ()))
    check_context_length(args.model, max(contexts), "--contexts")
    if args.targets < 1 or args.targets >= contexts[0]:
        raise TLGeometryError(
            f"--targets must be in 1..{contexts[0] - 1} (below the shortest context), got {args.targets}"
        )
    if args.n_docs < 1 or args.batch_size < 1:
        raise TLGeometryError("--n-docs and --batch-size must be at least 1")
    ns = parse_ints(args.ns, "--ns", ("pow2",))
    if isinstance(ns, list) and (not ns or min(ns) < 1):
        raise TLGeometryError(f"--ns sizes must be integers >= 1, got {args.ns!r}")
    if isinstance(ns, list) and max(ns) > max(contexts):
        raise TLGeometryError(
            f"--ns {max(ns)} is more keys than the longest context holds ({max(contexts)}): use --ns <= {max(contexts)}"
        )
    if not math.isfinite(args.tolerance):
        raise TLGeometryError(f"--tolerance must be a finite number >= 0, got {args.tolerance}")
    check_tolerance(args.tolerance)
    if not 0 <= args.bootstrap <= MAX_BOOTSTRAP:
        raise TLGeometryError(
            f"--bootstrap must be an integer in 0..{MAX_BOOTSTRAP} (draws; 0: no intervals), got {args.bootstrap}"
        )
    if not 0 <= args.seed < 2**64:  # the bootstrap's numpy generator takes no negative seed
        raise TLGeometryError(f"--seed must be an integer in 0..2**64 - 1, got {args.seed}")
    if args.absolute_tolerance is not None and (
        not math.isfinite(args.absolute_tolerance) or args.absolute_tolerance < 0
    ):
        raise TLGeometryError(
            f"--absolute-tolerance must be a finite number >= 0 (nats), got {args.absolute_tolerance}"
        )
    flags = {"both": (False, True), "deletion": (False,), "renormalize": (True,)}[args.renormalize]
    return {
        "contexts": contexts,
        "ns": ns,
        "rank_by": check_rankings(parse_names(args.rank_by) or [""]),
        "renormalize": flags,
    }


def bootstrap_tables(args: argparse.Namespace, windows: Any) -> tuple[Any, Any]:
    """N* with paired-document bootstrap intervals and the log-log slopes: relative, and absolute if asked."""
    import pandas as pd

    from tl_geometry.competition.scaling import context_bootstrap

    pairs = [context_bootstrap(windows, args.tolerance, n_boot=args.bootstrap, seed=args.seed)]
    if args.absolute_tolerance is not None:
        pairs.append(
            context_bootstrap(windows, args.absolute_tolerance, absolute=True, n_boot=args.bootstrap, seed=args.seed)
        )
    return pd.concat([p[0] for p in pairs], ignore_index=True), pd.concat([p[1] for p in pairs], ignore_index=True)


def _corpus(args: argparse.Namespace) -> Any:
    from tl_geometry import corpus

    if args.corpus == "python-docs":
        return corpus.python_docs(n_seqs=None)
    return corpus.from_files(parse_paths(args.corpus))


def context_command(args: argparse.Namespace) -> int:
    """Under torchrun the documents are sharded across ranks; rank 0 alone writes the table and the page."""
    options = _options(args)
    out = out_path(args, "context scaling", "runs/context")
    return run_locked(args, out, lambda: _check_out(args), lambda world: _context(args, options, out, world))


def _check_out(args: argparse.Namespace) -> Path:
    from tl_geometry.io.checksums import verify_checksums

    out = check_out(
        args,
        what="context scaling",
        example="runs/context",
        saved=lambda d: any(d.glob("context_*/curve.json")),
        nothing_saved="holds no curve (context_*/curve.json)",
    )
    if args.resume:
        verify_checksums(out, advice="start over with --force")
    return out


def _context(args: argparse.Namespace, options: dict, out: Path, world: Any) -> int:
    corpus = _corpus(args)
    import tl_geometry as tlg
    from tl_geometry.io.checksums import write_checked
    from tl_geometry.report.competition import write_context_report

    main_process = world is None or world.is_main
    model = load_model_and_claim(args, out, world)
    if args.documents == "stretches":
        from tl_geometry.corpus import document_stretches

        corpus = document_stretches(model, corpus, max(options["contexts"]) + args.targets)
    with resumable(args, out, f"the points measured are saved in {out}"):
        table, windows = tlg.context_scaling(
            model,
            corpus,
            contexts=options["contexts"],
            targets=args.targets,
            ns=options["ns"],
            rank_by=options["rank_by"],
            renormalize=options["renormalize"],
            n_docs=args.n_docs,
            skip_short=args.skip_short,
            tolerance=args.tolerance,
            refine=args.refine,
            scoring=args.scoring,
            per_document=True,
            seed=args.seed,
            batch_size=args.batch_size,
            out_dir=out,
            progress=not args.no_progress and main_process,
            world=world,
        )
    if not main_process:
        return 0
    intervals, slopes = bootstrap_tables(args, windows)
    tables = {"context": table, "context_windows": windows, "context_n_star": intervals, "context_slopes": slopes}
    for name, frame in tables.items():  # each one's SHA-256 recorded, checked by --resume
        write_checked(out / f"{name}.parquet", partial(frame.to_parquet, index=False))
    page = write_context_report(out, table, {"model": args.model, "skipped documents": table.attrs["skipped_docs"]})
    stars = table.drop_duplicates(["context", "rank_by", "renormalize"])
    for row in stars.itertuples():
        label = "renormalised" if row.renormalize else "deletion"
        print(
            f"L={row.context:<6} {row.rank_by:<12} {label:<12} NLL {row.nll_full:.4f}  N* = {row.n_star_text}  "
            f"N*/L = {'> ' + format(row.n_max / row.context, '.4g') if row.censored else format(row.n_star_over_context, '.4g')}"
        )
    for row in intervals.itertuples():
        label = "renormalised" if row.renormalize else "deletion"
        interval = "" if not args.bootstrap else f"  95 % [{row.n_star_low:g}, {row.n_star_high:g}]"
        print(
            f"{row.tolerance_kind:<9} tau {row.tolerance:g}  L={row.context:<6} {row.rank_by:<12} {label:<12} N* = {row.n_star_text}{interval}"
        )
    for row in slopes.itertuples():
        label = "renormalised" if row.renormalize else "deletion"
        print(
            f"{row.tolerance_kind:<9} {row.rank_by:<12} {label:<12} log-log slope {row.slope:.3f}  "
            f"95 % [{row.slope_low:.3f}, {row.slope_high:.3f}] ({row.n_boot_censored} draws censored)"
        )
    print(f"report   {page}\ntables   {out / 'context.parquet'}, context_n_star.parquet, context_slopes.parquet")
    return 0


__all__ = ["add_parser", "context_command"]
