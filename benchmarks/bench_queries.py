"""Every query position on SmolLM2-135M (issue 13): separability analysis / forward, in one run.

Prints, measured in this one process with the same number of torch threads (``--threads``,
default 2) for the forward pass and the analysis, on windows of ``--seq-len`` tokens (default 512)
of the embedded CPython documentation corpus, log grid of ``N``, attention ranking:

1. every query position (``query_positions="all"``, the query engine) / forward, float64 (the
   default) and float32 screening (float64 re-check) [target <= 3];
2. the old way, one query position at a time (``tl_geometry.core.separability`` per position), against
   the query engine on the same ``--stride``-spaced positions: the speed-up of the engine.

"forward" is the model's plain forward pass over the same windows (no hooks), the best of two;
"analysis" is the time inside the hooks (``AnalysisResult.timings['analysis_s']``).

Run:  OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_queries.py           (about 5 minutes on 2 cores)
      OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_queries.py --seq-len 128
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def synchronize() -> None:
    """Wait for the GPU's queued work (a no-op on the CPU), so that the timers see all of it."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def forward_seconds(model, tokens: torch.Tensor) -> float:
    """Plain forward over all windows, one at a time: per window, the best of two passes."""
    total = 0.0
    tokens = tokens.to(next(model.parameters()).device)
    with torch.inference_mode():
        model(tokens[:1, :8])  # warm-up
        for b in range(tokens.shape[0]):
            best = float("inf")
            for _ in range(2):
                synchronize()
                start = time.perf_counter()
                model(tokens[b : b + 1])
                synchronize()
                best = min(best, time.perf_counter() - start)
            total += best
    return total


def analysis_seconds(model, tokens: torch.Tensor, **kwargs) -> tuple[float, int]:
    import tl_geometry as tlg

    result = tlg.analyze(model, tokens, batch_size=1, progress=False, taxonomy=False, ns="log", **kwargs)
    return result.timings["analysis_s"], len(result.separability)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--n-seqs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, mps")
    parser.add_argument("--stride", type=int, default=16, help="query spacing of the old-way comparison")
    args = parser.parse_args()
    import tl_geometry as tlg

    torch.set_num_threads(args.threads)  # after the import: a count the package takes as the user's
    from tl_geometry.capture import observers

    model = tlg.load_model("smollm2-135m", device=args.device)
    tokens = tlg.corpus_tokens(model, tlg.corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len))
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    forward = forward_seconds(model, tokens)
    shape = f"{args.n_seqs} x {args.seq_len} tokens"
    print(f"forward {forward:.2f}s ({shape})", flush=True)
    for name, dtype in (("float64", torch.float64), ("float32 screening", torch.float32)):
        seconds, rows = analysis_seconds(model, tokens, query_positions="all", dtype=dtype)
        print(f"every query position, log grid, {name}: analysis {seconds:.2f}s / forward {forward:.2f}s = "
              f"{seconds / forward:.2f} [target <= 3]  ({rows} rows)", flush=True)  # fmt: skip
    positions = slice(args.stride - 1, None, args.stride)
    engine, _ = analysis_seconds(model, tokens, query_positions=positions)
    minimum = observers.MIN_QUERIES_FOR_BLOCKS
    observers.MIN_QUERIES_FOR_BLOCKS = 1 << 62  # one position at a time, as before the query engine
    try:
        old, rows = analysis_seconds(model, tokens, query_positions=positions)
    finally:
        observers.MIN_QUERIES_FOR_BLOCKS = minimum
    print(f"every {args.stride}th query, float64: one position at a time {old:.2f}s / query engine {engine:.2f}s = "
          f"{old / engine:.1f}x  (forward ratios {old / forward:.2f} and {engine / forward:.2f}, {rows} rows)")  # fmt: skip
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
