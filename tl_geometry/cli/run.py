"""``tl-geometry run``: analyse a model over a corpus, write every table and the HTML report.

::

    tl-geometry run --n-seqs 8 --seq-len 512 --out runs/default

The analysis options are generated from :class:`~tl_geometry.pipeline.settings.AnalysisSettings`
and default to :data:`~tl_geometry.pipeline.settings.CLI_PRESET`. ``--out`` receives
``index.html``, ``run.json``, the ``*.parquet`` tables, ``tokens.npy`` and ``result.json``
(:func:`tl_geometry.load_result` reads them), ``head_grid.html``, ``head_effects.parquet``
(with ``--mean-ablation``) and, while it runs, ``progress/`` (what ``--resume`` continues from;
removed once the run has written everything else).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from tl_geometry.cli.common import (
    EXIT_INTERRUPTED,
    add_out_options,
    add_source_options,
    check_out,
    check_window_options,
    claim_out,
    command_line,
    corpus_from_args,
    device_from_args,
    is_run_dir,
    locked_out,
    out_path,
    parse_ints,
    parse_names,
    remove_written,
    resume_command,
)
from tl_geometry.errors import InputError, TLGeometryError

#: Tokens of the first window shown in the report's head grid.
GRID_TOKENS = 48
#: Tokens of the first window over which ``--mean-ablation`` mean-ablates each head (the report's
#: effect by regime; one forward pass per head, about 1.4 s each for SmolLM2 on one CPU thread).
ABLATION_TOKENS = 128
#: Heads shown in the head grid (each regime keeps a share, largest margin first).
GRID_HEADS = 32
#: Weight dtypes of ``--dtype``.
MODEL_DTYPES = {"float32": "float32", "float64": "float64", "bfloat16": "bfloat16", "float16": "float16"}


# ----------------------------------------------------------------------------- the options


class _Switch(argparse.BooleanOptionalAction):
    """``--x`` / ``--no-x`` with the help as written (Python 3.11 appends its own default)."""

    def __init__(self, *args: Any, help: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = help


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def _summary(doc: str) -> str:
    """The first sentence of a setting's doc, as a help phrase."""
    first = doc.split(". ")[0].rstrip(".").replace("``", "")
    return first[:1].lower() + first[1:]


def _preset_description() -> str:
    """What the defaults of ``run`` are, and how they differ from ``tlg.analyze``'s."""
    from tl_geometry.pipeline.settings import AnalysisSettings, cli_default, cli_flag, cli_text

    differ = [
        f"{cli_flag(f)} {cli_text(cli_default(f))} (tlg.analyze: {cli_text(f.default)})"
        for f in fields(AnalysisSettings)
        if cli_default(f) != f.default
    ]
    absent = [f.name for f in fields(AnalysisSettings) if cli_flag(f) is None]
    return (
        "Analyse a model over a corpus, write the tables and the HTML report. The analysis options default "
        "to the command-line preset tl_geometry.pipeline.settings.CLI_PRESET, the full study its report shows; "
        f"it differs from tlg.analyze()'s defaults in {', '.join(differ)}. "
        f"Settings without an option here keep tlg.analyze()'s defaults: {', '.join(absent)}."
    )


def add_settings_options(parser: argparse.ArgumentParser) -> None:
    """One option per setting with a command-line form (its metadata's :class:`CliForm`), defaults from the preset.

    Every option's argparse default is None (not given): :func:`settings_from_args` takes the
    preset's value then, so the help shows the preset's and nothing else decides it.
    """
    from tl_geometry.pipeline.settings import AnalysisSettings, CliForm, cli_default, cli_flag, cli_text

    for f in fields(AnalysisSettings):
        form = f.metadata["cli"]
        flag = cli_flag(f)
        if not isinstance(form, CliForm) or flag is None:
            continue
        default = cli_text(cli_default(f))
        summary = _summary(f.metadata["doc"])
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=_Switch, default=None, help=f"{summary} (default: {default})")
            continue
        parser.add_argument(
            flag,
            type=str if form.comma else form.type,
            choices=form.choices,
            default=None,
            metavar=_dest(flag).upper() if form.choices is None else None,
            help=f"{summary}: {form.describe()} (default: {default})",
        )
        if form.stride:
            parser.add_argument(
                form.stride,
                type=int,
                default=None,
                metavar="K",
                help=f"every K-th position, K-1, 2K-1, ... (instead of {flag})",
            )


