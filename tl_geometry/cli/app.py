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
    head_effects.parquet loss change of mean-ablating each head (--mean-ablation; the report's effect by regime)
    progress/            per-batch parts and accumulator states, for --resume
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

from tl_geometry.errors import TLGeometryError
from tl_geometry.io.files import write_json_atomic
from tl_geometry.pipeline.torchrun import World, check_shards, has_progress

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
#: Tokens of the first window shown in the report's head grid.
GRID_TOKENS = 48
#: Tokens of the first window over which ``--mean-ablation`` mean-ablates each head (the report's
#: effect by regime; one forward pass per head, about 1.4 s each for SmolLM2 on one CPU thread).
ABLATION_TOKENS = 128
#: Heads shown in the head grid (each regime keeps a share, largest margin first).
GRID_HEADS = 32
#: Weight dtypes of ``--dtype``.
MODEL_DTYPES = {"float32": "float32", "float64": "float64", "bfloat16": "bfloat16", "float16": "float16"}
#: The file that marks a directory as written by ``tl-geometry run`` (only such a directory is
#: replaced by ``--force``); it holds the command that started the run.
MARKER_FILE = ".tl-geometry-run"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tl-geometry", description="Geometry of token selection in attention heads (tl_geometry)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="analyse a model over a corpus, write the tables and the HTML report")
    run.add_argument(
        "--model", default="smollm2-135m", help="TransformerLens model name (default: the embedded smollm2-135m)"
    )
    run.add_argument(
        "--corpus", default="python-docs", help="'python-docs' (embedded, default) or a path to a text file"
    )
    run.add_argument(
        "--dataset", default=None, help="a Hugging Face datasets name (needs the internet), instead of --corpus"
    )
    run.add_argument("--n-seqs", type=int, default=8, help="number of token windows (default 8)")
    run.add_argument("--seq-len", type=int, default=512, help="tokens per window, BOS included (default 512)")
    run.add_argument(
        "--ns", default="log", help="selection sizes N: 'log' (default), 'all', or a comma list like 1,2,4,8"
    )
    run.add_argument(
        "--query", default="last", help="query positions: 'last' (default), 'all', or a comma list of ints"
    )
    run.add_argument(
        "--query-stride",
        type=int,
        default=None,
        metavar="K",
        help="every K-th query position: K-1, 2K-1, ... (instead of --query)",
    )
    run.add_argument(
        "--device",
        default=None,
        help="where the model runs and the analysis computes: cpu (default), cuda (cuda:LOCAL_RANK under torchrun), cuda:1, mps",
    )
    run.add_argument(
        "--dtype", default="float32", choices=sorted(MODEL_DTYPES), help="the model's weight dtype (default float32)"
    )
    run.add_argument(
        "--analysis-dtype",
        default="float64",
        choices=["float64", "float32"],
        help="precision of the analysis: float64 (default); float32 screens separability in float32 "
        "and re-decides near ties in float64 (identical counts)",
    )
    run.add_argument("--kappa", type=float, default=0.5, help="the bounds' concentration constant (default 0.5)")
    run.add_argument("--no-bounds", action="store_true", help="skip the theoretical envelopes")
    run.add_argument("--no-diagnostics", action="store_true", help="skip the assumption diagnostics")
    run.add_argument("--mean-ablation", action="store_true",
                     help="mean-ablate each head over the first window's first 128 tokens for the report's effect by "
                     "regime (one forward pass per head: about 6 min for SmolLM2 on one CPU thread)")  # fmt: skip
    run.add_argument("--batch-size", type=int, default=4, help="windows per forward pass (default 4)")
    run.add_argument(
        "--rank-by", default="attention,random",
        help="rankings that define the top-N set, a comma list of attention, contribution, random, sink_window "
        "(default attention,random: attention with the random control)",
    )  # fmt: skip
    run.add_argument("--distance", default="euclidean", help="'euclidean' (default) or 'cosine'")
    run.add_argument("--n-random", type=int, default=16, help="random draws per row of the random control (default 16)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random control (default 0)")
    add_out_options(run, "runs/default", "run")
    from tl_geometry.cli.sparsify import add_parser as add_sparsify_parser

    add_sparsify_parser(sub)
    report = sub.add_parser("report", help="rebuild DIR/index.html from the results saved in DIR")
    report.add_argument("dir", help="a directory written by `tl-geometry run`")
    return parser


