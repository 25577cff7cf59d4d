"""Slow, obvious reference implementations of SPEC §2, written from the definitions with loops.

Nothing here is shared with the package: each quantity is computed per row and per N from the
text of SPEC.md, in float64, with direct distances.
"""

from __future__ import annotations

import math

import torch


def top_n(weights: torch.Tensor, n: int) -> list[int]:
    """I_N: the n largest weights, ties to the lower key index (SPEC §2)."""
    keys = sorted(range(len(weights)), key=lambda i: (-float(weights[i]), i))
    return keys[:n]


def row_separability(weights: torch.Tensor, values: torch.Tensor, n: int) -> dict:
    """precision, recall, r_min, r_max, f_at_rmax, f_at_rmin and the counts for one row, one N."""
    weights = weights.double()
    values = values.double()
    k = len(weights)
    selected = top_n(weights, n)
    y = [weights[i] * values[i] for i in range(k)]
    s = sum((y[i] for i in selected), torch.zeros_like(values[0]))
    dist = [float(torch.linalg.vector_norm(y[i] - s)) for i in range(k)]
    others = [j for j in range(k) if j not in selected]
    r_max = max(dist[i] for i in selected)
    r_min = min((dist[j] for j in others), default=math.inf)
    k_out = sum(1 for j in others if dist[j] <= r_max)
    k_in = sum(1 for i in selected if dist[i] <= r_min)
    precision = n / (n + k_out)
    recall = k_in / n
    return dict(
        precision=precision,
        recall=recall,
        r_min=r_min,
        r_max=r_max,
        f_at_rmax=2 * precision / (1 + precision),
        f_at_rmin=2 * recall / (1 + recall),
        k_in=k_in,
        k_out=k_out,
        distances=dist,
        selected=selected,
    )


def row_precision_recall_at(weights: torch.Tensor, values: torch.Tensor, n: int, r: float) -> tuple[float, float]:
    """P(r, N) and R(r, N) of eq. 2-3 for one row (NaN precision for an empty ball)."""
    info = row_separability(weights, values, n)
    dist, selected = info["distances"], info["selected"]
    in_ball = [i for i in range(len(dist)) if dist[i] <= r]
    selected_in = sum(1 for i in in_ball if i in selected)
    precision = selected_in / len(in_ball) if in_ball else math.nan
    return precision, selected_in / n
