"""Benchmark of the rankings in the separability engine on SmolLM2-135M (definitions §7).

Prints ratios measured in this one run (times are the best of two runs, as in
bench_separability.py, so that load from other processes inflates neither):

1. the random control: extra analysis time of ``analyze(rank_by=("attention", "random"),
   n_random=16)`` over ``analyze(rank_by="attention")``, log grid, last query, windows of
   --seq-len tokens (default 1024), divided by the plain forward time (target <= 0.3);
2. the local-error columns (retained_mass, local_error_del, local_error_ren): the time spent in
   the engine's step that makes them (timed on every call, attention + random), divided by the
   forward time (target <= 0.05); a difference of two analysis times is lost in their noise;
3. fast engine / loop reference (tests/reference.py) on real rows of one layer: every ranking,
   log grid; count mismatches.

Run:  .venv/bin/python benchmarks/bench_rankings.py            (about 10 minutes on 2 cores)
      .venv/bin/python benchmarks/bench_rankings.py --quick    (one window, no reference loop for random)
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_separability import forward_seconds  # noqa: E402

import tl_geometry as tlg  # noqa: E402
from tl_geometry.corpus import corpus_tokens  # noqa: E402

REPEATS = 2


def analysis_seconds(model, corpus, repeats: int | None = None, **kwargs) -> float:
    """Best of ``repeats`` of ``analyze(...).timings['analysis_s']`` (time inside the hooks)."""
    runs = [
        tlg.analyze(model, corpus, ns="log", taxonomy=False, batch_size=1, progress=False, **kwargs)
        for _ in range(repeats or REPEATS)
    ]
    return min(r.timings["analysis_s"] for r in runs)


def timing_local_columns():
    """Context: the engine's local-columns step (retained_mass, local_error_del, local_error_ren)
    timed on every call; ``.seconds`` is their total time."""
    engine = importlib.import_module("tl_geometry.core.separability")  # the module (tlg.separability is the function)
    real = engine._local_columns

    class Timer:
        seconds = 0.0

        def __enter__(self):
            def timed(*args):
                start = time.perf_counter()
                out = real(*args)
                Timer.seconds += time.perf_counter() - start
                return out

            engine._local_columns = timed
            return self

        def __exit__(self, *exc):
            engine._local_columns = real

    return Timer()


def ratios(model, n_seqs: int, seq_len: int) -> None:
    corpus = tlg.corpus.python_docs(n_seqs=n_seqs, seq_len=seq_len)
    tokens = corpus_tokens(model, corpus)
    fwd = forward_seconds(model, tokens, batch_size=1)
    from roofline import cpu_line

    print(cpu_line())
    print(f"plain forward: {fwd:.2f}s for {n_seqs} windows of {seq_len} tokens")
    attention = analysis_seconds(model, corpus, rank_by="attention")
    with timing_local_columns() as local:
        both = analysis_seconds(model, corpus, rank_by=("attention", "random"), n_random=16)
    local_s = local.seconds / REPEATS  # per run
    print(f"  attention, log grid:                 analysis {attention:6.2f}s -> /forward = {attention / fwd:.3f}")
    print(f"  attention + random (16 draws):       analysis {both:6.2f}s -> /forward = {both / fwd:.3f}")
    print(
        f"  random control adds                  {both - attention:6.2f}s -> /forward = {(both - attention) / fwd:.3f}  (target <= 0.3)"
    )
    print(
        f"  local-error columns, att.+random     {local_s:6.2f}s -> /forward = {local_s / fwd:.3f}  (target <= 0.05; time inside the step)"
    )


def engine_vs_reference(model, seq_len: int, n_random: int) -> None:
    from reference import METRICS, mix, row_metrics

    from tl_geometry.capture.hooks import values_per_head
    from tl_geometry.models import hook_pattern_name, hook_v_name

    info = tlg.describe_model(model)
    tokens = corpus_tokens(model, tlg.corpus.python_docs(n_seqs=1, seq_len=seq_len))
    layer = info.n_layers // 2
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in (hook_v_name(layer), hook_pattern_name(layer)))
    weights = cache[hook_pattern_name(layer)][0, :, -1, :].double()  # [head, K]
    values = values_per_head(cache[hook_v_name(layer)], info.kv_head_of())[0].double()  # [head, K, d]
    for rank_by in ("attention", "contribution", "sink_window", "random"):
        for distance in ("euclidean", "cosine"):
            start = time.perf_counter()
            fast = tlg.separability(weights, values, "log", rank_by=rank_by, distance=distance, n_random=n_random)
            fast_s = time.perf_counter() - start
            start = time.perf_counter()
            mismatches = 0
            for h in range(weights.shape[0]):
                for gi, n in enumerate(fast.ns.tolist()):
                    ref = row_metrics(weights[h], values[h], n, rank_by, distance, 0, mix(h, 0, 0, 0), n_random)
                    mismatches += abs(ref["precision"] - float(fast.precision[h, gi])) > 1e-12
                    mismatches += abs(ref["recall"] - float(fast.recall[h, gi])) > 1e-12
            ref_s = time.perf_counter() - start
            print(
                f"  {rank_by:12s} {distance:9s}: fast {fast_s:.3f}s, reference {ref_s:6.1f}s -> speed-up "
                f"{ref_s / fast_s:5.0f}x; count mismatches {mismatches} ({len(METRICS)} metrics, {weights.shape[0]} rows)"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--n-seqs", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=2, help="runs per setting, the best is kept (default 2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, mps")
    from roofline import add_allocator_flag, allocator_line

    add_allocator_flag(parser)
    args = parser.parse_args()
    print(allocator_line(args.keep_freed_memory))
    if args.threads:
        torch.set_num_threads(args.threads)
    global REPEATS
    REPEATS = args.repeats
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cpus")
    model = tlg.load_model("smollm2-135m", device=args.device)
    ratios(model, 1 if args.quick else args.n_seqs, args.seq_len)
    print(f"engine vs loop reference, real rows (layer {tlg.describe_model(model).n_layers // 2}, last query, K=256):")
    engine_vs_reference(model, 256, n_random=2 if args.quick else 16)


if __name__ == "__main__":
    main()
