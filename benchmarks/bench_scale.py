"""Scaling benchmark on SmolLM2-135M (issue 13): analysis / forward ratios, torchrun, memory.

Prints, measured in this one run, with the same number of torch threads (``--threads``, default 2)
for the forward pass and the analysis:

1. ``tl-geometry run``'s analysis (diagnostics + envelopes + taxonomy + separability, log grid,
   last query) / forward, windows of ``--seq-len`` tokens (default 1024), the attention ranking
   alone (what the random control adds, which ``run`` measures too: ``bench_queries.py``);
2. separability for every ``N`` / forward (same windows);
3. every query position of 512-token windows, log grid, separability / forward;
4. the same main job with ``--analysis-dtype float32`` (float32 screening, float64 re-check);
5. wall time of ``torchrun --nproc-per-node=2`` (1 thread each) over ``python -m tl_geometry``
   (1 process, 2 threads), same command;
6. RSS after loading the model and peak RSS of a fresh process analysing 8 and 64 windows
   (128 tokens, last query, log grid, written to a run directory).

"forward" is the model's plain forward pass over the same windows (no hooks), the best of two;
"analysis" is the time inside the hooks (``AnalysisResult.timings['analysis_s']``, printed with
its parts: separability, bounds, diagnostics, taxonomy, each also over the forward pass); the time to
build the tables after the last window (profile fits, regime features: ``timings['tables_s']``,
once per run, not per window) is printed beside it.

``--keep-freed-memory`` measures both with glibc keeping freed memory, as ``tl-geometry`` runs
(:mod:`tl_geometry.runtime.allocator`): the forward pass is faster there, so the ratios are higher.

Run:  OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_scale.py            (about 20 minutes on 2 cores)
      OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_scale.py --quick    (2 windows, no torchrun/memory)
      ``--repeat 3`` prints each ratio three times, one after the other (the spread of one machine's runs)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from roofline import forward_seconds

ROOT = Path(__file__).resolve().parents[1]
#: The parts of ``AnalysisResult.timings["analysis_s"]`` timed apart.
ANALYSIS_PARTS = ("separability_s", "bounds_s", "diagnostics_s", "taxonomy_s")


def ratio(model, name: str, n_seqs: int, seq_len: int, batch_size: int, **kwargs) -> float:
    import tl_geometry as tlg

    tokens = tlg.corpus_tokens(model, tlg.corpus.python_docs(n_seqs=n_seqs, seq_len=seq_len))
    forward = forward_seconds(model, tokens, batch_size)
    result = tlg.analyze(model, tokens, batch_size=batch_size, progress=False, **kwargs)
    analysis, tables = result.timings["analysis_s"], result.timings["tables_s"]
    print(f"{name}: analysis {analysis:.2f}s / forward {forward:.2f}s = {analysis / forward:.2f}  "
          f"({n_seqs} x {seq_len} tokens, {len(result.separability)} rows); the tables after the "
          f"last window add {tables:.2f}s = {tables / forward:.2f} x forward", flush=True)  # fmt: skip
    parts = {k.removesuffix("_s"): v for k, v in result.timings.items() if k in ANALYSIS_PARTS}
    if len(parts) > 1:  # where the analysis goes, each part / forward
        print("    of which " + ", ".join(f"{k} {v:.2f}s ({v / forward:.2f})" for k, v in parts.items()), flush=True)
    return analysis / forward


def torchrun_ratio(n_seqs: int, seq_len: int) -> None:
    args = ["-m", "tl_geometry", "run", "--n-seqs", str(n_seqs), "--seq-len", str(seq_len), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    walls = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, launcher, threads in (
            ("1 process x 2 threads", [sys.executable], "2"),
            ("torchrun 2 processes x 1 thread", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                 "--nproc-per-node=2", "--log-dir", f"{tmp}/torchrun-logs"], "1"),
        ):  # fmt: skip
            start = time.perf_counter()
            subprocess.run([*launcher, *args, "--out", f"{tmp}/{threads}"], check=True, capture_output=True,
                           env={**env, "OMP_NUM_THREADS": threads})  # fmt: skip
            walls[name] = time.perf_counter() - start
            print(f"{name}: {walls[name]:.1f}s wall (model load, analysis, report)", flush=True)
    print(
        f"torchrun 2x1 / 1x2 wall-time ratio: {walls['torchrun 2 processes x 1 thread'] / walls['1 process x 2 threads']:.2f}"
    )


MEMORY_CHILD = """
import json, resource, sys, torch, tl_geometry as tlg
n, out = int(sys.argv[1]), sys.argv[2]
model = tlg.load_model("smollm2-135m")
after_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tlg.analyze(model, tlg.corpus.python_docs(n_seqs=n, seq_len=128), out_dir=out, progress=False, diagnostics=True,
            bounds=True)
print(json.dumps({"after_load_kib": after_load, "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def memory() -> None:
    peaks = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (8, 64):
            proc = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(n), f"{tmp}/{n}"], check=True,
                                  capture_output=True, text=True)  # fmt: skip
            rss = json.loads(proc.stdout.strip().splitlines()[-1])
            peaks[n] = rss["peak_kib"] / 1024
            print(
                f"{n} windows: RSS after load {rss['after_load_kib'] / 1024:.0f} MiB, peak {peaks[n]:.0f} MiB",
                flush=True,
            )
    print(f"peak RSS growth 8 -> 64 windows: {peaks[64] - peaks[8]:.0f} MiB (target <= 100)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--n-seqs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, mps")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="measure each ratio this many times (one line each)")
    from roofline import add_allocator_flag, allocator_line, cpu_line

    add_allocator_flag(parser)
    args = parser.parse_args()
    import tl_geometry as tlg

    allocator = allocator_line(args.keep_freed_memory)
    torch.set_num_threads(args.threads)  # after the import: a count the package takes as the user's

    n = 2 if args.quick else args.n_seqs
    model = tlg.load_model("smollm2-135m", device=args.device)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(cpu_line())
    print(allocator)
    main_job = dict(diagnostics=True, bounds=True, taxonomy=True, ns="log")
    warm = tlg.corpus_tokens(model, tlg.corpus.python_docs(n_seqs=1, seq_len=64))
    for dtype in (torch.float64, torch.float32):  # numba's start-up and compiles (per dtype), untimed
        for kwargs in (main_job, dict(ns="all", taxonomy=False), dict(ns="log", query_positions="all")):
            tlg.analyze(model, warm, progress=False, dtype=dtype, **kwargs)
    lines = [  # (label, windows, tokens, batch, analyze's settings), each measured --repeat times in a row
        ("run analysis (diagnostics + envelopes + taxonomy + separability, log) / forward [target <= 0.3]",
         n, args.seq_len, 2, main_job),
        ("  same, --analysis-dtype float32", n, args.seq_len, 2, dict(dtype=torch.float32, **main_job)),
        ("separability every N / forward [target <= 0.3]", n, args.seq_len, 2, dict(ns="all", taxonomy=False)),
        ("  same, float32 screening", n, args.seq_len, 2, dict(ns="all", taxonomy=False, dtype=torch.float32)),
        # the query engine screens in float32 and decides in float64 (bench_queries.py compares float64 screening)
        ("every query position, 512 tokens, log / forward [target <= 3]", 1, 512, 1,
         dict(ns="log", taxonomy=False, query_positions="all")),
    ]  # fmt: skip
    for label, n_seqs, seq_len, batch_size, kwargs in lines:
        for _ in range(args.repeat):
            ratio(model, label, n_seqs, seq_len, batch_size, **kwargs)
    if not args.quick:
        torchrun_ratio(4, 256)
        memory()
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
