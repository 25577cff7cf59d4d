"""Restricting attention rows to their top-``N`` keys (definitions §8), as pure tensor functions.

Every query row with more than ``N`` visible keys keeps only ``I_N`` (the ``N`` highest scores
under a ranking, ties to the lower key index); a shorter row is returned unchanged. Query ``q``
sees ``q + 1`` keys, or ``min(q + 1, W)`` on a layer with a sliding window of ``W`` keys (the
scores of the keys it does not see must then be ``-inf``, or ``0`` for ``"attention"``)::

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

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.core.checks import typechecked
from tl_geometry.core.rankings import top_n_cut, top_n_mask


@typechecked
def restrict_pattern(
    pattern: Float[Tensor, "*batch q k"],
    scores: Float[Tensor, "*batch q k"],
    n: int,
    renormalize: bool = False,
    window: int | None = None,
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
    window : the sliding window of the layer (a query sees at most ``window`` keys), None for a
        global layer; with ``window <= n`` every row sees at most ``n`` keys and is unchanged.

    Returns
    -------
    A new tensor of the pattern's dtype; rows ``q < n`` are the input rows.
    """
    n_queries = pattern.shape[-2]
    if n >= n_queries or (window is not None and window <= n):
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


@typechecked
def restrict_pattern_per_head(
    pattern: Float[Tensor, "*batch head q k"],
    scores: Float[Tensor, "*batch head q k"],
    n: Int[Tensor, " head"],
    renormalize: bool = False,
    window: int | None = None,
) -> Float[Tensor, "*batch head q k"]:
    """:func:`restrict_pattern` with its own ``n`` per head, all heads at once (``n[h] <= 0``: head ``h`` full).

    Head ``h``'s rows ``q >= n[h]`` keep the ``n[h]`` keys of highest score (ties to the lower key
    index); its other rows are returned unchanged. One ``topk`` of the largest ``n`` finds every
    head's cut; a tie across a cut falls back to a stable sort.

    Parameters
    ----------
    pattern : [*batch, head, q, k] square causal attention weights.
    scores : [*batch, head, q, k] the ranking's scores (future keys ``-inf``, or ``0`` for attention).
    n : int [head] keys kept by each head's queries; ``0`` or less keeps the head full.
    renormalize : divide the kept weights of every changed row by their sum.
    window : as for :func:`restrict_pattern` (a head with ``window <= n[h]`` is unchanged).

    Examples
    --------
    >>> import torch
    >>> alpha = torch.tensor([[[0.25, 0.5, 0.25]]]).expand(2, 3, 3)   # two heads, one row repeated
    >>> restrict_pattern_per_head(alpha, alpha, torch.tensor([1, 0]))[:, 2].tolist()
    [[0.0, 0.5, 0.0], [0.25, 0.5, 0.25]]
    """
    n_queries, n_keys = pattern.shape[-2:]
    n = n.to(device=pattern.device, dtype=torch.int64)
    visible = torch.arange(1, n_queries + 1, device=pattern.device)  # keys query q sees: q + 1 ...
    if window is not None:
        visible = visible.clamp(max=window)  # ... or at most the window's
    rows = (n[:, None] > 0) & (visible[None, :] > n[:, None])  # [head, q]: rows with more than n keys
    if not bool(rows.any()):
        return pattern
    size = torch.where(n > 0, n, torch.ones_like(n)).clamp(max=n_keys - 1)  # in range for every head
    k_top = min(int(size.max()) + 1, n_keys)
    top = torch.topk(scores, k_top, dim=-1).values  # [*batch, head, q, k_top]
    index = einops.repeat(size - 1, "h -> h q 1", q=n_queries).expand(*top.shape[:-1], 1)
    cut = top.gather(-1, index)
    after = top.gather(-1, (index + 1).clamp(max=k_top - 1))
    no_tie = bool(((cut[..., 0] > after[..., 0]) | ~rows).all())
    if no_tie:
        keep = scores >= cut
    else:  # rank of every key in a stable descending sort
        order = torch.argsort(scores, dim=-1, descending=True, stable=True)
        ranks = torch.empty_like(order).scatter_(
            -1, order, torch.arange(n_keys, device=order.device).expand_as(order).contiguous()
        )
        keep = ranks < einops.rearrange(size, "h -> h 1 1")
    keep = keep | ~rows[..., None]
    out = torch.where(keep, pattern, torch.zeros((), dtype=pattern.dtype, device=pattern.device))
    if renormalize:
        total = out.sum(dim=-1, keepdim=True)
        out = out / torch.where(rows[..., None] & (total > 0), total, torch.ones_like(total))
    return out


def _renormalize_(rows: Tensor) -> None:
    """Divide every row by its sum, in place (a row summing to 0 stays 0)."""
    total = rows.sum(dim=-1, keepdim=True)
    rows.div_(torch.where(total > 0, total, torch.ones_like(total)))


__all__ = ["restrict_pattern", "restrict_pattern_per_head"]
