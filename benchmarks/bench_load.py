"""Steady under load: ``tl-geometry run``'s analysis / forward ratio on this machine as it is and with
two busy processes started here, with the default threads and with one thread (issue 22).

One process, as ``tl-geometry run`` starts (freed memory kept: :mod:`tl_geometry.runtime.allocator`;
OpenMP's wait policy is the environment's), the model loaded once and one short analysis run
untimed (imports, numba's kernels); then four analyses of the command line's default job
(``CLI_PRESET``) over the same windows: as is / with ``--busy`` busy Python processes, each with
torch's default threads (the package chooses) and with ``torch.set_num_threads(1)``. The targets:

* loaded ratio <= 1.5 x the as-is ratio (default threads);
* the default never slower than one thread under load (forward and analysis, 10 % slack for noise);
* a patching pass (``patch_head_out`` of every head on a ``--patch-len``-token pair, the functions
  outside ``analyze`` that run passes) under load no slower with the default threads than with one.

"As is" is the machine as it is: on a shared machine it is not quiet, and the load averages printed
beside each run say how busy it was.

Run:  .venv/bin/python benchmarks/bench_load.py                     (2 x 512 tokens)
      .venv/bin/python benchmarks/bench_load.py --n-seqs 1 --seq-len 256 --device cuda
      PYTHONPATH=../before .venv/bin/python benchmarks/bench_load.py   (another checkout: a before/after)
      OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/bench_load.py   (sleeping idle OpenMP threads)
      .venv/bin/python benchmarks/bench_load.py --busy 1 --busy-fraction 0.5   (half a core taken)
      .venv/bin/python benchmarks/bench_load.py --patching-only   (the patching pass alone)
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time


def spin(fraction: float = 1.0) -> None:  # pragma: no cover - runs in a child process until terminated
    """Keep one CPU busy: always, or ``fraction`` of every 10 ms (then sleep the rest)."""
    while True:
        if fraction >= 1.0:
            continue
        end = time.perf_counter() + 0.01 * fraction
        while time.perf_counter() < end:
            pass
        time.sleep(0.01 * (1.0 - fraction))


def run_job(model, tokens, settings, device: str, one_thread: bool) -> dict[str, float]:
    """One analysis; its timings and the load averages around it."""
    import torch

    import tl_geometry as tlg

    before_threads = torch.get_num_threads()
    if one_thread:
        torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    try:
        result = tlg.analyze(model, tokens, settings, progress=False, device=device)
    finally:
        torch.set_num_threads(before_threads)
    t = result.timings
    return {
        "forward_s": t["forward_s"],
        "analysis_s": t["analysis_s"],
        "ratio": t["analysis_s"] / t["forward_s"],
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def run_patching(model, clean, corrupted, one_thread: bool) -> dict[str, float]:
    """One ``patch_head_out`` of every head (clean into corrupted); its time and the load averages."""
    import torch

    from tl_geometry.intervention.patching import patch_head_out

    before_threads = torch.get_num_threads()
    if one_thread:
        torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    used: list[int] = []

    def metric(logits):  # called inside the pass: the thread count it ran on
        used.append(torch.get_num_threads())
        return logits[:, -1].logsumexp(-1).mean()

    start = time.perf_counter()
    try:
        patch_head_out(model, clean, corrupted, metric)
    finally:
        torch.set_num_threads(before_threads)
    seconds = time.perf_counter() - start
    return {"patching_s": seconds, "threads": max(used), "load_before": load_before, "load_after": os.getloadavg()[0]}


def measure_patching(model, clean, corrupted, label: str) -> dict[str, dict[str, float]]:
    rows = {}
    for threads, one in (("default", False), ("1 thread", True)):
        r = run_patching(model, clean, corrupted, one)
        rows[threads] = r
        print(
            f"{label:8s} {threads:9s} patching {r['patching_s']:7.1f} s on {r['threads']} threads  "
            f"load average {r['load_before']:.1f} -> {r['load_after']:.1f}",
            flush=True,
        )
    return rows


def measure(model, tokens, settings, device: str, label: str) -> dict[str, dict[str, float]]:
    rows = {}
    for threads, one in (("default", False), ("1 thread", True)):
        r = run_job(model, tokens, settings, device, one)
        rows[threads] = r
        print(
            f"{label:8s} {threads:9s} forward {r['forward_s']:7.1f} s  analysis {r['analysis_s']:7.1f} s  "
            f"ratio {r['ratio']:5.2f}  load average {r['load_before']:.1f} -> {r['load_after']:.1f}",
            flush=True,
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n-seqs", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, ... (the busy loops use the CPU)")
    parser.add_argument("--busy", type=int, default=2, help="busy Python processes started for the loaded runs")
    parser.add_argument(
        "--busy-fraction", type=float, default=1.0, help="the share of each 10 ms that a busy process works (default 1)"
    )
    parser.add_argument("--patch-len", type=int, default=32, help="tokens of the patching pair (one sequence each)")
    parser.add_argument("--patching-only", action="store_true", help="measure the patching pass alone")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    import tl_geometry as tlg
    from tl_geometry.pipeline.settings import CLI_PRESET

    try:  # as the command line does when it starts (a checkout from before it existed has no allocator)
        from tl_geometry.runtime.allocator import keep_freed_memory
    except ImportError:
        kept = False
    else:
        kept = keep_freed_memory()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"{tlg.__file__}: tl-geometry run's default job, {args.n_seqs} x {args.seq_len} tokens, {args.device}; "
        f"{os.cpu_count()} cores ({cpus} ours), torch threads {torch.get_num_threads()}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, freed memory kept: {kept}; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    model = tlg.load_model(args.model, device=args.device)
    tokens = tlg.corpus_tokens(model, tlg.corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len))
    settings = CLI_PRESET
    # warm-up, not timed: the first analysis of a process imports the analyses and loads numba's
    # compiled kernels, which would inflate the first ("as is, default") ratio and flatter the target
    clean, corrupted = tokens[:1, : args.patch_len], tokens[-1:, -args.patch_len :]
    run_patching(model, clean[:, :8], corrupted[:, :8], one_thread=False)  # warm-up, not timed
    quiet_patching = measure_patching(model, clean, corrupted, "as is")
    if not args.patching_only:
        tlg.analyze(model, tokens[:, :32], settings, progress=False, device=args.device)
        quiet = measure(model, tokens, settings, args.device, "as is")
    # spawned, not forked: a fork shares this process's pages copy-on-write, and its next forward pass
    # would pay a page copy for each page it writes (other jobs on a machine are not forks of this one)
    spawn = multiprocessing.get_context("spawn")
    loops = [spawn.Process(target=spin, args=(args.busy_fraction,), daemon=True) for _ in range(args.busy)]
    for p in loops:
        p.start()
    time.sleep(1.0)
    try:
        loaded_patching = measure_patching(model, clean, corrupted, f"+{args.busy} busy")
        if not args.patching_only:
            loaded = measure(model, tokens, settings, args.device, f"+{args.busy} busy")
    finally:
        for p in loops:
            p.terminate()
            p.join()
    patch_d, patch_one = loaded_patching["default"]["patching_s"], loaded_patching["1 thread"]["patching_s"]
    print(
        f"patching under load, default vs one thread: {patch_d:.1f} / {patch_one:.1f} s "
        f"(as is: {quiet_patching['default']['patching_s']:.1f} / {quiet_patching['1 thread']['patching_s']:.1f} s): "
        f"{'met' if patch_d <= 1.1 * patch_one else 'NOT met'} (10 % slack)"
    )
    if args.patching_only:
        return 0
    q, d, one = quiet["default"]["ratio"], loaded["default"], loaded["1 thread"]
    steady = d["ratio"] <= 1.5 * q
    not_slower = d["forward_s"] <= 1.1 * one["forward_s"] and d["analysis_s"] <= 1.1 * one["analysis_s"]
    print(f"loaded ratio {d['ratio']:.2f} vs 1.5 x as-is ratio {1.5 * q:.2f}: {'met' if steady else 'NOT met'}")
    print(
        f"default vs one thread under load: forward {d['forward_s']:.1f} / {one['forward_s']:.1f} s, analysis "
        f"{d['analysis_s']:.1f} / {one['analysis_s']:.1f} s: {'met' if not_slower else 'NOT met'} (10 % slack)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