def _parse_ints(text: str, option: str, words: tuple[str, ...]) -> str | list[int]:
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


def check_window_options(args: argparse.Namespace, why_two: str) -> None:
    """``--n-seqs >= 1``, ``--seq-len >= 2`` (``why_two`` says why) and ``--batch-size >= 1``."""
    if args.n_seqs < 1:
        raise TLGeometryError(f"--n-seqs must be at least 1, got {args.n_seqs}")
    if args.seq_len < 2:
        raise TLGeometryError(f"--seq-len must be at least 2 ({why_two}), got {args.seq_len}")
    if args.batch_size < 1:
        raise TLGeometryError(f"--batch-size must be at least 1, got {args.batch_size}")


def _settings(args: argparse.Namespace):
    """The :class:`~tl_geometry.pipeline.settings.AnalysisSettings` of the options (checked before any loading)."""
    from tl_geometry.pipeline.settings import AnalysisSettings

    check_window_options(args, "BOS plus one token")
    if not (math.isfinite(args.kappa) and args.kappa > 0):
        raise TLGeometryError(f"--kappa must be a positive finite number, got {args.kappa}")
    if args.query_stride is not None and args.query_stride < 1:
        raise TLGeometryError(f"--query-stride must be at least 1, got {args.query_stride}")
    if args.query_stride is not None and args.query != "last":
        raise TLGeometryError("give either --query or --query-stride, not both")
    queries: slice | str | list[int]
    if args.query_stride is not None:
        queries = slice(args.query_stride - 1, None, args.query_stride)
    else:
        queries = _parse_ints(args.query, "--query", AnalysisSettings.QUERY_WORDS)
    return AnalysisSettings(
        ns=_parse_ints(args.ns, "--ns", ("log", "all")),
        query_positions=queries,
        batch_size=args.batch_size, diagnostics=not args.no_diagnostics, bounds=not args.no_bounds,
        kappa=args.kappa, rank_by=[name.strip() for name in args.rank_by.split(",") if name.strip()],
        distance=args.distance, n_random=args.n_random, seed=args.seed, dtype=args.analysis_dtype,
    )  # fmt: skip


def _is_run_dir(out: Path) -> bool:
    return (out / MARKER_FILE).is_file()


def _holds_results(out: Path) -> bool:
    """Whether ``out`` holds anything besides the marker (a run that failed before its first batch holds only that)."""
    return out.is_dir() and any(p.name != MARKER_FILE for p in out.iterdir())


def add_out_options(parser: argparse.ArgumentParser, default: str, what: str) -> None:
    """``--out``, ``--resume`` / ``--force`` (one or the other) and ``--no-progress`` of a command writing a ``what``."""
    parser.add_argument("--out", default=default, help=f"output directory (default {default})")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help=f"continue an interrupted {what} in --out")
    group.add_argument("--force", action="store_true", help="replace --out if it exists")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def _has_saved_run(out: Path) -> bool:
    return has_progress(out / "progress")


