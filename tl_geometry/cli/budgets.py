"""``tl-geometry budgets``: per-head key budgets by rule, compared at equal mean budget on held-out windows.

::

    tl-geometry budgets --n-seqs 8 --seq-len 128 --budgets 4,8,16,32 --rules uniform,geometry,streaming --out runs/budgets

takes ``2 x --n-seqs`` windows: the first ``--n-seqs`` choose the budgets, the others evaluate them.
Writes into ``--out``: ``budgets.json`` (every point as it is measured; ``--resume`` continues
from it), ``budgets.parquet`` (one row per rule and B, docs/columns.md#budget-evaluation),
``head_budgets.parquet`` (every head's budget per rule and B) and ``index.html`` (the report).
Same conventions as ``tl-geometry sparsify``: progress bars, ``--resume``, ``--force``, one-line
errors and exit code 2.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

from tl_geometry.cli.common import (
    add_out_options,
    add_source_options,
    check_out,
    check_window_options,
    claim_out,
    corpus_from_args,
    locked_out,
    named_option,
    out_path,
    parse_names,
    resumable,
)
from tl_geometry.errors import TLGeometryError

POINTS_FILE = "budgets.json"


def add_parser(sub: Any) -> None:
    """The ``budgets`` sub-command."""
    p = sub.add_parser("budgets", help="per-head key budgets by rule, compared at equal mean budget (held-out loss)")
    add_source_options(p)
    p.add_argument("--budgets", default="4,8,16,32", help="mean budgets B, a comma list (default 4,8,16,32)")
    p.add_argument(
        "--rules",
        default="uniform,geometry,streaming",
        help="comma list of uniform, loss, geometry, duo, streaming (default %(default)s)",
    )
    p.add_argument(
        "--grid", default="4,16,64", help="sizes on which loss, geometry and duo measure heads (default %(default)s)"
    )
    p.add_argument(
        "--tolerance", type=float, default=0.01, help="loss rule: localised delta_nll_rel allowed (default %(default)s)"
    )
    p.add_argument(
        "--error-tolerance", type=float, default=0.1, help="geometry rule: output error allowed (default %(default)s)"
    )
    p.add_argument("--batch-size", type=int, default=4, help="windows per forward pass (default 4)")
    add_out_options(p, "runs/budgets", "comparison")
    p.set_defaults(handler=budgets_command)


def _options(args: argparse.Namespace) -> dict:
    """Every option checked, before the model is loaded."""
    from tl_geometry.competition.budgets import check_grid, check_mean_budget, check_rule, check_tolerance

    check_window_options(args, "a target after the first token")
    try:
        means = [float(b) for b in parse_names(args.budgets)]
        grid = [int(n) for n in parse_names(args.grid)]
    except ValueError:
        raise TLGeometryError(
            f"--budgets and --grid are comma lists of numbers, got {args.budgets!r}, {args.grid!r}"
        ) from None
    if not means:
        raise TLGeometryError("--budgets is empty: give mean budgets, e.g. --budgets 4,8,16")
    for mean in means:
        with named_option("--budgets"):
            check_mean_budget(mean, args.seq_len)
    rules = [check_rule(rule) for rule in parse_names(args.rules)]
    if not rules:
        raise TLGeometryError("--rules is empty: give rules, e.g. --rules uniform,geometry")
    with named_option("--grid"):
        check_grid(grid, args.seq_len)
    check_tolerance(args.tolerance)
    check_tolerance(args.error_tolerance, "--error-tolerance")
    return {"means": means, "rules": list(dict.fromkeys(rules)), "grid": grid}


def budgets_command(args: argparse.Namespace) -> int:
    options = _options(args)
    with locked_out(out_path(args, "comparison", "runs/budgets"), args):  # before the model loads
        return _budgets(args, options)


def _budgets(args: argparse.Namespace, options: dict) -> int:
    out = check_out(
        args,
        what="comparison",
        example="runs/budgets",
        saved=lambda out: (out / POINTS_FILE).exists(),
        nothing_saved=f"holds no comparison ({POINTS_FILE})",
    )
    both = copy.copy(args)
    both.n_seqs = 2 * args.n_seqs
    corpus = corpus_from_args(both)
    import pandas as pd

    import tl_geometry as tlg
    from tl_geometry.competition import evaluate_budgets
    from tl_geometry.corpus import from_tokens
    from tl_geometry.io.checksums import write_checked

    print(f"loading {args.model} ...", file=sys.stderr)
    model = tlg.load_model(args.model, progress=not args.no_progress)
    tokens = tlg.corpus_tokens(model, corpus)
    if tokens.shape[0] < 2 * args.n_seqs:
        raise TLGeometryError(
            f"the corpus gives {tokens.shape[0]} windows; the comparison needs 2 x --n-seqs = {2 * args.n_seqs}"
        )
    choose, held_out = from_tokens(tokens[: args.n_seqs]), from_tokens(tokens[args.n_seqs :])
    claim_out(out, args)
    progress = not args.no_progress
    with resumable(args, out, f"the points measured are saved in {out}/{POINTS_FILE}"):
        chosen = []
        for rule in options["rules"]:
            chosen += tlg.head_budgets(
                model,
                choose,
                mean_budget=options["means"],
                rule=rule,
                grid=options["grid"],
                tolerance=args.tolerance,
                error_tolerance=args.error_tolerance,
                batch_size=args.batch_size,
                progress=progress,
            )
        chosen.sort(key=lambda b: (b.mean_budget, options["rules"].index(b.rule)))
        table = evaluate_budgets(model, held_out, chosen, batch_size=args.batch_size, out_dir=out, progress=progress)
    write_checked(out / "budgets.parquet", lambda p: table.to_parquet(p, index=False))
    heads = pd.concat([b.table().assign(rule=b.rule, mean_budget=b.mean_budget) for b in chosen], ignore_index=True)
    write_checked(out / "head_budgets.parquet", lambda p: heads.to_parquet(p, index=False))
    from tl_geometry.report.budgets import write_budgets_report

    page = write_budgets_report(out, table, {"model": args.model, "rules": ",".join(options["rules"])})
    print(_summary(table, out, page))
    return 0


def _summary(table: Any, out: Path, page: Path) -> str:
    lines = [f"full NLL {table.nll_full.iloc[0]:.4f} nats over {int(table.n_tokens.iloc[0])} held-out targets"]
    for mean, points in table.groupby("mean_budget", sort=True):
        cells = "  ".join(f"{row.rule} {row.delta_nll_rel:+.4f}" for row in points.itertuples())
        lines.append(f"  B = {mean:g}: delta_nll_rel  {cells}")
    lines.append(f"report   {page}")
    lines.append(f"tables   {out}/budgets.parquet, head_budgets.parquet")
    return "\n".join(lines)


__all__ = ["add_parser", "budgets_command"]
