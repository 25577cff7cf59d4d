"""Circuit head types beside the regimes on SmolLM2-135M (docs/head_types.md).

1. The regimes (strict and nearest) of ``python_docs(n_seqs, seq_len)`` at the last query, and of
   ``--n-seqs`` repeated random token sequences (``BOS + r + r``, ``r`` of ``(seq_len - 1) // 2``
   tokens), and their agreement (``regime_agreement``).
2. The head-type scores (``head_types``: previous-token, duplicate-token, induction, current-token)
   on repeated random tokens (``--half-len``), joined to the Python-docs regimes; the cross-table
   of regimes against head types in both modes; the typed heads with their labels.
3. The mean attention of the last query on its own position, per Python-docs regime.

Run:  HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python benchmarks/head_types_smollm2.py [--n-seqs 8 --seq-len 256] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pandas as pd
import torch

import tl_geometry as tlg
from tl_geometry.corpus import from_tokens
from tl_geometry.taxonomy.head_types import head_type_crosstab, head_types, regime_agreement, repeated_random_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-seqs", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--half-len", type=int, default=64, help="half length of the head-type sequences")
    parser.add_argument("--threshold", type=float, default=0.4)
    parser.add_argument("--no-random", action="store_true", help="skip the regimes of repeated random tokens")
    parser.add_argument("--out", type=Path, default=None, help="write the joined table as CSV here")
    args = parser.parse_args()
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 300)
    t0 = time.perf_counter()
    model = tlg.load_model("smollm2-135m")
    docs = tlg.analyze(model, tlg.corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len), progress=False)
    heads_docs = docs.classify_heads()
    if not args.no_random:
        random_tokens = repeated_random_tokens(model, args.n_seqs, (args.seq_len - 1) // 2, seed=1)
        rand = tlg.analyze(model, from_tokens(random_tokens, name="repeated random"), progress=False)
        heads_rand = rand.classify_heads()
        print(f"analyze x2: {time.perf_counter() - t0:.0f} s, load {os.getloadavg()}")
        print("\n== regime agreement: python docs vs repeated random tokens ==")
        print(regime_agreement(heads_docs, heads_rand).to_string(index=False))
        for mode in ("strict", "nearest"):
            print(f"\n{mode}: python docs (rows) vs repeated random (columns)")
            print(pd.crosstab(heads_docs[f"regime_{mode}"], heads_rand[f"regime_{mode}"]).to_string())
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            heads_rand[["layer", "head", "regime_strict", "regime_nearest"]].to_csv(
                args.out / "regimes_random.csv", index=False
            )

    t0 = time.perf_counter()
    table = head_types(model, heads_docs, n_seqs=args.n_seqs, half_len=args.half_len, threshold=args.threshold)
    print(f"\nhead_types: {time.perf_counter() - t0:.0f} s, load {os.getloadavg()}")
    scores = [c for c in table.columns if c.endswith("_score")]
    for mode in ("strict", "nearest"):
        print(f"\n== regimes ({mode}) against head types (threshold {args.threshold}) ==")
        print(head_type_crosstab(table, mode).to_string())
    typed = table[table.head_type != "none"].copy()
    typed["name"] = [f"L{a}H{h}" for a, h in zip(typed["layer"], typed["head"])]
    print("\n== typed heads ==")
    print(typed[["name", "head_type", *scores, "regime_strict", "regime_nearest"]].round(3).to_string(index=False))
    print("\n== top 10 heads per score ==")
    for column in scores:
        top = table.nlargest(10, column)
        print(
            column,
            ", ".join(
                f"L{a}H{h} {v:.2f} ({r})"
                for a, h, v, r in zip(top["layer"], top["head"], top[column], top["regime_strict"])
            ),
        )

    # attention of the last query on its own position, per regime, on the Python-docs windows
    tokens = docs.tokens
    info = tlg.describe_model(model)
    names = {f"blocks.{layer}.attn.hook_pattern" for layer in range(info.n_layers)}
    self_attn = torch.zeros(info.n_layers, info.n_heads, dtype=torch.float64)
    for batch in tokens.split(4):
        with torch.inference_mode():
            _, cache = model.run_with_cache(batch, names_filter=lambda name: name in names)
        for layer in range(info.n_layers):
            self_attn[layer] += cache[f"blocks.{layer}.attn.hook_pattern"][:, :, -1, -1].double().sum(0)
    self_attn /= len(tokens)
    heads_docs["last_query_self"] = self_attn.flatten().numpy()
    for mode in ("strict", "nearest"):
        print(f"\n== mean attention of the last query on itself, by regime ({mode}) ==")
        print(
            heads_docs.groupby(f"regime_{mode}", observed=False)
            .last_query_self.agg(["count", "mean", "median"])
            .round(3)
            .to_string()
        )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        table.merge(heads_docs[["layer", "head", "last_query_self"]], on=["layer", "head"]).to_csv(
            args.out / "head_types.csv", index=False
        )
    print(f"\ndone, load {os.getloadavg()}")


if __name__ == "__main__":
    main()