def settings_dests() -> tuple[str, ...]:
    """The argparse dests of the analysis options (and their stride forms): ``run`` records their
    resolved values instead (:func:`resolved_settings`)."""
    from tl_geometry.pipeline.settings import AnalysisSettings, CliForm, cli_flag

    dests = []
    for f in fields(AnalysisSettings):
        form, flag = f.metadata["cli"], cli_flag(f)
        if isinstance(form, CliForm) and flag is not None:
            dests += [_dest(flag), *([_dest(form.stride)] if form.stride else [])]
    return tuple(dests)


def resolved_settings(settings: Any) -> dict[str, Any]:
    """The analysis settings that change the results, by option (``--seed``; a setting without an
    option by its name): what a resumed ``run`` must share besides its other options."""
    from tl_geometry.pipeline.settings import cli_flag

    flags = {f.name: cli_flag(f) or f.name for f in fields(settings)}
    return {flags[name]: value for name, value in settings.identity().items()}


def settings_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~tl_geometry.pipeline.settings.AnalysisSettings` of the options: the preset with those given replaced.

    Every value is checked here, before anything is loaded; an error names the option.
    """
    from tl_geometry.pipeline.settings import CLI_PRESET, AnalysisSettings, CliForm, cli_flag

    check_window_options(args, "BOS plus one token")
    given: dict[str, Any] = {}
    for f in fields(AnalysisSettings):
        form = f.metadata["cli"]
        flag = cli_flag(f)
        if not isinstance(form, CliForm) or flag is None:
            continue
        value = getattr(args, _dest(flag))
        if value is not None and form.comma:
            if form.type is int:
                value = parse_ints(value, flag, form.words)
            elif value not in form.words:
                value = parse_names(value)
        if form.stride and getattr(args, _dest(form.stride)) is not None:
            stride = getattr(args, _dest(form.stride))
            if stride < 1:
                raise TLGeometryError(f"{form.stride} must be at least 1, got {stride}")
            if value is not None:
                raise TLGeometryError(f"give either {flag} or {form.stride}, not both")
            value = slice(stride - 1, None, stride)
        if value is None:
            continue
        try:
            given[f.name] = f.metadata["check"](value)
        except InputError as exc:
            raise TLGeometryError(f"{flag}: {exc}") from None
    return CLI_PRESET.replace(**given)


def add_parser(sub: Any) -> None:
    """The ``run`` sub-command."""
    run = sub.add_parser(
        "run",
        help="analyse a model over a corpus, write the tables and the HTML report",
        description=_preset_description(),
    )
    add_source_options(run)
    run.add_argument(
        "--device",
        default=None,
        help="where the model runs and the analysis computes: cpu (default), cuda (cuda:LOCAL_RANK under torchrun), cuda:1, mps",
    )
    run.add_argument(
        "--dtype", default="float32", choices=sorted(MODEL_DTYPES), help="the model's weight dtype (default float32)"
    )
    add_settings_options(run)
    run.add_argument(
        "--mean-ablation",
        action="store_true",
        help=f"mean-ablate each head over the first window's first {ABLATION_TOKENS} tokens for the report's effect "
        "by regime (one forward pass per head: about 6 min for SmolLM2 on one CPU thread)",
    )
    add_out_options(run, "runs/default", "run", not_settings=settings_dests())
    run.set_defaults(handler=run_command)


# ----------------------------------------------------------------------------- the command


def run_command(args: argparse.Namespace) -> int:
    """``tl-geometry run``: every option checked, then the analysis (sharded under torchrun), tables and report."""
    from tl_geometry.pipeline.torchrun import World

    world = World.sharding_from_env()
    settings = settings_from_args(args)
    args.resolved_settings = resolved_settings(settings)
    device = device_from_args(args, world)
    check_weight_dtype(args.dtype, device)
    out = out_path(args)
    if world is None:
        with locked_out(out, args):
            return _checked_run(args, settings, device, out, world)
    import torch

    with world.session(device or torch.device("cpu")), locked_out(out, args, world):
        return _checked_run(args, settings, device, out, world)


def check_weight_dtype(dtype: str, device: Any) -> None:
    """Refuse ``--dtype float16`` on the CPU: its attention overflows there and leaves NaN cells."""
    import torch

    on_cpu = torch.device(device).type == "cpu" if device is not None else not torch.cuda.is_available()
    if dtype == "float16" and on_cpu:
        raise TLGeometryError(
            "--dtype float16 on the CPU leaves NaN cells in the tables (local_error_ren): use --dtype float32 "
            "(the default), or float16 on a GPU (--device cuda)"
        )


def _checked_run(args: argparse.Namespace, settings: Any, device: Any, out: Path, world: Any) -> int:
    """``--out`` and the corpus checked (holding the lock), then the run."""
    from tl_geometry.pipeline.torchrun import check_shards

    check_out(args)
    if world is not None:
        if not args.force:
            check_shards(out / "progress", world.size)
        world.barrier()  # every rank has checked --out before rank 0 claims it
    corpus = corpus_from_args(args)
    check_before_load(args, settings)
    return _run(args, settings, device, out, corpus, world)


def check_before_load(args: argparse.Namespace, settings: Any) -> None:
    """The checks of the settings against the model that need only its configuration (layers, query
    positions and sizes, the memory of the whole run), made before its weights load; with a
    configuration that cannot be read here they wait for the loaded model."""
    from tl_geometry.models import model_shape
    from tl_geometry.pipeline.plan import check_run_memory

    shape = model_shape(args.model)
    if shape is None:
        return
    layers, queries = settings.resolve(shape.n_layers, args.seq_len)
    check_run_memory(shape.n_heads, shape.d_vocab, len(layers), queries, settings, args.seq_len, args.n_seqs)


def _run(args: argparse.Namespace, settings: Any, device: Any, out: Path, corpus: Any, world: Any) -> int:
    import torch

    main_process = world is None or world.is_main
    if main_process and not is_run_dir(out):
        claim_out(out, args)  # a path we cannot write to fails now, before the model is loaded
    if world is not None:
        world.barrier()

    import tl_geometry as tlg
    from tl_geometry.io.checksums import write_checked
    from tl_geometry.io.environment import installed_versions
    from tl_geometry.io.files import write_json_atomic
    from tl_geometry.io.store import StoreError
    from tl_geometry.pipeline.loop import run_analysis
    from tl_geometry.pipeline.plan import plan_analysis
    from tl_geometry.plot.circuitsvis_grid import head_grid_html
    from tl_geometry.report import EFFECTS_FILE, build_report

    t0 = time.perf_counter()
    print(f"loading {args.model} ...", file=sys.stderr)
    model = tlg.load_model(
        args.model, device=device, dtype=getattr(torch, MODEL_DTYPES[args.dtype]), progress=not args.no_progress
    )
    load_s = time.perf_counter() - t0
    plan = plan_analysis(model, corpus, settings)
    if main_process:
        claim_out(out, args)
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
            print(
                "tl-geometry: interrupted before the first windows were saved; start again with "
                f"`{shlex.join(command_line(args))}`",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
        print(
            f"tl-geometry: interrupted; {done} windows are saved in {out}/progress; continue with "
            f"`{resume_command(command_line(args), out)}`",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    t1 = time.perf_counter()
    result.save(out)
    heads = result.classify_heads(query_pos=result.config["query_positions"][-1])
    write_checked(out / "heads.parquet", lambda p: heads.to_parquet(p, index=False))
    grid = head_grid_html(model, result.tokens[0, :GRID_TOKENS], heads, max_heads=GRID_HEADS)
    (out / "head_grid.html").write_text(grid, encoding="utf-8")
    if args.mean_ablation:
        effects = tlg.intervention.patching.mean_ablation(model, result.tokens[:1, :ABLATION_TOKENS])
        write_checked(out / EFFECTS_FILE, lambda p: effects.to_parquet(p, index=False))
    versions = installed_versions()
    run_info = {
        "model": result.model.__dict__,
        "corpus": result.config["corpus"],
        "parameters": {**result.config, "kappa": settings.kappa, "batch_size": settings.batch_size},
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
    summary = _summary_text(result, heads, out, page, load_s)  # the last read of the rows in progress/
    remove_written(out, "progress")  # every table is saved: nothing is left to resume
    print(summary)
    return 0


def _done_count(out: Path) -> int:
    try:
        return len(json.loads((out / "progress" / "progress.json").read_text())["done"])
    except (OSError, ValueError, KeyError):
        return 0


def _ranking_lines(result: Any) -> list[str]:
    """Mean f_at_rmax per ranking at a few N (the random control next to attention), when several were run."""
    by = result.mean_by_ranking()
    if by["rank_by"].nunique() < 2:
        return []
    by = by[by.n.isin([1, 2, 4, 8, 16, 32, 64]) | (by.n == by.n.max())]
    wide = by.pivot(index="rank_by", columns="n", values="f_at_rmax").reindex(by["rank_by"].unique())
    return ["mean f_at_rmax by ranking (random: mean over draws):", wide.to_string(float_format="%.3f")]


#: The parts of the analysis timed apart (``AnalysisResult.timings``), as the summary names them.
ANALYSIS_PARTS = {"separability_s": "separability", "bounds_s": "envelopes", "diagnostics_s": "diagnostics",
                  "taxonomy_s": "regimes"}  # fmt: skip


def _analysis_parts(timings: dict) -> str:
    """`` (separability 1.2s, envelopes 0.8s, ...)`` for the parts in ``timings``, else nothing."""
    parts = [f"{label} {timings[key]:.1f}s" for key, label in ANALYSIS_PARTS.items() if key in timings]
    return f" ({', '.join(parts)})" if parts else ""


def _summary_text(result: Any, heads: Any, out: Path, page: Path, load_s: float) -> str:
    m, c, t = result.model, result.config, result.timings
    by_n = result.mean_by_n()
    shown = by_n[by_n.n.isin([1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024]) | (by_n.n == by_n.n.max())]
    table = shown[["n", "precision", "recall", "f_at_rmax", "f_at_rmin"]].to_string(index=False, float_format="%.3f")
    regimes = heads.regime.value_counts().to_dict()
    regime_line = ", ".join(f"{k} {v}" for k, v in regimes.items())
    lines = [
        f"model    {m.name}: {m.n_layers} layers x {m.n_heads} heads ({m.n_kv_heads} kv heads), d_head {m.d_head}",
        f"corpus   {c['corpus']}: {c['n_seqs']} windows x {c['seq_len']} tokens, query positions {c['query_positions']}",
        f"time     load {load_s:.1f}s, forward {t['forward_s']:.1f}s, analysis {t['analysis_s']:.1f}s"
        f"{_analysis_parts(t)}, tables {t.get('tables_s', 0.0):.1f}s",
        "mean over windows, layers and heads:",
        table,
        *_ranking_lines(result),
        f"regimes  {regime_line}",
    ]
    if result.value_norms is not None:
        lines.append(
            f"sink     the first token's value is shorter than the median of the others in "
            f"{(result.value_norms.sink_ratio < 1).mean():.0%} of (layer, kv head) (sink_ratio < 1); "
            f"the other values' lengths vary by {result.value_norms.norm_cv.median():.1%} of their mean "
            "(median norm_cv)"
        )
    lines.append(f"report   {page}")
    lines.append(f"tables   {out}/*.parquet, run.json")
    return "\n".join(lines)


__all__ = [
    "ABLATION_TOKENS",
    "GRID_HEADS",
    "GRID_TOKENS",
    "MODEL_DTYPES",
    "add_parser",
    "add_settings_options",
    "check_before_load",
    "check_weight_dtype",
    "resolved_settings",
    "run_command",
    "settings_dests",
    "settings_from_args",
]
