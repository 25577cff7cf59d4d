"""``tl-geometry sparsify``: the top-N intervention's loss curve, N*_tau, localised loss and report.

::

    tl-geometry sparsify --n-seqs 2 --seq-len 128           # a first look: a minute or two on a laptop CPU
    tl-geometry sparsify --n-seqs 8 --seq-len 512 --full    # the full study of the paper

By default (:data:`QUICK`) the curve compares the attention ranking with the random control,
deletion only, without the localised loss; ``--full`` (:data:`FULL`) adds the contribution and
sink-window rankings, the renormalised curves and the localised loss per layer. An option given
explicitly wins over either. The command writes into ``--out``: ``curve.json`` (every point as it
is measured; ``--resume`` continues from it), ``curve.parquet``, ``n_star.parquet`` (``N*_tau`` per
ranking and renormalisation, the sizes tried), ``local.parquet`` (localised loss),
``geometry_vs_function.parquet`` and ``index.html`` (figures (b), (c), (d), self-contained); the
tables are parquet, as ``tl-geometry run``'s. Same conventions as ``tl-geometry run``: progress
bars, ``--resume``, ``--force`` (only on a directory it wrote), one-line errors and exit code 2.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from tl_geometry.cli.common import (
    add_out_options,
    add_source_options,
    check_out,
    check_window_options,
    corpus_from_args,
    load_model_and_claim,
    named_option,
    out_path,
    parse_ints,
    parse_names,
    resumable,
    run_locked,
)
from tl_geometry.errors import TLGeometryError

CURVE_FILE = "curve.json"
#: The tables written into ``--out``, as ``NAME.parquet`` (tl_geometry 0.2 before issue 20: ``NAME.csv``).
TABLES = ("curve", "n_star", "local", "geometry_vs_function")

#: The defaults of a first look (about 30 forward passes for 2 x 128 tokens).
QUICK = {"rank_by": "attention,random", "renormalize": "deletion", "local": "none"}
#: The defaults of ``--full``: every ranking, both renormalisations, the localised loss per layer.
FULL = {"rank_by": "attention,contribution,random,sink_window", "renormalize": "both", "local": "layer"}


def add_parser(sub: Any) -> None:
    """The ``sparsify`` sub-command."""
    p = sub.add_parser("sparsify", help="restrict attention to the top-N keys: loss curve, N*, localised loss, report")
    add_source_options(p)
    p.add_argument("--ns", default="pow2", help="sizes N: 'pow2' (1, 2, 4, ..., seq-len; default) or a comma list")
    p.add_argument(
        "--full",
        action="store_true",
        help="the full study: every ranking, both renormalisations and the localised loss per layer "
        "(about 10 x the passes of the default first look)",
    )
    p.add_argument(
        "--rank-by",
        default=None,
        help=f"comma list of rankings (default {QUICK['rank_by']}; with --full {FULL['rank_by']})",
    )
    p.add_argument(
        "--renormalize",
        default=None,
        choices=("both", "deletion", "renormalize"),
        help="deletion (kept weights unchanged), renormalize (kept weights / their sum) or both "
        f"(default {QUICK['renormalize']}; with --full {FULL['renormalize']})",
    )
    p.add_argument("--tolerance", type=float, default=0.05, help="tau of N*_tau (default 0.05)")
    p.add_argument(
        "--tolerances",
        default=None,
        help="more tau's of N*, comma list (e.g. 0.01,0.05,0.10): n_star.parquet holds N* at each, censored kept",
    )
    p.add_argument(
        "--sensitivity",
        action="store_true",
        help="also the gradient-sensitivity predictor S(N) at the curve's sizes (sensitivity.parquet)",
    )
    p.add_argument("--no-refine", action="store_true", help="N* over the grid only (no bisection passes)")
    p.add_argument(
        "--local-unit",
        "--local",
        dest="local",
        default=None,
        choices=("layer", "head", "none"),
        help=f"localised loss unit (default {QUICK['local']}; with --full {FULL['local']}); under torchrun write "
        "--local-unit (torchrun reads --local as its own)",
    )
    p.add_argument("--local-n", type=int, default=8, help="N of the localised loss (default 8)")
    p.add_argument(
        "--no-geometry", action="store_true", help="skip the separability pass and the geometry-function correlations"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random ranking (default 0)")
    p.add_argument("--batch-size", type=int, default=4, help="windows per forward pass (default 4)")
    add_out_options(p, "runs/sparsify", "curve", not_settings=("full",))  # --full: the defaults of three options
    p.set_defaults(handler=sparsify_command)


def _options(args: argparse.Namespace) -> dict:
    """Every option checked, before the model is loaded."""
    from tl_geometry.core.rankings import check_rankings, check_seed
    from tl_geometry.intervention.context import check_n
    from tl_geometry.intervention.curve import check_tolerance

    for name, value in (FULL if args.full else QUICK).items():  # an option given explicitly wins
        if getattr(args, name) is None:
            setattr(args, name, value)
    check_window_options(args, "a target after the first token")
    ns = parse_ints(args.ns, "--ns", ("pow2",))
    if isinstance(ns, list) and (not ns or min(ns) < 1):
        raise TLGeometryError(f"--ns sizes must be integers >= 1, got {args.ns!r}")
    try:
        check_seed(args.seed)
    except TLGeometryError as exc:
        raise TLGeometryError(f"--seed: {exc}") from None
    if not math.isfinite(args.tolerance) or args.tolerance < 0:
        raise TLGeometryError(f"--tolerance must be a finite number >= 0, got {args.tolerance}")
    check_tolerance(args.tolerance)
    tolerances = [args.tolerance]
    if args.tolerances is not None:
        try:
            given = [check_tolerance(float(t)) for t in parse_names(args.tolerances)]
            if not given:
                raise ValueError("empty")
            tolerances += given
        except (ValueError, TLGeometryError):
            raise TLGeometryError(
                f"--tolerances must be a comma list of numbers >= 0 like 0.01,0.05,0.10, got {args.tolerances!r}"
            ) from None
    with named_option("--local-n"):
        check_n(args.local_n)
    flags = {"both": (False, True), "deletion": (False,), "renormalize": (True,)}[args.renormalize]
    rankings = check_rankings(parse_names(args.rank_by) or [""])
    return {"ns": ns, "rank_by": rankings, "renormalize": flags, "tolerances": sorted(set(tolerances))}


def _check_out(args: argparse.Namespace) -> Path:
    return check_out(
        args,
        what="curve",
        example="runs/sparsify",
        saved=lambda out: (out / CURVE_FILE).exists(),
        nothing_saved=f"holds no curve ({CURVE_FILE})",
    )


def sparsify_command(args: argparse.Namespace) -> int:
    """Under torchrun the curve's windows are sharded as in ``tl-geometry run`` (gloo): every rank
    measures its windows of every point, the per-window NLL sums are merged on every rank, and rank 0
    alone writes the files and runs the localised loss and the geometry pass."""
    options = _options(args)
    out = out_path(args, "curve", "runs/sparsify")
    return run_locked(args, out, lambda: _check_out(args), lambda world: _sparsify(args, options, out, world))


def _sparsify(args: argparse.Namespace, options: dict, out: Path, world: Any) -> int:
    corpus = corpus_from_args(args)
    import tl_geometry as tlg
    from tl_geometry.report.sparsification import write_sparsify_report

    main_process = world is None or world.is_main
    model = load_model_and_claim(args, out, world)
    progress = not args.no_progress and main_process
    with resumable(args, out, f"the points measured are saved in {out}/{CURVE_FILE}"):
        curve = tlg.sparsification_curve(
            model,
            corpus,
            ns=options["ns"],
            rank_by=options["rank_by"],
            renormalize=options["renormalize"],
            seed=args.seed,
            batch_size=args.batch_size,
            out_dir=out,
            progress=progress,
            world=world,
        )
        n_star = curve.n_star_table(options["tolerances"], refine=not args.no_refine)
        if world is not None:  # the last collective is behind every rank: leave the group together
            world.finish()
        if not main_process:
            return 0
    write_table(out, "curve", curve.table)
    write_table(out, "n_star", n_star)
    if args.sensitivity:
        from tl_geometry.intervention.sensitivity import gradient_sensitivity

        grid = sorted(int(n) for n in set(curve.table.n))
        sensitivity = gradient_sensitivity(model, corpus, ns=grid, batch_size=args.batch_size, progress=progress)
        write_table(out, "sensitivity", sensitivity)
    local = correlations = result = None
    if args.local != "none":
        local = tlg.localized_loss(
            model,
            corpus,
            n=args.local_n,
            unit=args.local,
            seed=args.seed,
            batch_size=args.batch_size,
            progress=progress,
        )
        write_table(out, "local", local)
    if not args.no_geometry:
        grid = sorted(set(curve.table.n))
        result = tlg.analyze(
            model,
            corpus,
            ns=grid,
            rank_by=options["rank_by"],
            taxonomy=False,
            seed=args.seed,
            batch_size=args.batch_size,
            progress=progress,
        )
        correlations = tlg.geometry_vs_function(result, curve)
        if local is not None:
            import pandas as pd

            correlations = pd.concat([correlations, tlg.geometry_vs_function(result, local)], ignore_index=True)
        write_table(out, "geometry_vs_function", correlations)
    page = write_sparsify_report(
        out, curve, n_star, local=local, result=result, correlations=correlations, tolerance=args.tolerance
    )
    print(_summary(curve, n_star, out, page, args.tolerance))
    return 0


def write_table(out: Path, name: str, table: Any) -> Path:
    """Write ``table`` as ``out/NAME.parquet`` (atomically, its SHA-256 recorded) and delete the
    ``NAME.csv`` an earlier version wrote there (an ``--out`` of tl_geometry 0.2 continued with ``--resume``)."""
    from tl_geometry.io.checksums import write_checked

    path = write_checked(out / f"{name}.parquet", lambda p: table.to_parquet(p, index=False))
    (out / f"{name}.csv").unlink(missing_ok=True)
    return path


def _summary(curve: Any, n_star: Any, out: Path, page: Path, tolerance: float) -> str:
    lines = [
        f"full NLL {curve.nll_full:.4f} nats over {int(curve.table.n_tokens.iloc[0])} targets",
        "N*_tau: the smallest N whose loss is at most tau above the full model's, per ranking ('> max': none "
        "of the sizes tried):",
    ]
    for row in n_star.itertuples():
        lines.append(
            f"  tau {row.tolerance:<5g} {row.rank_by:<13} {'renormalised' if row.renormalize else 'deletion':<12} "
            f"N* = {row.n_star_text}  (tried {row.sizes_tried})"
        )
    lines.append(f"report   {page}")
    lines.append(f"tables   {out}/curve.parquet, n_star.parquet")
    return "\n".join(lines)


__all__ = ["CURVE_FILE", "FULL", "QUICK", "TABLES", "add_parser", "sparsify_command", "write_table"]
