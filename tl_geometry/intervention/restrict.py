"""Restricting attention rows to their top-``N`` keys (definitions §8), as pure tensor functions.

Every query row with more than ``N`` visible keys keeps only ``I_N`` (the ``N`` highest scores
under a ranking, ties to the lower key index); a shorter row is returned unchanged::

    deletion (renormalize=False):       alpha'_i = alpha_i               on I_N, 0 elsewhere
    renormalisation (renormalize=True): alpha'_i = alpha_i / sum_{I_N} alpha_j

Details: docs/definitions.md §8.

Examples
--------
>>> import torch
>>> alpha = torch.tensor([[[[1.0, 0.0, 0.0], [0.3, 0.7, 0.0], [0.2, 0.5, 0.3]]]])
>>> restrict_pattern(alpha, alpha, n=1, renormalize=False)[0, 0].tolist()
[[1.0, 0.0, 0.0], [0.0, 0.699999988079071, 0.0], [0.0, 0.5, 0.0]]
>>> restrict_pattern(alpha, alpha, n=2, renormalize=True)[0, 0, 2].tolist()
[0.0, 0.625, 0.375]
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry.core.checks import typechecked
from tl_geometry.core.rankings import top_n_cut, top_n_mask


@typechecked
def restrict_pattern(
    pattern: Float[Tensor, "*batch q k"],
    scores: Float[Tensor, "*batch q k"],
    n: int,
    renormalize: bool = False,
) -> Float[Tensor, "*batch q k"]:
    """The pattern with every row of more than ``n`` visible keys restricted to its top-``n`` keys.

    Parameters
    ----------
    pattern : [*batch, q, k] causal attention weights, query ``q`` sees keys ``0..q`` (square: one
        row per position, no KV cache).
    scores : [*batch, q, k] the ranking's score of every key (higher first; future keys are never
        chosen for a changed row when they score ``-inf`` or, for ``"attention"``, ``0``).
    n : the number of keys kept, ``>= 1``.
    renormalize : divide the kept weights by their sum (a row whose kept weights sum to 0 stays 0).

    Returns
    -------
    A new tensor of the pattern's dtype; rows ``q < n`` are the input rows.
    """
    n_queries = pattern.shape[-2]
    if n >= n_queries:
        return pattern
    zero = torch.zeros((), dtype=pattern.dtype, device=pattern.device)
    if n < scores.shape[-1]:
        # one pass over the whole pattern (no copy of it, no slice assignment): keep every score at or
        # above its row's n-th largest, every key of the rows q < n (threshold -inf) -- exact unless a
        # tie straddles the cut of a row q >= n, which the general path below handles
        cut, no_tie = top_n_cut(scores[..., n:, :], n)
        if no_tie:
            threshold = torch.full((*scores.shape[:-1], 1), -torch.inf, dtype=scores.dtype, device=scores.device)
            threshold[..., n:, :] = cut
            out = torch.where(scores >= threshold, pattern, zero)
            if renormalize:
                _renormalize_(out[..., n:, :])
            return out
    tail = pattern[..., n:, :]
    kept = torch.where(top_n_mask(scores[..., n:, :], n), tail, zero)
    if renormalize:
        _renormalize_(kept)
    out = pattern.clone()
    out[..., n:, :] = kept
    return out


def _renormalize_(rows: Tensor) -> None:
    """Divide every row by its sum, in place (a row summing to 0 stays 0)."""
    total = rows.sum(dim=-1, keepdim=True)
    rows.div_(torch.where(total > 0, total, torch.ones_like(total)))


__all__ = ["restrict_pattern"]
