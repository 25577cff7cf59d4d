"""The per-row engine on real SmolLM2-135M rows: both kernels, per layer, in one run (issue 22).

The last query's rows of a ``--seq-len``-token window (default 1024; 9 heads per layer) of layers
3 and 15, captured once; then ``tlg.separability`` for every ``N`` and for the random control (16
draws, log grid), ``kernel="torch"`` (the tensor decisions) and ``kernel="numba"`` (the compiled
passes) alternating, the best of ``--repeats`` each; the metrics of both kernels must be equal.

Run:  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_rows.py          (about 1 minute)
"""

from __future__ import annotations

import argparse
import os
import time

import torch

METRICS = ("precision", "recall", "r_max", "r_min", "retained_mass", "local_error_del", "local_error_ren")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from captured_layers import smollm2_layers

    import tl_geometry as tlg
    from tl_geometry.capture.hooks import values_per_head

    info, captured = smollm2_layers((3, 15), args.seq_len)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for layer, (pattern, v) in captured.items():
        weights = pattern[0, :, -1, :].double()  # [head, K]
        values = values_per_head(v, info.kv_head_of())[0].double()  # [head, K, d]
        for mode, kw in (("every N", dict(ns=None)), ("random", dict(ns="log", rank_by="random", n_random=16))):
            best, results = {}, {}
            for kernel in ("torch", "numba"):
                tlg.separability(weights[:2, :16], values[:2, :16], kernel=kernel, **kw)  # compile, warm up
                best[kernel] = float("inf")
            for _ in range(args.repeats):
                for kernel in ("torch", "numba"):
                    start = time.perf_counter()
                    results[kernel] = tlg.separability(weights, values, kernel=kernel, **kw)
                    best[kernel] = min(best[kernel], time.perf_counter() - start)
            same = all(torch.equal(getattr(results["torch"], m), getattr(results["numba"], m)) for m in METRICS)
            print(
                f"layer {layer:2d} {mode:7s}: torch {best['torch']:.3f}s, numba {best['numba']:.3f}s per layer = "
                f"{best['torch'] / best['numba']:.2f}x; metrics {'identical' if same else 'DIFFERENT'}; "
                f"load {os.getloadavg()[0]:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
