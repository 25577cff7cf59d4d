"""``tl-geometry fact``: a supporting fact under growing background (definitions §9).

::

    tl-geometry fact --amounts 0,64,256 --ns 4,16,64 --out runs/fact

writes into ``--out``: ``heads.parquet`` (the fact's rank and mass per amount, fact and head),
``loss.parquet`` (the answer's loss per amount, fact and ``N``), ``facts.parquet`` and
``index.html``. ``--facts FILE`` reads your own facts: a JSON list of ``[fact, question, answer]``.
``--resume`` on a finished directory rewrites the page from the saved tables.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tl_geometry.cli.common import add_out_options, check_out, load_model_and_claim, locked_out, out_path, parse_ints
from tl_geometry.errors import TLGeometryError

TABLES = ("heads", "loss", "facts")


def add_parser(sub: Any) -> None:
    """The ``fact`` sub-command."""
    p = sub.add_parser("fact", help="a supporting fact under background: its rank, mass and the answer's loss")
    p.add_argument("--model", default="smollm2-135m", help="TransformerLens model name (default smollm2-135m)")
    p.add_argument("--facts", default=None, help="JSON file of [fact, question, answer] lists (default: shipped)")
    p.add_argument("--background", default="python-docs", help="'python-docs' (default) or a text file")
    p.add_argument(
        "--amounts", default="0,64,256,1024", help="background sizes m in tokens, comma list (default %(default)s)"
    )
    p.add_argument(
        "--ns", default="1,4,16,64", help="sizes N of the top-N restriction, comma list (default %(default)s)"
    )
    p.add_argument("--rank-by", default="attention", help="ranking of the restriction (default attention)")
    p.add_argument("--renormalize", action="store_true", help="renormalise the kept weights")
    p.add_argument("--head", default=None, help="LAYER,HEAD drawn as its own line in the figure")
    add_out_options(p, "runs/fact", "supporting-fact run")
    p.set_defaults(handler=fact_command)


def _options(args: argparse.Namespace) -> dict:
    """Every option checked, before the model is loaded."""
    from tl_geometry.competition.fact import as_facts, check_amounts
    from tl_geometry.core.rankings import check_rank_by
    from tl_geometry.intervention.context import check_n

    amounts = check_amounts(parse_ints(args.amounts, "--amounts", ()))
    ns = [check_n(n) for n in parse_ints(args.ns, "--ns", ())]
    check_rank_by(args.rank_by)
    facts = None
    if args.facts is not None:
        try:
            facts = as_facts([tuple(item) for item in json.loads(Path(args.facts).read_text(encoding="utf-8"))])
        except (OSError, ValueError, TypeError) as exc:
            raise TLGeometryError(
                f"--facts {args.facts}: not a JSON list of [fact, question, answer] ({exc})"
            ) from None
    head = None
    if args.head is not None:
        parts = parse_ints(args.head, "--head", ())
        if len(parts) != 2:
            raise TLGeometryError(f"--head must be LAYER,HEAD, got {args.head!r}")
        head = (int(parts[0]), int(parts[1]))
    background = None
    if args.background != "python-docs":
        from tl_geometry import corpus

        background = corpus.from_files(args.background)
    return {"amounts": amounts, "ns": ns, "facts": facts, "head": head, "background": background}


def fact_command(args: argparse.Namespace) -> int:
    options = _options(args)
    with locked_out(out_path(args, "supporting-fact run", "runs/fact"), args):  # before the model loads
        return _fact(args, options)


def _fact(args: argparse.Namespace, options: dict) -> int:
    import pandas as pd

    import tl_geometry as tlg
    from tl_geometry.competition.fact import SupportingFact
    from tl_geometry.report.competition import write_fact_report

    out = check_out(
        args,
        what="supporting-fact run",
        example="runs/fact",
        saved=lambda d: all((d / f"{t}.parquet").exists() for t in TABLES),
        nothing_saved="holds no finished tables (heads.parquet, loss.parquet, facts.parquet)",
    )
    if args.resume:
        tables = {t: pd.read_parquet(out / f"{t}.parquet") for t in TABLES}
        result = SupportingFact(tables["heads"], tables["loss"], tables["facts"], {"model": args.model})
    else:
        model = load_model_and_claim(args, out)
        result = tlg.supporting_fact(
            model,
            options["facts"],
            background=options["background"],
            amounts=options["amounts"],
            ns=options["ns"],
            rank_by=args.rank_by,
            renormalize=args.renormalize,
            progress=not args.no_progress,
        )
        for t in TABLES:
            getattr(result, t).to_parquet(out / f"{t}.parquet", index=False)
    page = write_fact_report(out, result, options["head"])
    per_head = result.heads.groupby(["amount", "layer", "head"])[["mass", "best_rank"]].median()
    print(per_head.groupby("amount").median().round(4).to_string())
    print(f"report   {page}\ntables   {out}/heads.parquet, loss.parquet, facts.parquet")
    return 0


__all__ = ["add_parser", "fact_command"]
