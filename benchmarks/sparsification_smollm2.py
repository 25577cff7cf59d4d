"""The top-N intervention on SmolLM2-135M: loss curves, N*_5%, localised loss, geometry vs function.

    python benchmarks/sparsification_smollm2.py                       # 8 x 512 python_docs windows
    python benchmarks/sparsification_smollm2.py --n-seqs 2 --seq-len 256 --ns 1,2,4,8,16,32,64,128,256

Resumable: the curve is written to OUT/curve.json point by point (rerun the same command to go on).
Prints one JSON document (also written to OUT/summary.json) with the full NLL, the curve, N*_5%
per ranking and renormalisation, the gap at N=64 between attention and random, the
geometry-function correlations and the localised loss per layer.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import tl_geometry as tlg


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-seqs", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--ns", default="pow2", help="'pow2' or a comma list")
    parser.add_argument("--out", default="runs/sparsify_smollm2")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--local-n", type=int, default=8)
    parser.add_argument("--no-local", action="store_true")
    parser.add_argument("--no-refine", action="store_true")
    parser.add_argument("--renormalize", default="both", choices=("both", "deletion", "renormalize"))
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, mps")
    args = parser.parse_args()
    ns = "pow2" if args.ns == "pow2" else [int(x) for x in args.ns.split(",")]
    out = Path(args.out)
    start = time.perf_counter()
    model = tlg.load_model("smollm2-135m", device=args.device)
    corpus = tlg.corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len)
    flags = {"both": (False, True), "deletion": (False,), "renormalize": (True,)}[args.renormalize]
    curve = tlg.sparsification_curve(model, corpus, ns=ns, renormalize=flags, batch_size=args.batch_size, out_dir=out)
    n_star = curve.effective_set_size(tolerance=0.05, refine=not args.no_refine)
    n_star_grid = curve.effective_set_size(tolerance=0.05, refine=False)
    grid_ns = sorted(set(curve.table[curve.table.stage == "grid"].n))
    result = tlg.analyze(
        model,
        corpus,
        ns=[n for n in grid_ns if n <= args.seq_len],
        rank_by=("attention", "contribution", "random", "sink_window"),
        taxonomy=False,
        batch_size=args.batch_size,
        out_dir=out / "analysis",
    )
    over_n = tlg.geometry_vs_function(result, curve)
    summary = {
        "command_args": vars(args),
        "nll_full": curve.nll_full,
        "curve": curve.table.to_dict(orient="records"),
        "n_star_refined": n_star.astype({"n_star": "float"}).to_dict(orient="records"),
        "n_star_grid": n_star_grid.astype({"n_star": "float"}).to_dict(orient="records"),
        "geometry_vs_function_over_n": over_n.to_dict(orient="records"),
        "f_by_rank_by": result.separability.groupby(["rank_by", "n"])[["precision", "recall", "f_at_rmax", "f_at_rmin"]]
        .mean()
        .reset_index()
        .to_dict(orient="records"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if not args.no_local:
        local = tlg.localized_loss(model, corpus, n=args.local_n, unit="layer", batch_size=args.batch_size)
        local.to_csv(out / "local_layer.csv", index=False)
        summary["localized_layer"] = local.to_dict(orient="records")
        summary["geometry_vs_function_across_layers"] = tlg.geometry_vs_function(result, local).to_dict(
            orient="records"
        )
    summary["seconds"] = time.perf_counter() - start
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
