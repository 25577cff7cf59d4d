"""The envelopes' bucket cosines formed whole per bucket against a few rows at a time (issue 22).

On SmolLM2-135M layers 3 and 15 (one 1024-token window of the embedded corpus, last query, the 9
heads' rows twice: the 18 rows of a 2-window batch), alternating in one process, best of
``--repeats``: the boundary cosines (``theory.boundary_cosines.rho_out_measured``: the float32
screen and its float64 re-check) and the whole ``theory.bounds.bounds`` call, with each bucket's
products formed for every row at once (``PRODUCT_ELEMENTS`` unbounded, as before) and a few rows at
a time (the default), and whether both give the same float32 bucket maxima
(``bucket_max_measured`` in float32) bit for bit.

Run:  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_bounds.py
"""

from __future__ import annotations

import argparse
import os
from functools import partial

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 15])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    from captured_layers import smollm2_layers
    from roofline import best_of, cpu_line

    from tl_geometry.core.sizes import resolve_ns
    from tl_geometry.models import kv_head_index
    from tl_geometry.theory import boundary_cosines
    from tl_geometry.theory.bounds import bounds

    info, captured = smollm2_layers(tuple(args.layers), 1024)
    print(cpu_line())
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    settings = {"whole buckets": 1 << 62, "a few rows at a time": boundary_cosines.PRODUCT_ELEMENTS}
    kv = kv_head_index(info.n_heads, info.n_kv_heads)
    for layer, (pattern, values) in captured.items():
        weights = pattern[0, :, -1].double().repeat(2, 1)  # [18, K]: the last query's row of each head, twice
        vals = values[0].permute(1, 0, 2)[kv].double().repeat(2, 1, 1)  # [18, K, d]
        ns = resolve_ns("log", weights.shape[-1])
        units = torch.nn.functional.normalize(vals, dim=-1)  # key order for selection order: the same work
        sink = torch.zeros(units.shape[0], dtype=torch.int64)
        cosines = partial(boundary_cosines.rho_out_measured, units, ns, sink, torch.float64)
        envelopes = partial(bounds, weights, vals, "log", query_positions=-1)
        seconds: dict[str, dict[str, float]] = {name: {} for name in settings}
        results = {}
        for _ in range(2):  # alternate the settings twice: each gets the warm and the cold turn
            for name, elements in settings.items():
                boundary_cosines.PRODUCT_ELEMENTS = elements
                results[name] = boundary_cosines.bucket_max_measured(units.float(), ns, sink, torch.float32)
                products, _ = best_of(args.repeats, cosines)
                call, _ = best_of(args.repeats, envelopes)
                seconds[name]["products"] = min(products, seconds[name].get("products", products))
                seconds[name]["bounds"] = min(call, seconds[name].get("bounds", call))
        boundary_cosines.PRODUCT_ELEMENTS = settings["a few rows at a time"]
        same = torch.equal(results["whole buckets"], results["a few rows at a time"])
        whole, rows = seconds["whole buckets"], seconds["a few rows at a time"]
        print(
            f"layer {layer}: boundary cosines {whole['products'] * 1e3:.2f} -> {rows['products'] * 1e3:.2f} ms "
            f"({rows['products'] / whole['products']:.2f} x); bounds() {whole['bounds'] * 1e3:.1f} -> "
            f"{rows['bounds'] * 1e3:.1f} ms ({rows['bounds'] / whole['bounds']:.2f} x); same maxima: {same}",
            flush=True,
        )
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
