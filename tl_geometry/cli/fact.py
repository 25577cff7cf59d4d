"""``tl-geometry fact``: retrieval under competition, bAbI qa1 style (definitions §9).

::

    tl-geometry fact --n-examples 16 --amounts 0,1024,2048,4096 --ns 8,16,32,64,128,256 --out runs/fact

writes into ``--out`` as it runs: ``heads.parquet`` (the support keys' mass, rank displacement,
recall and outrank probability at the answer query, per condition, amount, example and head),
``answers.parquet`` (the candidate answer loss and accuracy per ``N``) and ``retrieval.json`` (the
run's identity and the units done; ``--resume`` continues from them and refuses other settings
before the model loads); at the end ``summary.parquet``, ``n_star.parquet``, ``support.parquet``,
``examples.parquet`` and ``index.html``. ``--facts FILE`` reads your own examples: a JSON list of
objects ``{"fact", "question", "answer"}`` with optional ``"candidates"`` and ``"competitors"``.
"""

from __future__ import annotations

import argparse
import math
from functools import partial
from pathlib import Path
from typing import Any

from tl_geometry.cli.common import (
    add_out_options,
    check_out,
    load_model_and_claim,
    out_path,
    parse_ints,
    parse_names,
    resumable,
    run_locked,
)
from tl_geometry.errors import TLGeometryError

#: The most generated examples ``--n-examples`` asks for (each costs forward passes per amount).
MAX_EXAMPLES = 100_000


def add_parser(sub: Any) -> None:
    """The ``fact`` sub-command."""
    p = sub.add_parser("fact", help="retrieval under competition (bAbI qa1): support keys, candidate loss, N*")
    p.add_argument("--model", default="smollm2-135m", help="TransformerLens model name (default smollm2-135m)")
    p.add_argument(
        "--facts", default=None, help="JSON file of examples {fact, question, answer[, candidates, competitors]}"
    )
    p.add_argument(
        "--n-examples", type=int, default=16, help="generated examples (default 16, at most 100000; not with --facts)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the generated examples and of random ranking")
    p.add_argument(
        "--conditions", default="neutral,competitors", help="background conditions, comma list (default %(default)s)"
    )
    p.add_argument(
        "--background",
        default="python-docs",
        help="neutral background: 'python-docs' or a text file (default %(default)s)",
    )
    p.add_argument(
        "--amounts", default="0,1024,2048,4096", help="background sizes m in tokens, comma list (default %(default)s)"
    )
    p.add_argument(
        "--ns", default="1,2,4,8,16,32,64,128,256", help="sizes N of the top-N restriction (default %(default)s)"
    )
    p.add_argument(
        "--rank-by",
        default="attention",
        help="rankings of the restriction, comma list (default attention; sink_window: the positional control)",
    )
    p.add_argument("--renormalize", action="store_true", help="renormalise the kept weights")
    p.add_argument("--tolerance", type=float, default=0.10, help="N*'s tolerance in nats (default 0.10)")
    p.add_argument("--top", type=int, default=64, help="cut-off of the support recall (default 64)")
    add_out_options(p, "runs/fact", "retrieval run")
    p.set_defaults(handler=fact_command)


