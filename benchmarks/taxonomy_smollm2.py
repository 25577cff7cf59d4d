"""Sink effect and head taxonomy (definitions §5) on SmolLM2-135M (docs/taxonomy.md).

One streaming pass over ``python_docs(n_seqs, seq_len)`` (last query position, ``ns="log"``) feeds
a :class:`~tl_geometry.capture.observers.SeparabilityObserver` and a
:class:`~tl_geometry.taxonomy.TaxonomyObserver` that keeps the two halves of the windows apart
(``parts=halves(n_seqs)``). Prints, for both rule modes (strict and nearest), the regime counts by
layer (Figure 8) and how many labels change between the two halves; the sink-effect curve
(Figure 6), the mean precision / recall per regime (Figure 11); the k-means clusters of the heads
(silhouette per k, ARI of k = 3 with both modes); and the function by regime: the loss change
of mean-ablating each head and the localised loss of each head (its attention restricted to the
top ``--localized-n`` keys, everything else full; both on ``--ablation-seqs`` windows of
``--ablation-len`` tokens), with bootstrap intervals and a Kruskal-Wallis test.

    python benchmarks/taxonomy_smollm2.py                 # 16 windows of 512 tokens: ~2 min, + ~30 min mean-ablation
    python benchmarks/taxonomy_smollm2.py --ablation-seqs 0   # without the mean-ablation and the localised loss
    python benchmarks/taxonomy_smollm2.py --localized-n 0     # without the localised loss
    python benchmarks/taxonomy_smollm2.py --out runs/tax  # also write the tables as CSV
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

import tl_geometry as tlg
import tl_geometry.taxonomy as tx
from tl_geometry.capture.hooks import run_streaming
from tl_geometry.capture.observers import SeparabilityObserver


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-seqs", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: shared machine)")
    parser.add_argument("--ablation-seqs", type=int, default=4, help="windows of the mean-ablation (0: skip it)")
    parser.add_argument("--ablation-len", type=int, default=256, help="tokens per window of the mean-ablation")
    parser.add_argument(
        "--localized-n", type=int, default=8, help="keys kept per query in the localised loss (0: skip it)"
    )
    parser.add_argument("--out", type=Path, default=None, help="write features, heads, sink effect, PR curves as CSV")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, mps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 30)
    pd.set_option("display.max_rows", 200)

    t0 = time.perf_counter()
    model = tlg.load_model("smollm2-135m", device=args.device)
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
    for mode in ("strict", "nearest"):
        labels = heads[f"regime_{mode}"]
        print(f"\n== {mode}: regimes over all heads ==")
        print(labels.value_counts().to_string())
        print(f"Unclassified share: {(labels == 'Unclassified').mean():.1%}")
        print(f"\n== {mode}: regime counts by layer (Figure 8) ==")
        print(pd.crosstab(heads.layer, labels, dropna=False).to_string())
    print("\n== candidate (order of c_sink, c_last, c_rest) against the strict label ==")
    print(pd.crosstab(heads.candidate.fillna("none"), heads.regime_strict).to_string())
    print("\n== what decided the strict label (condition setting the margin), by regime ==")
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

    half = tx.halves(n_seqs)
    sizes = (sum(1 for p in half.values() if p == 0), sum(1 for p in half.values() if p == 1))
    stabs = {}
    for mode in ("strict", "nearest"):
        stab = stabs[mode] = tx.classification_stability(tax_obs.features(0), tax_obs.features(1), mode=mode)
        print(f"\n== stability ({mode}): windows {sizes[0]} + {sizes[1]} classified separately ==")
        print(f"labels changed: {stab.n_changed} of {stab.n_heads} heads ({stab.share_changed:.1%})")
        print(stab.transitions().to_string())
        flips = stab.table[stab.table.changed]
        if len(flips):
            margins = ["margin_a", "margin_b"]
            stable = stab.table[~stab.table.changed]
            print(
                f"median margin of the changed heads: {flips[margins].median().round(3).to_dict()}; "
                f"of the stable ones: {stable[margins].median().round(3).to_dict()}"
            )

    t0 = time.perf_counter()
    clusters = tlg.regime_clusters(features, k=range(2, 7), seed=0)
    print(f"\n== k-means on the standardised Figure 7 features ({time.perf_counter() - t0:.1f} s) ==")
    print(clusters.silhouette.round(3).to_string(index=False))
    print(
        f"best k {clusters.best_k}; has_structure (silhouette >= {tx.STRUCTURE_SILHOUETTE}): {clusters.has_structure}"
    )
    print(clusters.agreement.round(3).to_string(index=False))
    for mode, table in clusters.contingency.items():
        print(f"\ncontingency, {mode} labels x k=3 clusters:")
        print(table.to_string())

    ablation = local = None
    if args.ablation_seqs > 0:
        ab_corpus = tlg.corpus.python_docs(n_seqs=args.ablation_seqs, seq_len=args.ablation_len)
        ab_tokens = tlg.corpus_tokens(model, ab_corpus, info)
        t0 = time.perf_counter()
        ablation = tlg.intervention.patching.mean_ablation(model, ab_tokens)
        print(
            f"\n== mean-ablation of each head: {tuple(ab_tokens.shape)} tokens, "
            f"{time.perf_counter() - t0:.0f} s; clean loss {ablation.loss_clean.iloc[0]:.4f} nats =="
        )
        for mode in ("strict", "nearest"):
            for column in ("delta_loss", "rel_delta"):
                fn = tlg.regime_function(features, ablation[["layer", "head", column]], heads=heads, mode=mode,
                                         value=column)  # fmt: skip
                print(f"\n{mode} labels, {column} (mean and 95 % bootstrap interval of the mean):")
                print(fn.table.round(5).to_string(index=False))
                print(f"Kruskal-Wallis H = {fn.statistic:.3f}, p = {fn.pvalue:.4f}")
        if args.localized_n > 0:
            t0 = time.perf_counter()
            local = tlg.localized_loss(model, ab_tokens, n=args.localized_n, unit="head", progress=False)
            print(
                f"\n== localised loss of each head (top-{args.localized_n} attention, deletion): "
                f"{time.perf_counter() - t0:.0f} s; full loss {local.nll_full.iloc[0]:.4f} nats =="
            )
            for mode in ("strict", "nearest"):
                fn = tlg.regime_function(features, local, heads=heads, mode=mode)
                print(f"\n{mode} labels, delta_nll_rel (mean and 95 % bootstrap interval of the mean):")
                print(fn.table.round(5).to_string(index=False))
                print(f"Kruskal-Wallis H = {fn.statistic:.3f}, p = {fn.pvalue:.4f}")
            both = ablation.merge(local[["layer", "head", "delta_nll_rel"]], on=["layer", "head"])
            rho = both[["rel_delta", "delta_nll_rel"]].corr(method="spearman").iloc[0, 1]
            print(f"Spearman across heads, mean-ablation rel_delta vs localised delta_nll_rel: {rho:.3f}")

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        features.to_csv(args.out / "regime_features.csv", index=False)
        heads.to_csv(args.out / "heads.csv", index=False)
        effect.to_csv(args.out / "sink_effect.csv", index=False)
        pr.to_csv(args.out / "regime_pr_curves.csv", index=False)
        for mode, stab in stabs.items():
            stab.table.to_csv(args.out / f"stability_{mode}.csv", index=False)
        clusters.labels.to_csv(args.out / "clusters.csv", index=False)
        if ablation is not None:
            ablation.to_csv(args.out / "mean_ablation.csv", index=False)
        if local is not None:
            local.to_csv(args.out / "localized_loss.csv", index=False)
        print(f"\ntables written to {args.out}")


if __name__ == "__main__":
    main()
