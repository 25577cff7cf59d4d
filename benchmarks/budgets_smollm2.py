"""Per-head budgets on SmolLM2-135M: rules compared at equal mean budget on held-out windows.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python benchmarks/budgets_smollm2.py --seq-len 128 --rules uniform,geometry,streaming

Budgets are chosen on the first ``--n-seqs`` python_docs windows and evaluated on the next
``--n-seqs`` (one forward pass per rule and B). Resumable: every point goes to OUT/budgets.json
(rerun the same command to go on). Prints the table (also OUT/budgets.csv) and the load average.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

import tl_geometry as tlg
from tl_geometry.competition import evaluate_budgets
from tl_geometry.corpus import from_tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-seqs", type=int, default=8, help="windows to choose on, and as many to evaluate on")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--budgets", default="4,8,16,32", help="comma list of mean budgets B")
    parser.add_argument("--rules", default="uniform,geometry,streaming")
    parser.add_argument("--out", default="runs/budgets_smollm2")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model = tlg.load_model("smollm2-135m")
    tokens = tlg.corpus_tokens(model, tlg.corpus.python_docs(n_seqs=2 * args.n_seqs, seq_len=args.seq_len))
    choose, held_out = from_tokens(tokens[: args.n_seqs]), from_tokens(tokens[args.n_seqs :])
    means = [float(b) for b in args.budgets.split(",")]
    rules = args.rules.split(",")
    chosen = []
    for rule in rules:
        start = time.time()
        chosen += tlg.head_budgets(model, choose, mean_budget=means, rule=rule, progress=False)
        print(f"{rule}: chosen in {time.time() - start:.0f} s, load {os.getloadavg()}", flush=True)
    chosen.sort(key=lambda b: (b.mean_budget, rules.index(b.rule)))
    start = time.time()
    table = evaluate_budgets(model, held_out, chosen, out_dir=args.out)
    print(f"evaluated in {time.time() - start:.0f} s, load {os.getloadavg()}")
    table.to_csv(Path(args.out) / "budgets.csv", index=False)
    print(table.to_string())


if __name__ == "__main__":
    main()