def _options(args: argparse.Namespace) -> dict:
    """Every option checked, before the model is loaded."""
    from tl_geometry.competition.babi import babi_examples, read_examples
    from tl_geometry.competition.fact import check_amounts
    from tl_geometry.competition.retrieval import check_conditions, check_top, retrieval_settings
    from tl_geometry.core.ranking_checks import check_rankings
    from tl_geometry.core.rankings import check_seed
    from tl_geometry.intervention.context import check_n
    from tl_geometry.models import check_model_name, model_shape

    check_model_name(args.model)  # a path that does not exist, before anything else
    amounts_given = parse_ints(args.amounts, "--amounts", ())
    try:
        amounts = check_amounts(amounts_given)
    except TLGeometryError as exc:
        raise TLGeometryError(f"--amounts: {exc}") from None
    shape = model_shape(args.model)
    if shape is not None and amounts[-1] + 3 > shape.n_ctx:  # a BOS, a fact and a question of one token at least
        raise TLGeometryError(
            f"--amounts {amounts[-1]} leaves no room in the context of {args.model} ({shape.n_ctx} tokens) for the "
            f"fact and the question: use amounts below {shape.n_ctx - 3}, less the length of the facts"
        )
    if args.seed < 0:
        raise TLGeometryError(f"--seed must be an integer >= 0, got {args.seed}")
    if not math.isfinite(args.tolerance) or args.tolerance < 0:
        raise TLGeometryError(f"--tolerance must be a finite number of nats >= 0 (e.g. 0.10), got {args.tolerance}")
    ns = parse_ints(args.ns, "--ns", ())
    if not ns:
        raise TLGeometryError("--ns is empty: give at least one size N, e.g. --ns 8,16,32")
    try:
        ns = sorted({check_n(n) for n in ns})
    except TLGeometryError as exc:
        raise TLGeometryError(f"--ns: {exc}") from None
    if shape is not None and ns[-1] > shape.n_ctx:
        raise TLGeometryError(
            f"--ns {ns[-1]} is more keys than the context of {args.model} holds ({shape.n_ctx}): use --ns <= {shape.n_ctx}"
        )
    rank_by = check_rankings(parse_names(args.rank_by) or [""])
    conditions = check_conditions(parse_names(args.conditions))
    for option, check, value in (
        ("--top", check_top, args.top),
        ("--seed", check_seed, args.seed),
    ):
        try:
            check(value)
        except TLGeometryError as exc:
            raise TLGeometryError(f"{option}: {exc}") from None
    if args.facts is not None:
        examples = read_examples(args.facts)
    else:
        if not 1 <= args.n_examples <= MAX_EXAMPLES:
            raise TLGeometryError(f"--n-examples must be in 1..{MAX_EXAMPLES}, got {args.n_examples}")
        examples = babi_examples(args.n_examples, seed=args.seed)
    bare = [e for e in examples if not e.competitors]
    if "competitors" in conditions and amounts[-1] > 0 and bare:
        raise TLGeometryError(
            f"--conditions competitors: the example {bare[0].fact!r} has no competitor facts: give 'competitors' "
            "in --facts, or use --conditions neutral"
        )
    background = None
    if args.background != "python-docs":
        from tl_geometry import corpus

        background = corpus.from_files(args.background)
    notes = {"model option": args.model, "background option": args.background}
    settings = retrieval_settings(
        examples, conditions, amounts, ns, rank_by, args.renormalize, float(args.tolerance), args.top, args.seed
    )
    return {
        "examples": examples,
        "conditions": conditions,
        "amounts": amounts,
        "ns": ns,
        "rank_by": rank_by,
        "background": background,
        "notes": notes,
        "settings": {**settings, **notes},
    }


def fact_command(args: argparse.Namespace) -> int:
    """Under torchrun the units are dealt to the ranks; rank 0 alone writes the tables and the page."""
    options = _options(args)
    out = out_path(args, "retrieval run", "runs/fact")
    return run_locked(args, out, lambda: _check_out(args, options), lambda world: _fact(args, options, out, world))


def _check_out(args: argparse.Namespace, options: dict) -> Path:
    from tl_geometry.competition.retrieval import PROGRESS_FILE, check_saved_identity
    from tl_geometry.io.checksums import verify_checksums
    from tl_geometry.io.store import StoreError

    out = check_out(
        args,
        what="retrieval run",
        example="runs/fact",
        saved=lambda d: (d / PROGRESS_FILE).is_file(),
        nothing_saved=f"holds no retrieval run ({PROGRESS_FILE})",
    )
    if args.resume:
        try:  # every setting that needs no model, before it loads
            check_saved_identity(out, options["settings"], keys=list(options["settings"]))
            verify_checksums(out, advice="start over with --force")
        except StoreError as exc:
            raise TLGeometryError(f"--resume: {exc}; or start over with --force") from None
    return out


def _fact(args: argparse.Namespace, options: dict, out: Path, world: Any) -> int:
    from tl_geometry.competition.retrieval import retrieval_under_competition
    from tl_geometry.report.competition import write_retrieval_report

    main_process = world is None or world.is_main
    model = load_model_and_claim(args, out, world)
    with resumable(args, out, f"the examples measured are saved in {out}"):
        result = retrieval_under_competition(
            model,
            options["examples"],
            conditions=options["conditions"],
            background=options["background"],
            amounts=options["amounts"],
            ns=options["ns"],
            rank_by=options["rank_by"],
            renormalize=args.renormalize,
            tolerance=args.tolerance,
            top=args.top,
            seed=args.seed,
            out_dir=out,
            resume=args.resume,
            notes=options["notes"],
            progress=not args.no_progress and main_process,
            world=world,
        )
    if not main_process:
        return 0
    write_tables(out, result)
    page = write_retrieval_report(out, result)
    stars = result.n_star()
    print(stars[["condition", "amount", "n_star_text", "answer_loss_full", "accuracy_full"]].to_string(index=False))
    print(result.support().round(4).to_string(index=False))
    print(
        f"report   {page}\ntables   {out}/n_star.parquet, summary.parquet, support.parquet, heads.parquet, answers.parquet"
    )
    return 0


def write_tables(out: Path, result: Any) -> None:
    """The finished run's derived tables, beside the ones written as it ran (each one's SHA-256 recorded)."""
    from tl_geometry.io.checksums import write_checked

    tables = {"summary": result.summary(), "n_star": result.n_star(), "support": result.support()}
    for name, table in {**tables, "examples": result.examples}.items():
        write_checked(out / f"{name}.parquet", partial(table.to_parquet, index=False))


__all__ = ["add_parser", "fact_command"]
