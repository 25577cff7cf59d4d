"""Assumption diagnostics (definitions §3; paper Figures 2-4) of SmolLM2-135M on the embedded corpus.

Streams :class:`tl_geometry.diagnostics.DiagnosticsObserver` through
:func:`tl_geometry.capture.hooks.run_streaming` over ``python_docs(n_seqs, seq_len)`` (query = the
last position), then prints the distribution over (layer, kv_head) pairs of ``sink_ratio``,
``norm_cv``, ``beta``, ``mae``, ``share_negative``, ``rho_0`` (the exponential refitted on
``k = 1..k_fit`` for several ``k_fit`` from one ``c(k)`` curve), and over (layer, head) pairs of
the attention-profile fit. Numbers are quoted in docs/diagnostics.md.

    python benchmarks/diagnostics_smollm2.py                 # ~1-2 minutes on 1 CPU thread
    python benchmarks/diagnostics_smollm2.py --out runs/diag # also writes the six tables (parquet)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

import tl_geometry as tlg
from tl_geometry.capture.hooks import run_streaming
from tl_geometry.diagnostics import DiagnosticsObserver

QUANTILES = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]


def describe(table: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Mean, std and quantiles of ``columns`` (one row per column)."""
    rows = {}
    for col in columns:
        x = table[col].astype(float)
        stats = {"n": int(x.notna().sum()), "mean": x.mean(), "std": x.std()}
        stats.update({f"q{int(q * 100):02d}": x.quantile(q) for q in QUANTILES})
        rows[col] = stats
    return pd.DataFrame(rows).T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-seqs", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--k-max", type=int, default=256, help="lags accumulated (fits use k_fit <= k_max)")
    parser.add_argument("--k-fits", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: shared machine)")
    parser.add_argument("--out", type=Path, default=None, help="directory for the tables (parquet)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, mps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 30)

    t0 = time.perf_counter()
    model = tlg.load_model("smollm2-135m", device=args.device)
    t_load = time.perf_counter() - t0
    info = tlg.describe_model(model)
    corpus = tlg.corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len)
    tokens = tlg.corpus_tokens(model, corpus, info)
    query = (tokens.shape[1] - 1,)
    observer = DiagnosticsObserver(info, k_max=args.k_max)
    observe_s = 0.0

    def add_time(seconds: float) -> None:
        nonlocal observe_s
        observe_s += seconds

    t0 = time.perf_counter()
    for ids in torch.arange(tokens.shape[0]).split(args.batch_size):
        run_streaming(model, info, tokens[ids], ids, list(range(info.n_layers)), query, [observer], add_time)
    t_run = time.perf_counter() - t0
    t0 = time.perf_counter()
    tables = {k: observer.tables(k_fit=k) for k in args.k_fits}
    t_tables = time.perf_counter() - t0
    main_k = 64 if 64 in tables else args.k_fits[0]
    main = tables[main_k]

    print(
        f"model {info.name}: {info.n_layers} layers x {info.n_heads} heads (kv {info.n_kv_heads}), d_head={info.d_head}; "
        f"{tokens.shape[0]} windows of {tokens.shape[1]} tokens (python_docs), profile at query {query[0]}"
    )
    print(
        f"load {t_load:.1f} s; forward + observer {t_run:.1f} s (observer {observe_s:.1f} s); "
        f"tables for {len(tables)} k_fit values {t_tables:.1f} s; threads {torch.get_num_threads()}"
    )

    print(f"\n=== Assumption 1: value norms, over {len(main.value_norms)} (layer, kv_head) pairs ===")
    print(
        describe(
            main.value_norms, ["sink_ratio", "norm_cv", "sink_ratio_of_mean", "norm_cv_of_mean", "median_norm"]
        ).round(4)
    )
    vn = main.value_norms
    print(
        f"share of pairs with sink_ratio < 1: {(vn.sink_ratio < 1).mean():.3f}; < 0.5: {(vn.sink_ratio < 0.5).mean():.3f}; "
        f"norm_cv in [0.02, 0.03]: {vn.norm_cv.between(0.02, 0.03).mean():.3f}; norm_cv > 0.05: {(vn.norm_cv > 0.05).mean():.3f}"
    )
    print("\nper layer (mean over kv heads):")
    print(vn.groupby("layer")[["sink_ratio", "norm_cv", "norm_cv_of_mean"]].mean().round(3).T.to_string())

    for k, t in tables.items():
        sim = t.similarity
        print(f"\n=== Assumption 2: similarity decay, exponential fitted on k = 1..{k}, over {len(sim)} pairs ===")
        print(describe(sim, ["beta", "mae", "share_negative", "rho_0"]).round(4))
        print(
            f"mae in [0.05, 0.10]: {sim.mae.between(0.05, 0.10).mean():.3f}; mae > 0.20: {(sim.mae > 0.20).mean():.3f}; "
            f"share_negative > 0: {(sim.share_negative > 0).mean():.3f}"
        )
    print(f"\nc(k) averaged over every (layer, kv_head) pair, k = 1, 2, 4, ..., {args.k_max}:")
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if k <= args.k_max]
    full = tables[max(tables)].similarity_curve
    print(full[full.k.isin(ks)].groupby("k").c.agg(["mean", "min", "max"]).round(3).T.to_string())

    prof = main.attention_profile
    print(f"\n=== Assumption 3: attention profile (last query), over {len(prof)} (layer, head) pairs ===")
    print(describe(prof, ["p_sink", "p_base", "fit_error", "T1", "T2", "eta_osc", "omega", "eta_exp"]).round(4))
    print(
        f"fit_ok {prof.fit_ok.mean():.3f}; with an oscillation phase {(prof.T1 < prof.T2).mean():.3f}; with a recency "
        f"phase {(prof.T2 < prof.n_keys - 1).mean():.3f}; p_sink / p_base median {(prof.p_sink / prof.p_base).median():.1f}"
    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, table in main.as_dict().items():
            table.to_parquet(args.out / f"{name}.parquet", index=False)
        print(f"\ntables (k_fit = {main_k}) written to {args.out}")


if __name__ == "__main__":
    main()
