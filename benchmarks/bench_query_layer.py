"""The query engine on single SmolLM2-135M layers (issue 22): every query of one window, both dtypes.

Captures ``hook_pattern`` and ``hook_v`` of the chosen layers from one window of ``--seq-len``
tokens (default 512) of the embedded CPython documentation corpus, then times
``separability_queries`` on every query position of each layer (all heads, log grid, attention
ranking), with a float64 and with a float32 screen (the default; float64 decisions), the best of ``--repeat``
calls, on one torch thread; and checks that both dtypes give the same metrics bit for bit.
Prints the load average beside each line (compare timings within one run).

``--rank-by``, ``--distance`` and ``--query-stride K`` (every K-th query) time other settings;
``--products values gram auto`` times the routes of the products instead of the two dtypes (the
default screen, alternating the routes ``--repeat`` times, the best and the median of each) and
checks that they give the same metrics bit for bit.

Run:  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_query_layer.py --layers 3 15
      OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_query_layer.py --rank-by random --query-stride 8
      OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_query_layer.py --layers 15 --products values auto --repeat 5
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 15])
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rank-by", default="attention", help="attention (default), contribution, random, ...")
    parser.add_argument("--distance", default="euclidean", help="euclidean (default) or cosine")
    parser.add_argument("--query-stride", type=int, default=1, help="every K-th query position (default: every one)")
    parser.add_argument("--products", nargs="+", help="time these routes (values, gram, auto) instead of the dtypes")
    args = parser.parse_args()

    from captured_layers import smollm2_layers
    from roofline import best_of, cpu_line

    from tl_geometry.core.engine.query_engine import separability_queries

    info, captured = smollm2_layers(args.layers, args.seq_len)
    print(cpu_line())
    queries = list(range(args.query_stride - 1, args.seq_len, args.query_stride))
    kv_head_of = info.kv_head_of()
    how = dict(rank_by=args.rank_by, distance=args.distance)
    every = "every query" if args.query_stride == 1 else f"every {args.query_stride}th query"
    for layer, (pattern, v) in captured.items():
        weights, values = pattern[:, :, queries].double(), v.double()
        if args.products:
            routes(layer, weights, values, queries, kv_head_of, how, args)
            continue
        results = {}
        for dtype in (torch.float64, torch.float32):
            warm = separability_queries(weights[:, :, :1], values, queries[:1], kv_head_of, "log", screen=dtype, **how)
            seconds, results[dtype] = best_of(
                args.repeat, separability_queries, weights, values, queries, kv_head_of, "log", screen=dtype, **how
            )
            print(
                f"layer {layer}, {every} of {args.seq_len} tokens, {info.n_heads} heads, log grid, "
                f"{args.rank_by}, {args.distance}, {str(dtype).removeprefix('torch.')} screen: {seconds:.3f}s  "
                f"(load average {os.getloadavg()[0]:.2f})",
                flush=True,
            )
            del warm
        same = bit_identical(results[torch.float64], results[torch.float32])
        print(f"  float32 screening equals float64 bit for bit: {same}")


def bit_identical(first, other) -> bool:
    """Whether two results of ``separability_queries`` hold the same metrics bit for bit (NaNs alike)."""
    return all(
        torch.equal(getattr(first, name).nan_to_num(-1.0), getattr(other, name).nan_to_num(-1.0))
        for name in ("precision", "recall", "r_max", "r_min", "local_error_del", "local_error_ren")
    )


def routes(layer, weights, values, queries, kv_head_of, how, args) -> None:
    """The routes of the products on one layer, alternating, in one process: best and median seconds."""
    import statistics

    from tl_geometry.core.engine.query_engine import separability_queries

    run = partial(separability_queries, weights, values, queries, kv_head_of, "log", **how)
    seconds: dict[str, list[float]] = {route: [] for route in args.products}
    results = {route: run(products=route) for route in args.products}  # untimed: numba compiles
    for _ in range(args.repeat):
        for route in args.products:
            start = time.perf_counter()
            run(products=route)
            seconds[route].append(time.perf_counter() - start)
    for route, times in seconds.items():
        print(f"layer {layer}, {len(queries)} queries, products={route}: best {min(times):.3f}s, median "
              f"{statistics.median(times):.3f}s of {args.repeat}  (load average {os.getloadavg()[0]:.2f})")  # fmt: skip
    first = results[args.products[0]]
    same = all(bit_identical(first, other) for other in results.values())
    print(f"  every route gives the same metrics bit for bit: {same}", flush=True)


if __name__ == "__main__":
    main()
