"""Benchmark of the top-N intervention on SmolLM2-135M (definitions §8). Ratios measured in this one run.

1. One intervened forward pass over the windows (every head of every layer restricted,
   ``rank_by="attention"``, deletion, ``n=8``) divided by the plain forward pass over the same windows,
   ``--seq-len`` tokens (default 512). Each is the best of two passes, run alternately so that load
   from other processes hits both alike (target <= 1.5).
2. The cost of ``localized_loss``: seconds per unit (``unit="layer"`` on ``--local-layers`` layers,
   ``unit="head"`` on the heads of one layer), over ``--local-seqs`` windows of ``--local-seq-len``
   tokens, and the same in plain forward passes (best of 3) over those windows (the call's full-model pass and
   probe included, divided by the number of units), with the cost of every unit of SmolLM2 projected.

Run:  python benchmarks/bench_intervention.py              (about 5 minutes on 2 shared cores)
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import tl_geometry as tlg
from tl_geometry.corpus import corpus_tokens


def best_of_alternating(fns: dict, repeats: int = 2) -> dict[str, float]:
    """Run every function ``repeats`` times, alternating between them; the best time of each."""
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def forward_ratio(model, tokens: torch.Tensor, n: int, repeats: int = 2) -> None:
    """Best of ``repeats`` plain and intervened passes, alternating (the probe on entering the block is not timed)."""
    times = {"plain": float("inf"), "intervened": float("inf")}
    with torch.inference_mode():
        model(tokens[:, :8])  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            model(tokens)
            times["plain"] = min(times["plain"], time.perf_counter() - start)
            with tlg.top_n_attention(model, n=n, rank_by="attention"):
                start = time.perf_counter()
                model(tokens)
                times["intervened"] = min(times["intervened"], time.perf_counter() - start)
    shape = f"{tokens.shape[0]} x {tokens.shape[1]} tokens"
    print(f"(a) plain forward {times['plain']:.2f} s, intervened (all heads, attention, n={n}) "
          f"{times['intervened']:.2f} s over {shape}: ratio {times['intervened'] / times['plain']:.3f} (target <= 1.5)")  # fmt: skip


def localized_cost(model, corpus, layers: list[int]) -> None:
    info = tlg.describe_model(model)
    tokens = corpus_tokens(model, corpus)
    fwd = best_of_alternating({"plain": lambda: model(tokens)}, 3)["plain"]
    print(f"(b) plain forward over {tokens.shape[0]} x {tokens.shape[1]} tokens: {fwd:.2f} s")
    for unit, kwargs, n_units, n_all in (
        ("layer", {"layers": layers}, len(layers), info.n_layers),
        ("head", {"layers": layers[:1]}, info.n_heads, info.n_layers * info.n_heads),
    ):
        start = time.perf_counter()
        table = tlg.localized_loss(model, tokens, n=8, unit=unit, progress=False, batch_size=tokens.shape[0], **kwargs)
        seconds = time.perf_counter() - start
        assert len(table) == n_units
        per_unit = seconds / n_units
        print(f"    localized_loss unit={unit}: {seconds:.2f} s for {n_units} units = {per_unit:.2f} s per unit "
              f"= {per_unit / fwd:.2f} forward passes per unit; all {n_all} units of the model: "
              f"~{n_all * per_unit / 60:.1f} min = {n_all * per_unit / fwd:.0f} forward passes")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-seqs", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--local-seqs", type=int, default=1)
    parser.add_argument("--local-seq-len", type=int, default=128)
    parser.add_argument("--local-layers", default="0,1", help="comma list of layers for unit='layer'")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="passes of each kind in (a); the best is kept")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, mps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), torch threads {torch.get_num_threads()}")
    model = tlg.load_model("smollm2-135m", device=args.device)
    tokens = corpus_tokens(model, tlg.corpus.python_docs(n_seqs=args.n_seqs, seq_len=args.seq_len))
    forward_ratio(model, tokens, args.n, args.repeats)
    local = tlg.corpus.python_docs(n_seqs=args.local_seqs, seq_len=args.local_seq_len)
    with torch.inference_mode():
        localized_cost(model, local, [int(x) for x in args.local_layers.split(",")])
    print(f"load: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
