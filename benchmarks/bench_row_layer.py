"""The per-row engine on single SmolLM2-135M layers (issue 22): the last query, attention and random.

Captures ``hook_pattern`` and ``hook_v`` of the chosen layers from one window of ``--seq-len``
tokens (default 512) of the embedded CPython documentation corpus, makes the 18 rows of a
2-window batch (each head's last-query row, and the same rows shifted by one head), then times
``tlg.separability`` on them: the attention ranking and the random control (16 draws), on the log
grid and for every ``N``, the best of ``--repeat`` calls, on one torch thread, with the load
average beside each line. The random control with the log grid is what ``tl-geometry run`` adds
by default. A before/after runs this script twice, once with ``PYTHONPATH`` at the other checkout.

Run:  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_row_layer.py --layers 3 15
"""

from __future__ import annotations

import argparse
import os

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 15])
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    from captured_layers import smollm2_layers
    from roofline import best_of, cpu_line

    import tl_geometry as tlg
    from tl_geometry.models import kv_head_index

    info, captured = smollm2_layers(args.layers, args.seq_len)
    print(f"{tlg.__file__}\n{cpu_line()}")
    kv = kv_head_index(info.n_heads, info.n_kv_heads)
    for layer, (pattern, values) in captured.items():
        weights = pattern[0, :, -1].double()  # [heads, K]: each head's last-query row
        vals = values[0].permute(1, 0, 2)[kv].double()  # [heads, K, d]: its key/value head's values
        weights = torch.stack([weights, weights.roll(1, 0)])  # [2, heads, K]: a 2-window batch
        vals = torch.stack([vals, vals.roll(1, 0)])
        for rank_by in ("attention", "random"):
            for ns in ("log", "all"):
                tlg.separability(weights[..., :8], vals[..., :8, :], ns, rank_by=rank_by)  # warm-up
                seconds, _ = best_of(args.repeat, tlg.separability, weights, vals, ns, rank_by=rank_by)
                print(
                    f"layer {layer:2d}, {weights.shape[0] * weights.shape[1]} rows x {weights.shape[-1]} keys, "
                    f"{rank_by:9s} {ns:3s}: {seconds * 1e3:7.1f} ms  (load average {os.getloadavg()[0]:.2f})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
