"""Every query position on SmolLM2-135M (issue 13): separability analysis / forward, in one run.

Prints, measured in this one process with the same number of torch threads (``--threads``,
default 2) for the forward pass and the analysis, on windows of ``--seq-len`` tokens (default 512)
of the embedded CPython documentation corpus, log grid of ``N``, attention ranking:

1. every query position (``query_positions="all"``, the query engine) / forward, float64
   decisions, with the fused numba pass on the value
   product (before: ``query_engine.GRAM_COST`` set to infinity for that line), screening in
   float32 (the default) and in float64 (``query_engine.SCREEN_DTYPE`` set for that line), and the
   fused pass with the Gram route where it is cheaper (the default, after) [target <= 3]; the
   floors: the multiply-adds ``<v_i, s(N)>`` of the value product at the measured float64 and
   float32 matmul throughputs, and the Gram route's running sums at the float64 one;
2. the old way, one query position at a time (``tl_geometry.core.separability`` per position), against
   the query engine on the same ``--stride``-spaced positions: the speed-up of the engine
   (``--no-old-way`` skips it);
3. separability for every ``N`` and the random control (16 draws, log grid), last query of
   ``--last-query-len`` tokens (default 1024) / forward, with the per-row engine's compiled
   passes, with its floors at the float64 and the float32 matmul throughputs (the per-row engine
   screens in float32) [targets <= 0.3].

The batched route (``kernel="torch"``, what a GPU runs) is measured by ``bench_gpu.py``: on a CPU
it does every key's direct distance, far more arithmetic than the compiled screen.

"forward" is the model's plain forward pass over the same windows (no hooks), the best of two;
"analysis" is the time inside the hooks (``AnalysisResult.timings['analysis_s']``).

Run:  OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_queries.py           (about 8 minutes on 2 cores)
      OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_queries.py --threads 1 --no-old-way
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from roofline import forward_seconds  # one window at a time, the best of two passes each


def analysis_seconds(model, tokens: torch.Tensor, kernel: str = "auto", **kwargs) -> tuple[float, int]:
    """Seconds inside the hooks of one ``analyze`` call with the screen ``kernel`` (both engines)."""
    import tl_geometry as tlg

    kwargs = {"ns": "log", **kwargs}
    result = tlg.analyze(model, tokens, batch_size=1, progress=False, taxonomy=False, kernel=kernel, **kwargs)
    return result.timings["analysis_s"], len(result.separability)


def last_query_lines(model, seq_len: int, rate: float, rate32: float) -> None:
    """Every N and the random control on one window's last query, each with its floors: the products
    at the float64 rate (``rate``) and at the float32 rate of their screen (``rate32``)."""
    from roofline import floor_line, last_query_macs

    import tl_geometry as tlg

    tokens = tlg.corpus_tokens(model, tlg.corpus.python_docs(n_seqs=1, seq_len=seq_len))
    forward = forward_seconds(model, tokens)
    info = tlg.describe_model(model)
    rows = info.n_heads * info.n_layers
    grid = len(tlg.log_spaced_ns(seq_len))
    for kernel in ("numba",):  # warm-up: numba compiles a kernel on its first call in a fresh install
        analysis_seconds(model, tokens[:, :32], kernel, ns=None, rank_by=("attention", "random"), n_random=2)
    for kernel, when in (("numba", "compiled passes"),):
        every_n, _ = analysis_seconds(model, tokens, kernel, ns=None)
        print(f"every N, last query, 1 x {seq_len} tokens, {when}: analysis {every_n:.2f}s / forward {forward:.2f}s = "
              f"{every_n / forward:.2f} [target <= 0.3]  (load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
        attention, _ = analysis_seconds(model, tokens, kernel, rank_by=("attention",))
        both, _ = analysis_seconds(model, tokens, kernel, rank_by=("attention", "random"), n_random=16)
        print(f"random control (16 draws, log grid), {when}: adds {both - attention:.2f}s / forward {forward:.2f}s = "
              f"{(both - attention) / forward:.2f} [target <= 0.3]  (load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    for name, macs in (
        ("every N", last_query_macs(seq_len, rows, info.d_head, seq_len)),
        ("the random control", last_query_macs(seq_len, rows, info.d_head, grid, 16)),
    ):
        print(floor_line(f"{name} (float64)", macs, rate, forward))
        print(floor_line(f"{name} (float32 screen)", macs, rate32, forward))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--n-seqs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, mps")
    parser.add_argument("--stride", type=int, default=16, help="query spacing of the old-way comparison")
    parser.add_argument("--no-old-way", action="store_true", help="skip the one-position-at-a-time comparison")
    parser.add_argument("--last-query-len", type=int, default=1024, help="tokens of the every-N / random window")
    from roofline import (
        add_allocator_flag,
        allocator_line,
        cpu_line,
        every_query_gram_macs,
        every_query_macs,
        floor_line,
        matmul_macs_per_second,
    )

    add_allocator_flag(parser)
    args = parser.parse_args()
    import tl_geometry as tlg

    allocator = allocator_line(args.keep_freed_memory)

    torch.set_num_threads(args.threads)  # after the import: a count the package takes as the user's
    from tl_geometry.core.engine import dispatch, query_engine

    @contextmanager
    def screen_dtype(screen: torch.dtype, gram: bool) -> Iterator[None]:
        """The query engine's default screen set to ``screen`` and its Gram route allowed or not
        (``GRAM_COST`` infinite: never cheaper) meanwhile (``analyze`` takes neither)."""
        default, cost = query_engine.SCREEN_DTYPE, query_engine.GRAM_COST
        query_engine.SCREEN_DTYPE = screen
        query_engine.GRAM_COST = cost if gram else math.inf
        try:
            yield
        finally:
            query_engine.SCREEN_DTYPE, query_engine.GRAM_COST = default, cost

    model = tlg.load_model("smollm2-135m", device=args.device)
    tokens = tlg.corpus_tokens(model, tlg.corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len))
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(cpu_line())
    print(allocator)
    forward = forward_seconds(model, tokens)
    shape = f"{args.n_seqs} x {args.seq_len} tokens"
    print(f"forward {forward:.2f}s ({shape})", flush=True)
    seconds = {}
    lines = (
        ("fused numba pass, value product (before)", "numba", query_engine.SCREEN_DTYPE, False),
        ("fused numba pass, value product, float64 screen", "numba", torch.float64, False),
        ("fused numba pass, Gram route where cheaper (after)", "numba", query_engine.SCREEN_DTYPE, True),
    )
    for _, kernel, screen, gram in lines:  # untimed: numba compiles each kernel per dtype on its first call
        with screen_dtype(screen, gram):
            analysis_seconds(model, tokens[:, :32], kernel, query_positions="all")
    for name, kernel, screen, gram in lines:
        with screen_dtype(screen, gram):
            seconds[name], rows = analysis_seconds(model, tokens, kernel, query_positions="all")
        print(f"every query position, log grid, {name}: analysis {seconds[name]:.2f}s / forward {forward:.2f}s = "
              f"{seconds[name] / forward:.2f} [target <= 3]  ({rows} rows, load {os.getloadavg()[0]:.1f})",
              flush=True)  # fmt: skip
    before = seconds["fused numba pass, value product (before)"]
    after = seconds["fused numba pass, Gram route where cheaper (after)"]
    print(f"  Gram route where cheaper / value product: {after / before:.2f}")
    rate = matmul_macs_per_second(torch.float64)
    info = tlg.describe_model(model)
    macs = args.n_seqs * every_query_macs(args.seq_len, info.n_heads * info.n_layers, info.d_head)
    print(floor_line("every query position (float64)", macs, rate, forward))
    rate32 = matmul_macs_per_second(query_engine.SCREEN_DTYPE)  # the default screen's product
    print(floor_line("every query position (float32 screen)", macs, rate32, forward))
    gram_macs = args.n_seqs * every_query_gram_macs(args.seq_len, info.n_heads * info.n_layers)
    print(floor_line("every query position (Gram route, float64)", gram_macs, rate, forward))
    print(f"  the value product's pass is {before / (macs / rate32):.1f} x its float32 floor; the pass with "
          f"the Gram route {after / (gram_macs / rate):.1f} x the Gram route's float64 floor", flush=True)  # fmt: skip
    last_query_lines(model, args.last_query_len, rate, rate32)
    if args.no_old_way:
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
        return
    positions = slice(args.stride - 1, None, args.stride)
    engine, _ = analysis_seconds(model, tokens, query_positions=positions)
    minimum = dispatch.MIN_QUERIES_FOR_BLOCKS
    dispatch.MIN_QUERIES_FOR_BLOCKS = 1 << 62  # one position at a time, as before the query engine
    try:
        old, rows = analysis_seconds(model, tokens, query_positions=positions)
    finally:
        dispatch.MIN_QUERIES_FOR_BLOCKS = minimum
    print(f"every {args.stride}th query, float64: one position at a time {old:.2f}s / query engine {engine:.2f}s = "
          f"{old / engine:.1f}x  (forward ratios {old / forward:.2f} and {engine / forward:.2f}, {rows} rows)")  # fmt: skip
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
