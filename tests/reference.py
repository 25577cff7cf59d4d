"""Slow, obvious reference implementations of definitions §2, written from the definitions with loops.

Nothing here is shared with the package: each quantity is computed per row and per N from the
text of docs/definitions.md, in float64, with direct distances.
"""

from __future__ import annotations

import math

import torch

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """SplitMix64 on Python ints (unsigned 64-bit), from Steele, Lea & Flood (2014)."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def mix(*parts: int) -> int:
    """h = splitmix64(h ^ part) for each part, from h = 0 (parts as 64-bit words)."""
    h = 0
    for p in parts:
        h = splitmix64(h ^ (p & MASK64))
    return h


def random_scores(n_keys: int, seed: int, row_key: int, draw: int) -> list[float]:
    """Uniform score of each key in one random draw: the top 53 bits of mix(seed, row_key, draw, i)."""
    return [(mix(seed, row_key, draw, i) >> 11) * 2.0**-53 for i in range(n_keys)]


def scores(weights: torch.Tensor, values: torch.Tensor, rank_by: str, random: list[float] | None = None) -> list[float]:
    """The score of each key under rank_by (definitions §7); higher is selected first."""
    k = len(weights)
    if rank_by == "attention":
        return [float(weights[i]) for i in range(k)]
    if rank_by == "contribution":
        return [float(weights[i]) * math.sqrt(sum(float(x) ** 2 for x in values[i])) for i in range(k)]
    if rank_by == "sink_window":
        return [math.inf if i == 0 else float(i) for i in range(k)]
    assert rank_by == "random" and random is not None
    return list(random)


def top_n(weights, n: int) -> list[int]:
    """I_N: the n largest scores (weights), ties to the lower key index (definitions §2)."""
    keys = sorted(range(len(weights)), key=lambda i: (-float(weights[i]), i))
    return keys[:n]


def distance(y: torch.Tensor, s: torch.Tensor, kind: str) -> float:
    """Euclidean ||y - s|| or cosine 1 - <y, s> / (||y|| ||s|| + 1e-12) (definitions §7)."""
    if kind == "euclidean":
        return float(torch.linalg.vector_norm(y - s))
    return 1.0 - float(torch.dot(y, s)) / (
        float(torch.linalg.vector_norm(y)) * float(torch.linalg.vector_norm(s)) + 1e-12
    )


def row_separability(
    weights: torch.Tensor,
    values: torch.Tensor,
    n: int,
    rank_by: str = "attention",
    kind: str = "euclidean",
    random: list[float] | None = None,
) -> dict:
    """precision, recall, r_min, r_max, f_at_rmax, f_at_rmin, the local errors and the counts for one
    row, one N, one ranking (random: the draw whose key scores are `random`)."""
    weights = weights.double()
    values = values.double()
    k = len(weights)
    selected = top_n(scores(weights, values, rank_by, random), n)
    y = [weights[i] * values[i] for i in range(k)]
    s = sum((y[i] for i in selected), torch.zeros_like(values[0]))
    dist = [distance(y[i], s, kind) for i in range(k)]
    others = [j for j in range(k) if j not in selected]
    r_max = max(dist[i] for i in selected)
    r_min = min((dist[j] for j in others), default=math.inf)
    k_out = sum(1 for j in others if dist[j] <= r_max)
    k_in = sum(1 for i in selected if dist[i] <= r_min)
    precision = n / (n + k_out)
    recall = k_in / n
    z = sum(y, torch.zeros_like(values[0]))
    mass = sum(float(weights[i]) for i in selected)
    z_norm = float(torch.linalg.vector_norm(z))
    e_del = float(torch.linalg.vector_norm(z - s)) / z_norm if z_norm > 0 else math.nan
    e_ren = float(torch.linalg.vector_norm(z - s / mass)) / z_norm if z_norm > 0 and mass > 0 else math.nan
    return dict(
        retained_mass=mass,
        local_error_del=e_del,
        local_error_ren=e_ren,
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


METRICS = [
    "precision", "recall", "r_min", "r_max", "f_at_rmax", "f_at_rmin",
    "retained_mass", "local_error_del", "local_error_ren",
]  # fmt: skip


def row_metrics(weights, values, n, rank_by="attention", kind="euclidean", seed=0, row_key=0, n_random=16) -> dict:
    """The metrics of one row and N; for rank_by="random" the mean over draws 0..n_random-1 of the
    draws' metrics (definitions §7), each draw evaluated around its own s(N)."""
    if rank_by != "random":
        info = row_separability(weights, values, n, rank_by, kind)
        return {m: info[m] for m in METRICS}
    draws = [
        row_separability(weights, values, n, rank_by, kind, random_scores(len(weights), seed, row_key, r))
        for r in range(n_random)
    ]
    return {m: sum(d[m] for d in draws) / n_random for m in METRICS}
