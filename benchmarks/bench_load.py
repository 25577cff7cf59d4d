"""Steady under load: ``tl-geometry run``'s analysis / forward ratio on this machine as it is and with
two busy processes started here, with the default threads and with one thread (issue 22).

Each of the four runs is the real command line in a fresh process (``python -m tl_geometry run
... --no-progress``), its timings read from its ``run.json``. The targets:

* loaded ratio <= 1.5 x quiet ratio (default threads);
* the default never slower than ``OMP_NUM_THREADS=1`` under load (forward and analysis, 10 % slack
  for noise).

"Quiet" is the machine as it is: on a shared machine it is not quiet, and the load averages printed
beside each run say how busy it was.

Run:  .venv/bin/python benchmarks/bench_load.py                     (2 x 512 tokens, about 5 minutes on 2 quiet cores)
      .venv/bin/python benchmarks/bench_load.py --n-seqs 1 --seq-len 256 --device cuda
      .venv/bin/python benchmarks/bench_load.py --source ../main-before           (the same job, another checkout)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def spin() -> None:  # pragma: no cover - runs in a child process until terminated
    while True:
        pass


def run_job(args: argparse.Namespace, one_thread: bool, out: Path) -> dict[str, float]:
    """One ``tl-geometry run`` in a fresh process; its timings and the load averages around it."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join([str(args.source), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("HF_HUB_OFFLINE", "1")
    if one_thread:
        env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "tl_geometry", "run", "--model", args.model, "--n-seqs", str(args.n_seqs)]
    command += ["--seq-len", str(args.seq_len), "--device", args.device, "--out", str(out), "--force"]
    command += ["--no-progress"]
    load_before = os.getloadavg()[0]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"tl-geometry run failed ({done.returncode}):\n{done.stderr[-2000:]}")
    timings = json.loads((out / "run.json").read_text())["timings"]
    return {
        "forward_s": timings["forward_s"],
        "analysis_s": timings["analysis_s"],
        "ratio": timings["analysis_s"] / timings["forward_s"],
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def measure(args: argparse.Namespace, label: str, work: Path) -> dict[str, dict[str, float]]:
    rows = {}
    for threads, one in (("default", False), ("1 thread", True)):
        r = run_job(args, one, work / f"{label}-{threads.replace(' ', '')}")
        rows[threads] = r
        print(
            f"{label:7s} {threads:9s} forward {r['forward_s']:7.1f} s  analysis {r['analysis_s']:7.1f} s  "
            f"ratio {r['ratio']:5.2f}  load average {r['load_before']:.1f} -> {r['load_after']:.1f}",
            flush=True,
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n-seqs", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, ... (the busy loops use the CPU)")
    parser.add_argument(
        "--source",
        type=Path,
        default=REPO,
        help="the checkout whose tl_geometry runs (default this one; another for a before/after)",
    )
    parser.add_argument("--busy", type=int, default=2, help="busy Python loops started for the loaded runs")
    args = parser.parse_args()
    print(
        f"{args.source}: tl-geometry run --n-seqs {args.n_seqs} --seq-len {args.seq_len} --device {args.device}; "
        f"{os.cpu_count()} cores, {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'} "
        f"ours; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench_load_") as tmp:
        work = Path(tmp)
        quiet = measure(args, "as is", work)
        loops = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
        for p in loops:
            p.start()
        time.sleep(1.0)
        try:
            loaded = measure(args, f"+{args.busy} busy", work)
        finally:
            for p in loops:
                p.terminate()
                p.join()
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
