"""Theorems 1-2 envelopes against measured precision / recall on SmolLM2-135M (docs/theory.md).

Runs :func:`tl_geometry.analyze` (separability) and, in a second streaming pass over the same
windows, one :class:`~tl_geometry.theory.observer.BoundsObserver` per ``kappa``; joins the tables
on ``seq, layer, head, kv_head, query_pos, n`` and prints, per ``N``, the mean metrics, the mean
envelopes and the share of rows inside ``[lower, upper]`` (aggregated over the 4 windows, the 30
layers and the 9 query heads, at the last query position).

    python benchmarks/bounds_smollm2.py            # ~2-3 minutes on 1 CPU thread
"""

from __future__ import annotations

import argparse
import time

import pandas as pd
import torch

import tl_geometry as tlg
from tl_geometry.capture.hooks import run_streaming
from tl_geometry.theory.observer import BoundsObserver, envelopes, join_bounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-seqs", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--kappas", type=float, nargs="+", default=[0.1, 0.5, 2.0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: shared machine)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, mps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 30)

    t0 = time.perf_counter()
    model = tlg.load_model("smollm2-135m", device=args.device)
    t_load = time.perf_counter() - t0
    corpus = tlg.corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len)
    t0 = time.perf_counter()
    result = tlg.analyze(model, corpus, ns="log", progress=False)
    t_sep = time.perf_counter() - t0
    info = result.model
    queries = tuple(result.config["query_positions"])
    observers = {kappa: BoundsObserver(info, ns="log", kappa=kappa) for kappa in args.kappas}
    seq_ids = torch.arange(result.tokens.shape[0])
    t0 = time.perf_counter()
    run_streaming(model, info, result.tokens, seq_ids, list(range(info.n_layers)), queries, list(observers.values()))
    t_bounds = time.perf_counter() - t0
    print(
        f"model {info.name}: {info.n_layers} layers x {info.n_heads} heads (kv {info.n_kv_heads}), "
        f"d_head={info.d_head}; "
        f"{args.n_seqs} windows of {args.seq_len} tokens (python_docs), query = last position, ns='log'"
    )
    print(f"load {t_load:.1f} s, analyze {t_sep:.1f} s, bounds for {len(args.kappas)} kappas {t_bounds:.1f} s")

    cols = [
        "n", "rows", "precision", "precision_lower", "precision_upper", "precision_inside", "precision_below",
        "precision_above", "recall", "recall_lower", "recall_upper", "recall_inside", "recall_below", "recall_above",
        "precision_mean_inside", "recall_mean_inside",
    ]  # fmt: skip
    for kappa, obs in observers.items():
        joined = join_bounds(result.separability, obs.take())
        env = envelopes(joined)
        print(f"\n=== kappa = {kappa}: per N, means over {env.rows.iloc[0]} rows (seq x layer x head) ===")
        print(env[cols].round(3).to_string(index=False))
        inner = joined[(joined.n > 1) & (joined.n < joined.query_pos + 1)]
        live = inner[inner.recall_lower > 0]  # rows whose lower bounds are not vacuous
        print(
            f"all 1 < N < K ({len(inner)} rows): precision inside {_inside(inner, 'precision'):.3f} "
            f"(below {_share(inner.precision < inner.precision_lower - 1e-12):.4f}, above "
            f"{_share(inner.precision > inner.precision_upper + 1e-12):.3f}); recall inside "
            f"{_inside(inner, 'recall'):.3f} (below {_share(inner.recall < inner.recall_lower - 1e-12):.4f}, above "
            f"{_share(inner.recall > inner.recall_upper + 1e-12):.3f})"
        )
        below_p = inner[inner.precision < inner.precision_lower - 1e-12]
        below_r = inner[inner.recall < inner.recall_lower - 1e-12]
        print(
            f"rows under a lower bound: precision {len(below_p)} (N {sorted(below_p.n.unique().tolist())}, "
            f"lower bound {below_p.precision_lower.round(3).tolist()[:6]}, "
            f"precision {below_p.precision.round(3).tolist()[:6]}), "
            f"recall {len(below_r)}"
        )
        print(
            f"rows with recall_lower > 0: {len(live)} (N in {sorted(live.n.unique().tolist())[:8]}); among them "
            f"precision < precision_lower in {int((live.precision < live.precision_lower - 1e-12).sum())}, "
            f"recall < recall_lower in {int((live.recall < live.recall_lower - 1e-12).sum())}"
        )
        if kappa == args.kappas[0]:
            small = joined[joined.n.isin([2, 3, 4])]
            print(
                "scale of the margins (N = 2..4): median B = "
                f"{small.scale.median():.3g}, median Delta/B = {(small.delta / small.scale).median():.3g}, "
                f"share Delta > 0 = {(small.delta > 0).mean():.3f}"
            )


def _share(mask: pd.Series) -> float:
    return float(mask.mean()) if len(mask) else float("nan")


def _inside(df: pd.DataFrame, m: str) -> float:
    return float(((df[m] >= df[f"{m}_lower"] - 1e-12) & (df[m] <= df[f"{m}_upper"] + 1e-12)).mean())


if __name__ == "__main__":
    main()
