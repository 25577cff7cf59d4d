"""The selection order (issue 22): torch's stable ``argsort`` against ``selection_order``, in one run.

On the engines' row shapes (SmolLM2: 9 heads; a block of the query engine's rows with ``-inf``
padding, the last query of 270 heads, the random control's 16 draws per row), prints the best of
``--repeat`` calls of each, their ratio, and that both give the same permutation: for float64
weights (``selection_order`` sorts the scores and puts ties back in key order) and for the same
weights rounded to float32, as a float32 model gives them (one sort of 64-bit keys); then the random
control's scores (``uniform_bits``: the compiled hash against the tensor hash, the same bits) and
orders (``uniform_order``) for one layer's 9 rows x 16 draws.

Run:  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_selection_order.py
"""

from __future__ import annotations

import argparse
import os

import torch
from roofline import best_of

from tl_geometry.core.rankings import default_row_keys, selection_order, uniform_bits, uniform_order


def rows(n_rows: int, n_keys: int, generator: torch.Generator) -> torch.Tensor:
    """Softmax weights with a sink, zeros past each row's last key (as the query engine pads them)."""
    weights = torch.softmax(4 * torch.randn(n_rows, n_keys, dtype=torch.float64, generator=generator), dim=-1)
    last = n_keys - 1 - torch.arange(n_rows)[:, None] % 64
    return torch.where(torch.arange(n_keys)[None] > last, -torch.inf, weights)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    from roofline import cpu_line

    torch.set_num_threads(1)
    print(cpu_line())
    generator = torch.Generator().manual_seed(0)
    for name, n_rows, n_keys in (
        ("a query-engine block, 512 keys", 405, 512),
        ("the last query of 270 heads, 1024 keys", 270, 1024),
        ("16 random draws of 270 heads, 1024 keys", 270 * 16, 1024),
    ):
        float64 = rows(n_rows, n_keys, generator)
        for weights, scores in (("float64", float64), ("float32", float64.float().double())):
            torch_s, stable = best_of(
                args.repeat, lambda s: torch.argsort(s, dim=-1, descending=True, stable=True), scores, warm_up=True
            )
            ours, order = best_of(args.repeat, selection_order, scores, warm_up=True)
            same = torch.equal(order, stable)
            print(
                f"{name}, {weights} weights: torch stable argsort {torch_s * 1e3:.2f} ms, selection_order "
                f"{ours * 1e3:.2f} ms, ratio {ours / torch_s:.2f}; same permutation: {same}  "
                f"(load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
    keys, n_keys, draws = default_row_keys((9,), torch.device("cpu")), 1024, 16
    tensors, tensor_bits = best_of(
        args.repeat, lambda k: uniform_bits(k, n_keys, draws, compiled=False), keys, warm_up=True
    )
    compiled, compiled_bits = best_of(
        args.repeat, lambda k: uniform_bits(k, n_keys, draws, compiled=True), keys, warm_up=True
    )
    same = torch.equal(compiled_bits, tensor_bits)
    orders = best_of(args.repeat, lambda k: uniform_order(k, n_keys, draws), keys, warm_up=True)[0]
    print(
        f"the random control's scores, 9 rows x {draws} draws x {n_keys} keys: tensor hash {tensors * 1e3:.2f} ms, "
        f"compiled hash {compiled * 1e3:.2f} ms, the same bits: {same}; uniform_order {orders * 1e3:.2f} ms  "
        f"(load {os.getloadavg()[0]:.2f})"
    )


if __name__ == "__main__":
    main()
