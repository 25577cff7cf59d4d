"""The floor of a separability benchmark: the multiply-adds its definition needs, at the machine's
measured matrix-product throughput (a roofline).

Every metric of a row needs ``<v_i, s(N)>`` for each key ``i`` and size ``N`` of its grid: ``K G d``
multiply-adds per row (``G`` sizes, ``d`` value dimensions), and ``D`` times that for ``D`` random
draws. No engine can do less than these products; the floor is their count over the throughput of
one large float64 (or float32) matrix product on the same threads. The denominator of every
ratio, the plain forward pass, is timed here too (:func:`forward_seconds`), and so is one call of
a function (:func:`best_of`): one copy of each for every benchmark.
"""

from __future__ import annotations

import platform
import time

import torch

from tl_geometry.core.sizes import log_spaced_ns


def best_of(repeat: int, function, *args, warm_up: bool = False, **kwargs):
    """The best wall time of ``repeat`` calls of ``function(*args, **kwargs)``, and the last result.

    ``warm_up``: one untimed call first (a kernel compiled or a cache filled on its first call).
    """
    if warm_up:
        function(*args, **kwargs)
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = function(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    return best, result


def synchronize() -> None:
    """Wait for the GPU's queued work (a no-op on the CPU), so that the timers see all of it."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def forward_seconds(model, tokens: torch.Tensor, batch_size: int = 1, repeats: int = 2) -> float:
    """Plain forward over all windows, ``batch_size`` at a time: per batch, the best of ``repeats``
    passes (after an untimed 8-token warm-up), summed; the tokens go to the model's device first."""
    total = 0.0
    tokens = tokens.to(next(model.parameters()).device)
    with torch.inference_mode():
        model(tokens[:1, :8])  # warm-up
        for b0 in range(0, tokens.shape[0], batch_size):
            best = float("inf")
            for _ in range(repeats):
                synchronize()
                start = time.perf_counter()
                model(tokens[b0 : b0 + batch_size])
                synchronize()
                best = min(best, time.perf_counter() - start)
            total += best
    return total


def matmul_macs_per_second(dtype: torch.dtype, size: int = 512, repeats: int = 5) -> float:
    """Multiply-adds per second of a ``[3, size, 64] @ [3, 64, 8 size]`` product (the engine's shape)
    in ``dtype``, the best of ``repeats``."""
    a = torch.randn(3, size, 64, dtype=dtype)
    b = torch.randn(3, 64, 8 * size, dtype=dtype)
    best, _ = best_of(repeats, torch.bmm, a, b, warm_up=True)
    return a.numel() * b.shape[-1] / best


def cpu_line() -> str:
    """The processor and its widest vector extensions: the ratios of a benchmark depend on them (a
    forward pass gains more from AVX-512 than the engines' compiled passes), so quote them with it."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:  # not Linux: the model name alone
        pass
    vectors = [name for name in ("avx512f", "avx2", "avx", "fma", "neon", "asimd") if name in flags]
    return f"CPU: {model}; vector extensions: {' '.join(vectors) or 'unknown'}"


def add_allocator_flag(parser) -> None:
    """``--keep-freed-memory``: measure with glibc keeping freed blocks, as ``tl-geometry`` runs."""
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="glibc keeps freed blocks, as tl-geometry's own process does (tl_geometry.runtime.allocator); "
        "the forward pass is faster, so every ratio to it is higher",
    )


def allocator_line(keep: bool) -> str:
    """Keep freed memory where asked (:func:`tl_geometry.runtime.allocator.keep_freed_memory`); says which
    allocator runs, and pyarrow's pool (its own, mimalloc or jemalloc, or ``system``: ``malloc``)."""
    import pyarrow

    from tl_geometry.runtime.allocator import keep_freed_memory

    kept = keep and keep_freed_memory()
    line = "allocator: freed memory kept (as the command line runs)" if kept else "allocator: glibc's default"
    line += " (could not keep freed memory here)" if keep and not kept else ""
    return f"{line}; pyarrow's pool: {pyarrow.default_memory_pool().backend_name}"


def every_query_macs(seq_len: int, n_rows_per_query: int, d: int) -> int:
    """``sum_q (q + 1) G(q + 1) d`` over every query ``q`` of a window (log grid), times the rows
    (heads x layers) of each query."""
    return n_rows_per_query * d * sum(k * len(log_spaced_ns(k)) for k in range(1, seq_len + 1))


def every_query_gram_macs(seq_len: int, n_rows_per_query: int) -> int:
    """``sum_q (q + 1)^2`` over every query ``q`` of a window, times the rows of each query: the Gram
    route's running sums (``K`` multiply-adds per key and row, for all its sizes together)."""
    return n_rows_per_query * sum(k * k for k in range(1, seq_len + 1))


def last_query_macs(seq_len: int, n_rows: int, d: int, sizes: int, draws: int = 1) -> int:
    """``K G d D`` for the last query's row of ``n_rows`` heads (x layers)."""
    return n_rows * seq_len * sizes * d * draws


def floor_line(name: str, macs: int, rate: float, forward: float) -> str:
    seconds = macs / rate
    return (
        f"  floor of {name}: {macs / 1e9:.1f} G multiply-adds / {rate / 1e9:.1f} G/s = {seconds:.2f}s "
        f"= {seconds / forward:.2f} x forward"
    )
