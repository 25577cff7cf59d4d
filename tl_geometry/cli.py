"""The ``tl-geometry`` command line.

``tl-geometry run`` analyses a model over a corpus (by default the embedded SmolLM2-135M over
CPython's documentation, offline), writes the tables to ``--out`` as it goes, and prints a
one-screen summary. Errors a user can fix are one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

from .errors import TLGeometryError

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tl-geometry", description="Geometry of token selection in attention heads.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="analyse a model over a corpus and write the results")
    run.add_argument("--model", default="smollm2-135m", help="TransformerLens model name (default: the embedded smollm2-135m)")
    run.add_argument("--corpus", default="python-docs", help="'python-docs' (embedded) or a path to a text file")
    run.add_argument("--dataset", default=None, help="a Hugging Face datasets name (needs the internet), instead of --corpus")
    run.add_argument("--n-seqs", type=int, default=8, help="number of token windows (default 8)")
    run.add_argument("--seq-len", type=int, default=512, help="tokens per window, BOS included (default 512)")
    run.add_argument("--ns", default="log", help="selection sizes: 'log' (default), 'all', or a comma list like 1,2,4,8")
    run.add_argument("--query", default="last", help="query positions: 'last' (default) or a comma list of ints")
    run.add_argument("--batch-size", type=int, default=4)
    run.add_argument("--out", default="runs/default", help="output directory (default runs/default)")
    group = run.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    group.add_argument("--force", action="store_true", help="delete --out first if it exists")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def _parse_ints(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TLGeometryError(f"{what} must be a comma-separated list of integers, got {text!r}") from None


def run_command(args: argparse.Namespace) -> int:
    import tl_geometry as tlg

    if args.n_seqs < 1:
        raise TLGeometryError(f"--n-seqs must be at least 1, got {args.n_seqs}")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        if args.force:
            shutil.rmtree(out)
        elif not args.resume:
            raise TLGeometryError(f"{out} already exists: pass --resume to continue that run or --force to replace it")
    ns = args.ns if args.ns in ("log", "all") else _parse_ints(args.ns, "--ns")
    query = "last" if args.query == "last" else _parse_ints(args.query, "--query")
    if args.dataset:
        corpus = tlg.corpus.from_dataset(args.dataset, n_seqs=args.n_seqs, seq_len=args.seq_len)
    elif args.corpus == "python-docs":
        corpus = tlg.corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len)
    else:
        corpus = tlg.corpus.from_files(args.corpus, n_seqs=args.n_seqs, seq_len=args.seq_len)

    t0 = time.perf_counter()
    print(f"loading {args.model} ...", file=sys.stderr)
    model = tlg.load_model(args.model)
    load_s = time.perf_counter() - t0
    result = tlg.analyze(
        model, corpus, ns=ns, query_positions=query, batch_size=args.batch_size,
        out_dir=out, resume=True, progress=not args.no_progress,
    )  # fmt: skip
    result.separability.to_parquet(out / "separability.parquet", index=False)
    summary = result.mean_by_n()
    summary.to_csv(out / "mean_by_n.csv", index=False)
    run_info = {
        "model": result.model.__dict__,
        "config": result.config,
        "timings": {"load_s": load_s, **result.timings},
        "versions": {p: _version(p) for p in ("tl-geometry", "transformer-lens", "torch", "transformers")},
        "python": platform.python_version(),
    }
    (out / "run.json").write_text(json.dumps(run_info, indent=2, default=str))
    print(_summary(result, summary, out, load_s))
    return 0


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _summary(result, summary, out: Path, load_s: float) -> str:
    m, c, t = result.model, result.config, result.timings
    shown = summary[summary.n.isin([1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024]) | (summary.n == summary.n.max())]
    table = shown[["n", "precision", "recall", "f_at_rmax", "f_at_rmin"]].to_string(index=False, float_format="%.3f")
    return "\n".join([
        f"model   {m.name}: {m.n_layers} layers x {m.n_heads} heads ({m.n_kv_heads} kv heads), d_head {m.d_head}",
        f"corpus  {c['corpus']}: {c['n_seqs']} windows x {c['seq_len']} tokens, query positions {c['query_positions']}",
        f"time    load {load_s:.1f}s, forward {t['forward_s']:.1f}s, analysis {t['analysis_s']:.1f}s",
        "mean over sequences, layers and heads:",
        table,
        f"wrote   {out}/separability.parquet ({len(result.separability)} rows), mean_by_n.csv, run.json",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return run_command(args)
    except TLGeometryError as exc:
        print(f"tl-geometry: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("tl-geometry: interrupted; what was written is kept, continue with --resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