def _check_out(
    args: argparse.Namespace,
    *,
    what: str = "run",
    example: str = "runs/my-run",
    saved: Callable[[Path], bool] = _has_saved_run,
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
    if args.force and _holds_results(out):
        _check_replaceable(out)
    elif _holds_results(out) and not args.resume:
        if _is_run_dir(out):
            raise TLGeometryError(
                f"{out} already exists: pass --resume to continue that {what} or --force to replace it"
            )
        raise TLGeometryError(
            f"{out} already exists and was not written by tl-geometry (no {MARKER_FILE}): choose another --out"
        )
    if args.resume and not saved(out):
        raise TLGeometryError(f"--resume: {out} {nothing_saved}; drop --resume")
    return out


def _check_replaceable(out: Path) -> None:
    """Refuse ``--force`` on anything but a run directory, and always on ``/``, home and the working directory."""
    target = out.resolve()
    cwd = Path.cwd().resolve()
    if target == Path(target.anchor) or target == Path.home().resolve() or cwd.is_relative_to(target):
        raise TLGeometryError(
            f"--force will not delete {out}: it is /, the home directory, or the working directory or one above it"
        )
    if not _is_run_dir(out):
        raise TLGeometryError(
            f"--force replaces only a directory written by tl-geometry run (it holds {MARKER_FILE}); {out} does not: "
            "choose another --out"
        )


def _claim_out(out: Path, args: argparse.Namespace) -> None:
    """Create ``out`` (replacing it with ``--force``) and mark it as a run directory."""
    try:
        if args.force and _holds_results(out):
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        if not _is_run_dir(out) or args.force:
            write_json_atomic(out / MARKER_FILE, {"command": _command_line(args)})
    except OSError as exc:
        raise TLGeometryError(f"cannot write to --out {out}: {exc.strerror or exc}; choose another --out") from None


def _command_line(args: argparse.Namespace) -> list[str]:
    return ["tl-geometry", *getattr(args, "argv", [])]


def _resume_command(command: list[str] | None, out: Path) -> str:
    """The command that continues an interrupted run: its own, without ``--force``, with ``--resume``."""
    if not command:
        return f"tl-geometry run --resume --out {shlex.quote(str(out))} with the options it was started with"
    words = [w for w in command if w != "--force"]
    return shlex.join(words if "--resume" in words else [*words, "--resume"])


def _corpus(args: argparse.Namespace):
    from tl_geometry import corpus

    if args.dataset:
        return corpus.from_dataset(args.dataset, n_seqs=args.n_seqs, seq_len=args.seq_len)
    if args.corpus == "python-docs":
        return corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len)
    return corpus.from_files(args.corpus, n_seqs=args.n_seqs, seq_len=args.seq_len)


