"""The ``tl-geometry`` command line.

``tl-geometry run`` analyses a model over a corpus (by default the embedded SmolLM2-135M over
CPython's documentation, offline), writes results as it goes, builds a self-contained HTML
report and prints a one-screen summary. ``tl-geometry report DIR`` rebuilds the report from
saved results. Errors a user can fix are one line on stderr and exit code 2.

A run directory holds::

    index.html           the report (opens with no network)
    run.json             model, corpus, parameters, package versions, timings
    *.parquet            every table (separability, value_norms, similarity, ..., heads)
    tokens.npy, result.json    the windows and metadata (tl_geometry.load_result reads them)
    head_grid.html       the circuitsvis head grid fragment
    progress/            per-batch parts and accumulator states, for --resume
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
import warnings
from importlib import metadata
from pathlib import Path

from .errors import TLGeometryError

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
#: Tokens of the first window shown in the report's head grid.
GRID_TOKENS = 48
#: Heads shown in the head grid (each regime keeps a share, largest margin first).
GRID_HEADS = 32


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tl-geometry", description="Geometry of token selection in attention heads (tl_geometry)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="analyse a model over a corpus, write the tables and the HTML report")
    run.add_argument("--model", default="smollm2-135m", help="TransformerLens model name (default: the embedded smollm2-135m)")
    run.add_argument("--corpus", default="python-docs", help="'python-docs' (embedded, default) or a path to a text file")
    run.add_argument("--dataset", default=None, help="a Hugging Face datasets name (needs the internet), instead of --corpus")
    run.add_argument("--n-seqs", type=int, default=8, help="number of token windows (default 8)")
    run.add_argument("--seq-len", type=int, default=512, help="tokens per window, BOS included (default 512)")
    run.add_argument("--ns", default="log", help="selection sizes N: 'log' (default), 'all', or a comma list like 1,2,4,8")
    run.add_argument("--query", default="last", help="query positions: 'last' (default) or a comma list of ints")
    run.add_argument("--kappa", type=float, default=0.5, help="the bounds' concentration constant (default 0.5)")
    run.add_argument("--no-bounds", action="store_true", help="skip the theoretical envelopes")
    run.add_argument("--no-diagnostics", action="store_true", help="skip the assumption diagnostics")
    run.add_argument("--batch-size", type=int, default=4, help="windows per forward pass (default 4)")
    run.add_argument("--out", default="runs/default", help="output directory (default runs/default)")
    group = run.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    group.add_argument("--force", action="store_true", help="replace --out if it exists")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    report = sub.add_parser("report", help="rebuild DIR/index.html from the results saved in DIR")
    report.add_argument("dir", help="a directory written by `tl-geometry run`")
    return parser


def _parse_ints(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TLGeometryError(f"{what} must be 'log', 'all' or a comma-separated list of integers, got {text!r}") from None


def _check_arguments(args: argparse.Namespace) -> Path:
    if args.n_seqs < 1:
        raise TLGeometryError(f"--n-seqs must be at least 1, got {args.n_seqs}")
    if args.seq_len < 2:
        raise TLGeometryError(f"--seq-len must be at least 2 (BOS plus one token), got {args.seq_len}")
    if args.batch_size < 1:
        raise TLGeometryError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.kappa <= 0:
        raise TLGeometryError(f"--kappa must be positive, got {args.kappa}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise TLGeometryError(f"--out {out} is a file, not a directory")
    if out.exists() and any(out.iterdir()) and not (args.resume or args.force):
        raise TLGeometryError(f"{out} already exists: pass --resume to continue that run or --force to replace it")
    if args.resume and not (out / "progress" / "progress.json").exists():
        raise TLGeometryError(f"--resume: {out} holds no interrupted run (no progress/progress.json); drop --resume")
    return out


def _corpus(args: argparse.Namespace):
    from . import corpus

    if args.dataset:
        return corpus.from_dataset(args.dataset, n_seqs=args.n_seqs, seq_len=args.seq_len)
    if args.corpus == "python-docs":
        return corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len)
    return corpus.from_files(args.corpus, n_seqs=args.n_seqs, seq_len=args.seq_len)


def run_command(args: argparse.Namespace) -> int:
    out = _check_arguments(args)
    ns = args.ns if args.ns in ("log", "all") else _parse_ints(args.ns, "--ns")
    query = "last" if args.query == "last" else _parse_ints(args.query, "--query")
    corpus = _corpus(args)

    import tl_geometry as tlg
    from .report import build_report
    from .vis import head_grid_html

    t0 = time.perf_counter()
    print(f"loading {args.model} ...", file=sys.stderr)
    model = tlg.load_model(args.model)
    load_s = time.perf_counter() - t0
    if args.force and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        result = tlg.analyze(
            model, corpus, ns=ns, query_positions=query, batch_size=args.batch_size,
            diagnostics=not args.no_diagnostics, bounds=not args.no_bounds, kappa=args.kappa,
            out_dir=out / "progress", resume=True, progress=not args.no_progress,
        )  # fmt: skip
    except KeyboardInterrupt:
        done = _done_count(out)
        print(f"tl-geometry: interrupted; {done} windows are saved in {out}/progress; continue with "
              f"`tl-geometry run --resume --out {out}` and the same options", file=sys.stderr)  # fmt: skip
        return EXIT_INTERRUPTED
    t1 = time.perf_counter()
    result.save(out)
    heads = result.classify_heads(query_pos=result.config["query_positions"][-1])
    heads.to_parquet(out / "heads.parquet", index=False)
    with warnings.catch_warnings():  # showing GRID_HEADS of all heads is the intent here, not news
        warnings.filterwarnings("ignore", message=r".*heads chosen; the head grid shows", category=UserWarning)
        grid = head_grid_html(model, result.tokens[0, :GRID_TOKENS], heads, max_heads=GRID_HEADS)
    (out / "head_grid.html").write_text(grid, encoding="utf-8")
    run_info = {
        "model": result.model.__dict__,
        "corpus": result.config["corpus"],
        "parameters": {**result.config, "kappa": args.kappa, "batch_size": args.batch_size},
        "timings": {"load_s": load_s, **result.timings, "tables_and_head_grid_s": time.perf_counter() - t1},
        "versions": {p: _version(p) for p in ("tl-geometry", "transformer-lens", "torch", "transformers", "plotly", "circuitsvis")},
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
    }
    _write_json(out / "run.json", run_info)
    t2 = time.perf_counter()
    page = build_report(out, out, heads=heads)
    run_info["timings"]["report_s"] = time.perf_counter() - t2
    _write_json(out / "run.json", run_info)
    print(_summary(result, heads, out, page, load_s))
    return 0


def report_command(args: argparse.Namespace) -> int:
    from .report import build_report

    src = Path(args.dir)
    if not src.is_dir():
        raise TLGeometryError(f"{src} is not a directory: give the --out directory of a `tl-geometry run`")
    page = build_report(src, src)
    print(f"wrote {page}")
    return 0


def _done_count(out: Path) -> int:
    try:
        return len(json.loads((out / "progress" / "progress.json").read_text())["done"])
    except (OSError, ValueError, KeyError):
        return 0


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _summary(result, heads, out: Path, page: Path, load_s: float) -> str:
    m, c, t = result.model, result.config, result.timings
    by_n = result.mean_by_n()
    shown = by_n[by_n.n.isin([1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024]) | (by_n.n == by_n.n.max())]
    table = shown[["n", "precision", "recall", "f_at_rmax", "f_at_rmin"]].to_string(index=False, float_format="%.3f")
    regimes = heads.regime.value_counts().to_dict()
    regime_line = ", ".join(f"{k} {v}" for k, v in regimes.items())
    lines = [
        f"model    {m.name}: {m.n_layers} layers x {m.n_heads} heads ({m.n_kv_heads} kv heads), d_head {m.d_head}",
        f"corpus   {c['corpus']}: {c['n_seqs']} windows x {c['seq_len']} tokens, query positions {c['query_positions']}",
        f"time     load {load_s:.1f}s, forward {t['forward_s']:.1f}s, analysis {t['analysis_s']:.1f}s",
        "mean over windows, layers and heads:",
        table,
        f"regimes  {regime_line}",
    ]
    if result.value_norms is not None:
        lines.append(
            f"sink     sink_ratio < 1 in {(result.value_norms.sink_ratio < 1).mean():.0%} of (layer, kv head); "
            f"median norm_cv {result.value_norms.norm_cv.median():.3f}"
        )
    lines.append(f"report   {page}")
    lines.append(f"tables   {out}/*.parquet, run.json")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return run_command(args)
        return report_command(args)
    except TLGeometryError as exc:
        print(f"tl-geometry: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("tl-geometry: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
