"""Peak memory of rank 0 under ``torchrun --nproc-per-node=2`` (gloo, CPU), at two numbers of windows.

Each rank writes its rows to its own store; rank 0 merges the stores from disk one range of windows
at a time, and the tables, head labels, summary and report that follow read the merged rows in
batches (``AnalysisResult.separability_sums``), so rank 0's peak RSS over the whole
``tl-geometry run`` should not grow with the number of windows (target: growth from ``--windows 8``
to ``64`` <= 100 MiB, at exit). Rank 0's peak RSS (``ru_maxrss``) up to the end of the merge and at
exit is written by a ``sitecustomize`` hook that this benchmark puts on ``PYTHONPATH``; the package
carries no hook. The load average is printed beside each run: compare growths within one run.

The default model is a random LLaMA with SmolLM2's heads but 2 layers and ``d_head = 8`` (saved to
a temporary folder, no download), with every query position of ``--seq-len`` tokens and the CLI's
default tables, so each window adds tens of thousands of rows; ``--model smollm2-135m`` runs the
real model.

``--query-all 128,256`` instead runs one process per length, ``tl-geometry run --n-seqs 1
--query all --rank-by attention --no-bounds --no-diagnostics`` (the run of issue 47), and compares its
peak RSS beyond the loaded model with the memory the run is checked against before it starts
(:func:`tl_geometry.pipeline.plan.run_memory`, what ``TL_GEOMETRY_MEMORY_BUDGET`` bounds): the
estimate must cover the peak.

Run:  python benchmarks/bench_memory.py                   (a few minutes on 2 shared cores)
      python benchmarks/bench_memory.py --windows 8,64 --seq-len 128
      python benchmarks/bench_memory.py --query-all 128,256,512
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Target of issue 22: rank 0's whole-run peak RSS grows by at most this much from 8 to 64 windows.
TARGET_MIB = 100

HOOK = """
import atexit, os, resource
if os.environ.get("RANK") == "0" and os.environ.get("TLG_BENCH_RSS_FILE"):
    import tl_geometry.pipeline.torchrun as _torchrun
    _peaks = {}
    _run_sharded = _torchrun.run_sharded
    def run_sharded(*args, **kwargs):
        result = _run_sharded(*args, **kwargs)
        _peaks["merged"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        return result
    _torchrun.run_sharded = run_sharded
    def _write():
        _peaks["exit"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with open(os.environ["TLG_BENCH_RSS_FILE"], "w") as f:
            f.write(f"{_peaks.get('merged', -1)} {_peaks['exit']}")
    atexit.register(_write)
"""


QUERY_ALL_HOOK = """
import atexit, os, resource, psutil
if os.environ.get("TLG_BENCH_RSS_FILE"):
    import tl_geometry, tl_geometry.pipeline.plan as _plan
    _seen = {}
    _load = tl_geometry.load_model
    def load_model(*args, **kwargs):
        model = _load(*args, **kwargs)
        _seen["after_load"] = psutil.Process().memory_info().rss // 1024
        return model
    tl_geometry.load_model = load_model
    _check = _plan.check_run_memory
    def check_run_memory(*args):
        _seen.setdefault("estimate", _plan.run_memory(*args)[0] // 1024)
        return _check(*args)
    _plan.check_run_memory = check_run_memory
    def _write():
        _seen["peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with open(os.environ["TLG_BENCH_RSS_FILE"], "w") as f:
            f.write(" ".join(str(_seen.get(k, -1)) for k in ("after_load", "peak", "estimate")))
    atexit.register(_write)
"""


def query_all_peak(model: str, seq_len: int, work: Path) -> dict[str, float]:
    """Peak RSS beyond the loaded model of one ``run --query all`` of one window, and its estimate (MiB)."""
    rss_file, out = work / f"rss-all-{seq_len}.txt", work / f"run-all-{seq_len}"
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(work / "hook-all"), str(REPO), env.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TLG_BENCH_RSS_FILE=str(rss_file),
    )
    command = [sys.executable, "-m", "tl_geometry", "run", "--model", model, "--n-seqs", "1", "--seq-len", str(seq_len)]
    command += ["--query", "all", "--rank-by", "attention", "--no-bounds", "--no-diagnostics", "--no-progress"]
    proc = subprocess.run([*command, "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    after_load, peak, estimate = (int(x) / 1024 for x in rss_file.read_text().split())
    return {
        "after_load_mib": after_load,
        "peak_mib": peak,
        "beyond_load_mib": peak - after_load,
        "estimate_mib": estimate,
    }


def random_llama(folder: Path) -> Path:
    """A random LLaMA with SmolLM2-135M's heads (9 heads, 3 kv heads) but d_head 8 and 2 layers: the
    rows per window are SmolLM2's per layer, the forward pass far cheaper."""
    import torch
    import transformers

    from tl_geometry.testing import byte_tokenizer

    torch.manual_seed(0)
    tokenizer = byte_tokenizer()
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=72,
        intermediate_size=144,
        num_hidden_layers=2,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        attn_implementation="eager",
    )
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def peak_rss_mib(model: str, n_windows: int, seq_len: int, batch_size: int, work: Path) -> tuple[float, float, int]:
    """Rank 0's peak RSS (MiB) up to the end of the merge and up to its exit (tables, head labels and
    report included), and the run's rows, for one torchrun run of ``n_windows`` windows."""
    rss_file = work / f"rss-{n_windows}.txt"
    out = work / f"run-{n_windows}"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(work / "hook"), str(REPO), env.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TLG_BENCH_RSS_FILE=str(rss_file),
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += ["--log-dir", str(work / "torchrun-logs")]  # not a torchelastic_* folder left in /tmp
    command += ["-m", "tl_geometry", "run", "--model", model, "--n-seqs", str(n_windows), "--seq-len", str(seq_len)]
    command += ["--query-stride", "1", "--batch-size", str(batch_size), "--no-progress", "--out", str(out)]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"torchrun failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    import pyarrow.parquet as pq

    rows = pq.read_metadata(out / "separability.parquet").num_rows
    merged, at_exit = (int(x) / 1024 for x in rss_file.read_text().split())
    return merged, at_exit, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", default="8,64", help="two numbers of windows (default 8,64)")
    parser.add_argument("--seq-len", type=int, default=32, help="tokens per window (default 32)")
    parser.add_argument("--batch-size", type=int, default=4, help="windows per batch (default 4)")
    parser.add_argument("--model", default=None, help="a model for --model (default: a random 2-layer LLaMA)")
    parser.add_argument("--query-all", default=None, help="window lengths of the --query all runs (e.g. 128,256)")
    args = parser.parse_args()
    if args.query_all:
        main_query_all(args)
        return
    counts = [int(w) for w in args.windows.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "hook").mkdir()
        (work / "hook" / "sitecustomize.py").write_text(HOOK)
        model = args.model or str(random_llama(work / "model"))
        results = {}
        for n in counts:
            merged, at_exit, rows = peak_rss_mib(model, n, args.seq_len, args.batch_size, work)
            load = os.getloadavg()
            results[n] = {"peak_merged_mib": round(merged, 1), "peak_exit_mib": round(at_exit, 1), "rows": rows}
            results[n]["load_average"] = load
            print(f"{n:4d} windows, {rows} rows: rank 0 peak RSS {merged:7.1f} MiB through the merge, "
                  f"{at_exit:7.1f} MiB at exit (load {load[0]:.1f})")  # fmt: skip
    first, last = results[counts[0]], results[counts[-1]]
    growth = last["peak_merged_mib"] - first["peak_merged_mib"]
    growth_exit = last["peak_exit_mib"] - first["peak_exit_mib"]
    met = "met" if growth_exit <= TARGET_MIB else "NOT met"
    print(f"growth {counts[0]} -> {counts[-1]} windows through the merge: {growth:+.1f} MiB")
    print(
        f"growth {counts[0]} -> {counts[-1]} windows, whole run (tables, head labels, summary, report): "
        f"{growth_exit:+.1f} MiB (target <= {TARGET_MIB} MiB: {met})"
    )
    summary = {"windows": results, "growth_mib": round(growth, 1), "growth_exit_mib": round(growth_exit, 1)}
    print(json.dumps({**summary, "model": args.model or "random-llama-2l"}))


def main_query_all(args: argparse.Namespace) -> None:
    """``--query-all``: each length's peak beyond the loaded model against the estimate checked before the run."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "hook-all").mkdir()
        (work / "hook-all" / "sitecustomize.py").write_text(QUERY_ALL_HOOK)
        model = args.model or str(random_llama(work / "model"))
        for seq_len in [int(x) for x in args.query_all.split(",")]:
            r = query_all_peak(model, seq_len, work)
            load = os.getloadavg()[0]
            covered = "covered" if r["beyond_load_mib"] <= r["estimate_mib"] else "NOT covered"
            print(f"--seq-len {seq_len:5d} --query all: peak RSS {r['peak_mib']:7.1f} MiB, {r['beyond_load_mib']:7.1f} MiB "
                  f"beyond the loaded model; estimate {r['estimate_mib']:7.1f} MiB ({covered}; load {load:.1f})")  # fmt: skip
            results[seq_len] = {**{k: round(v, 1) for k, v in r.items()}, "load_average": load}
    print(json.dumps({"query_all": results, "model": args.model or "random-llama-2l"}))


if __name__ == "__main__":
    main()