def _device(args: argparse.Namespace, world: World | None):
    import torch

    if args.device is None:
        return None
    try:
        device = torch.device(args.device)
    except (RuntimeError, TypeError):
        raise TLGeometryError(f"--device {args.device!r} is not a torch device: use cpu, cuda, cuda:1 or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TLGeometryError("--device cuda: no CUDA device is available here; use --device cpu")
    return world.device(args.device) if world is not None else device


def run_command(args: argparse.Namespace) -> int:
    world = World.sharding_from_env()
    settings = _settings(args)
    device = _device(args, world)
    out = _check_out(args)
    if world is not None and not args.force:
        check_shards(out / "progress", world.size)
    corpus = _corpus(args)
    if world is not None:
        import torch

        with world.session(device or torch.device("cpu")):
            return _run_command(args, settings, device, out, corpus, world)
    return _run_command(args, settings, device, out, corpus, world)


def _run_command(args, settings, device, out: Path, corpus, world: World | None) -> int:
    import torch

    main_process = world is None or world.is_main
    if main_process and not out.exists():
        _claim_out(out, args)  # a path we cannot write to fails now, before the model is loaded
    if world is not None:
        world.barrier()

    import tl_geometry as tlg
    from tl_geometry.io.environment import installed_versions
    from tl_geometry.io.store import StoreError
    from tl_geometry.pipeline.loop import run_analysis
    from tl_geometry.pipeline.plan import plan_analysis
    from tl_geometry.plot.circuitsvis_grid import head_grid_html
    from tl_geometry.report import EFFECTS_FILE, build_report

    t0 = time.perf_counter()
    print(f"loading {args.model} ...", file=sys.stderr)
    model = tlg.load_model(args.model, device=device, dtype=getattr(torch, MODEL_DTYPES[args.dtype]))
    load_s = time.perf_counter() - t0
    plan = plan_analysis(model, corpus, settings)
    if main_process:
        _claim_out(out, args)
    if world is not None:
        world.barrier()
    try:
        if world is not None:
            from tl_geometry.pipeline.torchrun import run_sharded

            result = run_sharded(plan, out / "progress", world, show_progress=not args.no_progress)
            if result is None:
                return 0
        else:
            result = run_analysis(plan, out / "progress", resume=True, progress=not args.no_progress)
    except StoreError as exc:
        raise TLGeometryError(f"{exc}; or start over with --force") from None
    except KeyboardInterrupt:
        done = _done_count(out)
        if not done:
            print("tl-geometry: interrupted before the first windows were saved; start again with "
                  f"`{shlex.join(_command_line(args))}`", file=sys.stderr)  # fmt: skip
            return EXIT_INTERRUPTED
        print(f"tl-geometry: interrupted; {done} windows are saved in {out}/progress; continue with "
              f"`{_resume_command(_command_line(args), out)}`", file=sys.stderr)  # fmt: skip
        return EXIT_INTERRUPTED
    t1 = time.perf_counter()
    result.save(out)
    heads = result.classify_heads(query_pos=result.config["query_positions"][-1])
    heads.to_parquet(out / "heads.parquet", index=False)
    with warnings.catch_warnings():  # showing GRID_HEADS of all heads is the intent here, not news
        warnings.filterwarnings("ignore", message=r".*heads chosen; the head grid shows", category=UserWarning)
        grid = head_grid_html(model, result.tokens[0, :GRID_TOKENS], heads, max_heads=GRID_HEADS)
    (out / "head_grid.html").write_text(grid, encoding="utf-8")
    if args.mean_ablation:
        effects = tlg.intervention.patching.mean_ablation(model, result.tokens[:1, :ABLATION_TOKENS])
        effects.to_parquet(out / EFFECTS_FILE, index=False)
    versions = installed_versions()
    run_info = {
        "model": result.model.__dict__,
        "corpus": result.config["corpus"],
        "parameters": {**result.config, "kappa": args.kappa, "batch_size": args.batch_size},
        "settings": settings.to_dict(),
        "timings": {"load_s": load_s, **result.timings, "tables_and_head_grid_s": time.perf_counter() - t1},
        "versions": {k: v for k, v in versions.items() if k != "python"},
        "python": versions["python"],
        "command": " ".join(sys.argv),
    }
    write_json_atomic(out / "run.json", run_info)
    t2 = time.perf_counter()
    page = build_report(out, out, heads=heads)
    run_info["timings"]["report_s"] = time.perf_counter() - t2
    write_json_atomic(out / "run.json", run_info)
    print(_summary(result, heads, out, page, load_s))
    return 0


def report_command(args: argparse.Namespace) -> int:
    from tl_geometry.report import build_report

    src = Path(args.dir)
    if not src.is_dir():
        raise TLGeometryError(f"{src} is not a directory: give the --out directory of a `tl-geometry run`")
    if not (src / "result.json").is_file() and (src / "progress" / "progress.json").is_file():
        raise TLGeometryError(
            f"{src} holds an interrupted run and no result yet: finish it with `{_resume_command(_marked_command(src), src)}`"
        )
    _check_saved_tables(src)
    page = build_report(src, src)
    print(f"wrote {page}")
    return 0


def _marked_command(out: Path) -> list[str] | None:
    try:
        command = json.loads((out / MARKER_FILE).read_text())["command"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return command if isinstance(command, list) and all(isinstance(w, str) for w in command) else None


def _check_saved_tables(src: Path) -> None:
    """Every table of a run directory readable (a truncated one is named, not a traceback)."""
    import pyarrow.parquet as pq

    from tl_geometry.pipeline.result import load_result

    load_result(src)
    for path in sorted(src.glob("*.parquet")):
        try:
            pq.read_metadata(path)
        except Exception as exc:  # pyarrow raises several kinds on a damaged file
            raise TLGeometryError(
                f"{path} is damaged ({type(exc).__name__}): run the analysis again (tl-geometry run --force --out {src})"
            ) from None


def _done_count(out: Path) -> int:
    try:
        return len(json.loads((out / "progress" / "progress.json").read_text())["done"])
    except (OSError, ValueError, KeyError):
        return 0


def _ranking_lines(result) -> list[str]:
    """Mean f_at_rmax per ranking at a few N (the random control next to attention), when several were run."""
    by = result.mean_by_ranking()
    if by["rank_by"].nunique() < 2:
        return []
    by = by[by.n.isin([1, 2, 4, 8, 16, 32, 64]) | (by.n == by.n.max())]
    wide = by.pivot(index="rank_by", columns="n", values="f_at_rmax").reindex(by["rank_by"].unique())
    return ["mean f_at_rmax by ranking (random: mean over draws):", wide.to_string(float_format="%.3f")]


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
        *_ranking_lines(result),
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
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        if args.command == "run":
            return run_command(args)
        if args.command == "sparsify":
            from tl_geometry.cli.sparsify import sparsify_command

            return sparsify_command(args)
        return report_command(args)
    except TLGeometryError as exc:
        print(f"tl-geometry: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a file system that refuses a write: say which file, not a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"tl-geometry: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("tl-geometry: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
