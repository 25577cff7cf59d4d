"""Benchmark of the separability engine and the streaming analysis on SmolLM2-135M.

Prints ratios measured in this one run:

Both the forward and the analysis times are the best of two runs, so that load from other
processes inflates neither.

1. analysis time / forward time, windows of --seq-len tokens (default 1024), last query, all 270
   heads, for every N (1..K) and for the default log-spaced grid. "forward" is the model's plain
   forward pass over the same windows, without hooks; "analysis" is the time spent inside the
   hooks computing separability (``AnalysisResult.timings['analysis_s']``).
2. fast engine / naive loop reference (tests/reference.py) on the same real attention rows.
3. peak resident memory of a fresh process analysing 4 vs 32 windows.

Run:  .venv/bin/python benchmarks/bench_separability.py            (about 10 minutes on 2 cores)
      .venv/bin/python benchmarks/bench_separability.py --quick    (smaller: no memory part)
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from tl_geometry.corpus import corpus_tokens

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def forward_seconds(model, tokens: torch.Tensor, batch_size: int, repeats: int = 2) -> float:
    """Plain forward time over all windows: for each batch, the best of ``repeats`` passes."""
    total = 0.0
    with torch.inference_mode():
        model(tokens[:1])  # warm-up
        for b0 in range(0, tokens.shape[0], batch_size):
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                model(tokens[b0 : b0 + batch_size])
                best = min(best, time.perf_counter() - start)
            total += best
    return total


def analysis_ratio(model, n_seqs: int, seq_len: int, batch_size: int) -> None:
    import tl_geometry as tlg

    corpus = tlg.corpus.python_docs(n_seqs=n_seqs, seq_len=seq_len)
    tokens = corpus_tokens(model, corpus)
    fwd = forward_seconds(model, tokens, batch_size)
    print(f"plain forward: {fwd:.2f}s for {n_seqs} windows of {seq_len} tokens ({fwd / n_seqs:.2f}s per window)")
    settings = (
        ("separability, every N", dict(ns=None, taxonomy=False)),
        ("separability, log grid", dict(ns="log", taxonomy=False)),
        ("default analyze (+taxonomy)", dict(ns="log")),
        ("everything (+diagnostics, bounds)", dict(ns="log", diagnostics=True, bounds=True)),
    )
    for label, kwargs in settings:
        runs = [tlg.analyze(model, corpus, batch_size=batch_size, progress=False, **kwargs) for _ in range(2)]
        res = min(runs, key=lambda r: r.timings["analysis_s"])  # best of two, as for the forward
        t = res.timings
        n_sizes = res.separability.n.nunique()
        print(
            f"  {label:36s} ({n_sizes:4d} sizes): analysis {t['analysis_s']:6.2f}s -> analysis/forward = "
            f"{t['analysis_s'] / fwd:.3f}; whole analyze() / plain forward = {t['total_s'] / fwd:.2f}"
        )


def engine_vs_reference(model, seq_len: int) -> None:
    from reference import row_separability

    import tl_geometry as tlg
    from tl_geometry.capture.hooks import values_per_head
    from tl_geometry.models import hook_pattern_name, hook_v_name

    info = tlg.describe_model(model)
    tokens = corpus_tokens(model, tlg.corpus.python_docs(n_seqs=1, seq_len=seq_len))
    layer = info.n_layers // 2
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in (hook_v_name(layer), hook_pattern_name(layer)))
    weights = cache[hook_pattern_name(layer)][0, :, -1, :].double()  # [head, K]
    values = values_per_head(cache[hook_v_name(layer)], info.kv_head_of())[0].double()  # [head, K, d]
    start = time.perf_counter()
    fast = tlg.separability(weights, values)
    fast_s = time.perf_counter() - start
    start = time.perf_counter()
    mismatches = 0
    for h in range(weights.shape[0]):
        for n in range(1, weights.shape[1] + 1):
            ref = row_separability(weights[h], values[h], n)
            mismatches += ref["precision"] != float(fast.precision[h, n - 1]) or ref["recall"] != float(
                fast.recall[h, n - 1]
            )
    ref_s = time.perf_counter() - start
    print(
        f"engine vs naive reference, layer {layer}, {weights.shape[0]} real rows of K={weights.shape[1]}, every N: "
        f"fast {fast_s:.3f}s, reference {ref_s:.1f}s -> speed-up {ref_s / fast_s:.0f}x; count mismatches: {mismatches}"
    )


def peak_rss_child(n_seqs: int, seq_len: int) -> None:
    import tl_geometry as tlg

    model = tlg.load_model("smollm2-135m")
    tlg.analyze(model, tlg.corpus.python_docs(n_seqs=n_seqs, seq_len=seq_len), taxonomy=False, progress=False)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux


def peak_rss(n_seqs: int, seq_len: int) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--rss-child", str(n_seqs), "--seq-len", str(seq_len)],
        check=True, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    return int(out.stdout.strip().splitlines()[-1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--n-seqs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rss-child", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, mps")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.rss_child is not None:
        return peak_rss_child(args.rss_child, args.seq_len)

    import tl_geometry as tlg

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cpus")
    model = tlg.load_model("smollm2-135m", device=args.device)
    analysis_ratio(model, args.n_seqs, args.seq_len, args.batch_size)
    engine_vs_reference(model, 256)
    if not args.quick:
        small, large = peak_rss(4, args.seq_len), peak_rss(32, args.seq_len)
        print(f"peak RSS: 4 windows {small:.0f} MiB, 32 windows {large:.0f} MiB -> ratio {large / small:.3f}")


if __name__ == "__main__":
    main()
