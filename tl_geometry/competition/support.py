"""The measures of retrieval under competition: candidate scoring, support keys at the answer query, N*.

With ``alpha`` one query's attention row over its ``K`` visible keys, ``S`` the support keys and
``rank(i) = 1 + #{j: alpha_j > alpha_i} + #{j < i: alpha_j = alpha_i}`` (1 = highest weight)::

    mass               = sum_{i in S} alpha_i
    rank_displacement  = min_{i in S} rank(i)                     (the best support key's rank)
    recall_at_top      = #{i in S: rank(i) <= top} / |S|
    pairwise_outrank   = #{(i, j): i in S, j not in S, alpha_j >= alpha_i} / (|S| (K - |S|))
    mean_outranked     = mean_{i in S} #{j not in S: alpha_j >= alpha_i}

(``pairwise_outrank`` is the share of (support, non-support) pairs where the non-support key
weighs at least as much; NaN when every key is support). Candidates are scored by the logit
of their first token: ``answer_loss = -log softmax(candidate logits)[answer]``; ``correct`` when
the answer's logit is above every other candidate's. Accuracy intervals are Wilson's.
Derivations: docs/definitions.md §9; protocol: docs/competition.md.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float
from scipy.stats import binomtest
from torch import Tensor

from tl_geometry.errors import InputError


def support_measures(row: Float[Tensor, "*units key"], support: Tensor, top: int) -> dict[str, Float[Tensor, "*units"]]:
    """``mass``, ``rank_displacement``, ``recall_at_top``, ``pairwise_outrank`` and ``mean_outranked``
    of the support keys (indices ``support`` into the last axis) in every row of ``row`` (float64)."""
    n_keys, n_support = row.shape[-1], int(support.numel())
    if n_support == 0 or n_support > n_keys:
        raise InputError(f"the support must hold 1..{n_keys} keys, got {n_support}")
    weights = row.to(torch.float64)
    order = torch.argsort(-weights, dim=-1, stable=True)  # ties to the lower key index
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(1, n_keys + 1).expand_as(order).clone())
    support_ranks = ranks[..., support].to(torch.float64)
    others = torch.ones(n_keys, dtype=torch.bool)
    others[support] = False
    # [*units, |S|, K]: non-support key j weighs at least as much as support key i
    at_least = (weights[..., None, :] >= weights[..., support, None]) & others
    outranked = at_least.sum(-1).to(torch.float64)
    n_others = n_keys - n_support
    return {
        "mass": weights[..., support].sum(-1),
        "rank_displacement": support_ranks.min(-1).values,
        "recall_at_top": (support_ranks <= top).to(torch.float64).mean(-1),
        "pairwise_outrank": outranked.sum(-1) / (n_support * n_others)
        if n_others
        else torch.full_like(outranked[..., 0], np.nan),
        "mean_outranked": outranked.mean(-1),
    }


def hidden_support(row: Float[Tensor, "*units key"]) -> dict[str, Float[Tensor, "*units"]]:
    """The measures of :func:`support_measures` where no support key is visible (a sliding window
    cut them off): no mass, and no rank, recall or outranking to speak of (NaN)."""
    nan = torch.full(row.shape[:-1], np.nan, dtype=torch.float64)
    names = ("rank_displacement", "recall_at_top", "pairwise_outrank", "mean_outranked")
    return {"mass": torch.zeros(row.shape[:-1], dtype=torch.float64), **{name: nan.clone() for name in names}}


def candidate_scores(logits: Float[Tensor, " vocab"], first_tokens: Tensor, answer: int) -> tuple[float, bool]:
    """``answer_loss`` (nats) and ``correct`` of the candidates whose first tokens are ``first_tokens``."""
    scores = logits[first_tokens].to(torch.float64)
    loss = float(-F.log_softmax(scores, dim=-1)[answer])
    others = torch.cat([scores[:answer], scores[answer + 1 :]])
    return loss, bool((scores[answer] > others).all())


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval of a proportion (scipy's ``binomtest(...).proportion_ci(method="wilson")``)."""
    if trials < 1:
        return (float("nan"), float("nan"))
    ci = binomtest(int(successes), int(trials)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def answer_summary(answers: pd.DataFrame) -> pd.DataFrame:
    """Per ``(condition, amount, rank_by, renormalize, n)``: mean answer loss under top-``N`` and
    full attention, their difference ``delta_loss`` (nats), accuracy with 95 % Wilson intervals."""
    keys = ["condition", "amount", "rank_by", "renormalize", "n"]
    rows = []
    for key, group in answers.groupby(keys, sort=True):
        k, k_full, total = int(group.correct.sum()), int(group.correct_full.sum()), len(group)
        low, high = wilson_interval(k, total)
        low_full, high_full = wilson_interval(k_full, total)
        rows.append(
            {
                **dict(zip(keys, key)),
                "n_examples": total,
                "answer_loss": float(group.answer_loss.mean()),
                "answer_loss_full": float(group.answer_loss_full.mean()),
                "delta_loss": float(group.answer_loss.mean() - group.answer_loss_full.mean()),
                "accuracy": k / total,
                "accuracy_low": low,
                "accuracy_high": high,
                "accuracy_full": k_full / total,
                "accuracy_full_low": low_full,
                "accuracy_full_high": high_full,
            }
        )
    return pd.DataFrame(rows)


def censored_n_star(sizes: list[int], passes: list[bool]) -> dict:
    """``n_star`` (the smallest size that passes; ``<NA>`` if none), ``censored`` (no size passed),
    ``n_max`` (the largest size tried) and ``n_star_text`` (``"32"`` or ``"> 256"``): a censored
    ``N*`` stays in the tables, never dropped."""
    passing = [n for n, ok in zip(sizes, passes) if ok]
    n_max = max(sizes)
    if passing:
        return {"n_star": min(passing), "censored": False, "n_max": n_max, "n_star_text": str(min(passing))}
    return {"n_star": pd.NA, "censored": True, "n_max": n_max, "n_star_text": f"> {n_max}"}


def retrieval_n_star(summary: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    """``N*`` per ``(condition, amount, rank_by, renormalize)``: the smallest ``n`` whose mean answer
    loss is within ``tolerance`` nats of full attention's (``delta_loss <= tolerance``), censored
    (:func:`censored_n_star`) when none is."""
    keys = ["condition", "amount", "rank_by", "renormalize"]
    rows = []
    for key, group in summary.groupby(keys, sort=True):
        group = group.sort_values("n")
        star = censored_n_star(group.n.astype(int).tolist(), (group.delta_loss <= tolerance).tolist())
        full = group.iloc[0]
        rows.append(
            {
                **dict(zip(keys, key)),
                "tolerance": float(tolerance),
                **star,
                "answer_loss_full": float(full.answer_loss_full),
                "accuracy_full": float(full.accuracy_full),
                "n_examples": int(full.n_examples),
            }
        )
    out = pd.DataFrame(rows)
    if not out.empty:
        out["n_star"] = out["n_star"].astype("Int64")
    return out


def support_summary(heads: pd.DataFrame) -> pd.DataFrame:
    """Per ``(condition, amount)``: the support measures' means over examples, layers and heads
    (the ranks, recall and outranking over the heads that see a support key; the mass over all)."""
    measures = ["mass", "rank_displacement", "recall_at_top", "pairwise_outrank", "mean_outranked", "n_keys"]
    out = heads.groupby(["condition", "amount"], sort=True)[measures].mean().reset_index()
    out.insert(2, "n_examples", heads.groupby(["condition", "amount"], sort=True).example_id.nunique().values)
    return out


__all__ = [
    "answer_summary",
    "candidate_scores",
    "censored_n_star",
    "hidden_support",
    "retrieval_n_star",
    "support_measures",
    "support_summary",
    "wilson_interval",
]
