"""Sink effect and head taxonomy (SPEC §5) on SmolLM2-135M (docs/taxonomy.md).

One streaming pass over ``python_docs(n_seqs, seq_len)`` (last query position, ``ns="log"``) feeds
a :class:`~tl_geometry.observers.SeparabilityObserver` and a
:class:`~tl_geometry.taxonomy.TaxonomyObserver` that keeps the two halves of the windows apart
(``parts=halves(n_seqs)``). Prints the regime counts by layer (Figure 8), the sink-effect curve
(Figure 6), the mean precision / recall per regime (Figure 11) and how many labels change
between the two halves.

    python benchmarks/taxonomy_smollm2.py                 # 16 windows of 512 tokens, ~3-4 min on 1 thread
    python benchmarks/taxonomy_smollm2.py --out /tmp/tax  # also write the tables as CSV
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

import tl_geometry as tlg
import tl_geometry.taxonomy as tx
from tl_geometry.observers import SeparabilityObserver
from tl_geometry.capture import run_streaming


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-seqs", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: shared machine)")
    parser.add_argument("--out", type=Path, default=None, help="write features, heads, sink effect, PR curves as CSV")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 30)
    pd.set_option("display.max_rows", 200)

    t0 = time.perf_counter()
    model = tlg.load_model("smollm2-135m")
    info = tlg.describe_model(model)
    t_load = time.perf_counter() - t0
    corpus = tlg.corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len)
    tokens = tlg.corpus_tokens(model, corpus, info)
    n_seqs, seq_len = tokens.shape
    query = (seq_len - 1,)
    sep_obs = SeparabilityObserver(info, "log")
    tax_obs = tx.TaxonomyObserver(info, "log", parts=tx.halves(n_seqs))
    seps = []
    t0 = time.perf_counter()
    for ids in torch.arange(n_seqs).split(args.batch_size):
        run_streaming(model, info, tokens[ids], ids, list(range(info.n_layers)), query, [sep_obs, tax_obs])
        seps.append(sep_obs.take())
    t_run = time.perf_counter() - t0
    separability = pd.concat(seps, ignore_index=True)
    features = tax_obs.features()

    print(
        f"model {info.name}: {info.n_layers} layers x {info.n_heads} heads (kv {info.n_kv_heads}), "
        f"d_head={info.d_head}; "
        f"{n_seqs} windows of {seq_len} tokens (python_docs), query = last position (L = {seq_len - 1}), ns='log'"
    )
    print(f"load {t_load:.1f} s, one streaming pass (separability + taxonomy) {t_run:.1f} s, {args.threads} thread(s)")

    heads = tx.classify_heads(features)
    print("\nthresholds:", heads.attrs["thresholds"])
    print("\n== regimes over all heads ==")
    print(heads.regime.value_counts().to_string())
    print("\n== regime counts by layer (Figure 8) ==")
    counts = pd.crosstab(heads.layer, heads.regime, dropna=False)
    print(counts.to_string())
    print("\n== what decided the label (condition setting the margin), by regime ==")
    print(pd.crosstab(heads.deciding, heads.regime).to_string())
    print("\n== condition pass rates over all heads ==")
    slacks = [c for c in heads.columns if c.startswith("slack_")]
    print((heads[slacks] >= 0).mean().round(3).to_string())
    print("\n== head features: median over heads, by layer ==")
    cols = ["c_sink", "c_last", "c_rest", "rho_0", "cos_vL_low", "cos_vL_high", "shift_v0", "shift_vL"]
    print(heads.groupby("layer")[cols].median().round(3).to_string())

    rho0 = tx.rho0_table(features)
    effect = tx.sink_effect(separability, rho0)
    print("\n== sink effect (Figure 6): corr across (layer, head) of mean recall(N) with rho_0 ==")
    print(effect.round(3).to_string(index=False))

    pr = tx.regime_pr_curves(separability, heads)
    print("\n== mean precision / recall per regime (Figure 11) ==")
    wide = pr.pivot(index="n", columns="regime", values=["precision", "recall"])
    print(wide.round(3).to_string())

    stab = tx.classification_stability(tax_obs.features(0), tax_obs.features(1))
    half = tx.halves(n_seqs)
    sizes = (sum(1 for p in half.values() if p == 0), sum(1 for p in half.values() if p == 1))
    print(f"\n== stability: windows {sizes[0]} + {sizes[1]} classified separately ==")
    print(f"labels changed: {stab.n_changed} of {stab.n_heads} heads ({stab.share_changed:.1%})")
    print(stab.transitions().to_string())
    flips = stab.table[stab.table.changed]
    if len(flips):
        margins = ["margin_a", "margin_b"]
        stable = stab.table[~stab.table.changed]
        print(f"median margin of the changed heads: {flips[margins].median().round(3).to_dict()}; "
              f"of the stable ones: {stable[margins].median().round(3).to_dict()}")

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        features.to_csv(args.out / "regime_features.csv", index=False)
        heads.to_csv(args.out / "heads.csv", index=False)
        effect.to_csv(args.out / "sink_effect.csv", index=False)
        pr.to_csv(args.out / "regime_pr_curves.csv", index=False)
        stab.table.to_csv(args.out / "stability.csv", index=False)
        print(f"\ntables written to {args.out}")


if __name__ == "__main__":
    main()
