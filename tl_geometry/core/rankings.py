"""Rankings of the keys of an attention row: the order that defines ``I_N`` (definitions §7).

A ranking scores every key ``i``; ``I_N`` is the ``N`` keys of highest score, ties to the lower
index (a stable sort): ``"attention"`` (``alpha_i``, the default), ``"contribution"``
(``alpha_i ||v_i||``), ``"sink_window"`` (the sink, then the most recent keys) and ``"random"``
(a seeded uniform permutation keyed by the row's origin, so a row gets the same draws in any batch
and after a resume; docs/rankings.md); their names and checks are in
:mod:`tl_geometry.core.ranking_checks`. :func:`selection_order` and :func:`top_n_mask` turn scores
into the order and the set; the engines and the intervention share them.

Examples
--------
>>> import torch
>>> w = torch.tensor([0.1, 0.4, 0.4, 0.1])
>>> v = torch.tensor([[8.0], [1.0], [1.0], [1.0]])
>>> selection_order(ranking_scores(w, v, "attention")).tolist()
[1, 2, 0, 3]
>>> selection_order(ranking_scores(w, v, "contribution")).tolist()
[0, 1, 2, 3]
>>> selection_order(ranking_scores(w, v, "sink_window")).tolist()
[0, 3, 2, 1]
>>> top_n_mask(ranking_scores(w, v, "attention"), 2).tolist()
[False, True, True, False]
>>> keys = row_keys(seq=torch.tensor([0, 1]), layer=3, head=2, query_pos=511)
>>> a = ranking_scores(w.expand(2, 4), v.expand(2, 4, 1), "random", row_keys=keys, seed=0)
>>> b = ranking_scores(w[None], v[None], "random", row_keys=keys[1:], seed=0)
>>> bool((a[1:] == b).all())   # row 1 gets the same draw alone or in a batch
True
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry.core import stable_order
from tl_geometry.core.checks import typechecked
from tl_geometry.core.compiled import AVAILABLE, use_compiled
from tl_geometry.core.ranking_checks import (
    DEFAULT_N_RANDOM,
    DETERMINISTIC_RANKINGS,
    DISTANCES,
    RANKINGS,
    SEED_MAX,
    SEED_MIN,
    check_distance,
    check_n_random,
    check_rank_by,
    check_rankings,
    check_seed,
    seed_word,
)
from tl_geometry.errors import InputError

if AVAILABLE:  # whether numba imports is decided once, in core/compiled.py; without it: the tensor hash
    import numba

#: The constant in the cosine distance ``1 - <y, s> / (||y|| ||s|| + COSINE_EPS)`` (definitions §7).
COSINE_EPS = 1e-12

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB


# ----------------------------------------------------------------------------- hashing


def _shift_right(x: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 tensors read as unsigned 64-bit words."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(x: Int[Tensor, "*shape"]) -> Int[Tensor, "*shape"]:
    """The SplitMix64 finaliser (Steele, Lea, Flood 2014) on int64 tensors read as unsigned words.

    Wrapping int64 arithmetic gives the same bits as the unsigned 64-bit reference.

    >>> import torch
    >>> splitmix64(torch.tensor([0])).tolist()   # 0xE220A8397B1DCDAF as a signed int64
    [-2152535657050944081]
    """
    z = x + _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def mix(*parts: Any) -> Int[Tensor, "*shape"]:
    """Hash a tuple of integers (ints or broadcastable int tensors): ``h = splitmix64(h ^ part)`` from ``h = 0``."""
    h = torch.zeros((), dtype=torch.int64)
    for part in parts:
        h = splitmix64(h ^ torch.as_tensor(part, dtype=torch.int64))
    return h


def row_keys(seq: Any = 0, layer: Any = 0, head: Any = 0, query_pos: Any = 0) -> Int[Tensor, "*batch"]:
    """One int64 key per attention row, from where the row comes from (broadcast ints or int tensors).

    Rows with the same ``(seq, layer, head, query_pos)`` get the same random permutations, whatever
    else is in their batch. ``seq`` is the window's index in the corpus.

    >>> import torch
    >>> row_keys(seq=torch.arange(2)[:, None], head=torch.arange(3)).shape
    torch.Size([2, 3])
    """
    return mix(seq, layer, head, query_pos)


def uniform_scores(
    keys: Int[Tensor, "*batch"], n_keys: int, draws: int = 1, seed: int = 0
) -> Float[Tensor, "*batch draw k"]:
    """``u[..., r, i]`` uniform in ``[0, 1)``: the top 53 bits of ``mix(seed, key, r, i)``, float64.

    Parameters
    ----------
    keys : int64 tensor [*batch]
        Row keys (:func:`row_keys`).
    n_keys : int
        ``K``; key ``i`` gets the same number whatever ``K`` is.
    draws : int
        Number of draws ``R``.
    seed : int
        The user's seed.
    """
    return uniform_bits(keys, n_keys, draws, seed).to(torch.float64) * 2.0**-53


def uniform_bits(
    keys: Int[Tensor, "*batch"], n_keys: int, draws: int = 1, seed: int = 0, *, compiled: bool | None = None
) -> Int[Tensor, "*batch draw k"]:
    """The 53-bit integers of :func:`uniform_scores` (``u = bits / 2^53``, exactly), int64.

    ``compiled`` (None: where numba imports, on the CPU): the hash of every key in one compiled
    pass (unsigned 64-bit arithmetic) instead of about ten tensor passes; the same bits. True
    where that cannot run raises :class:`InputError`."""
    device = keys.device
    per_draw = mix(seed_word(seed), keys[..., None], torch.arange(draws, device=device))  # [*batch, R]
    if use_compiled(compiled, per_draw, reference="the tensor hash"):
        out = np.empty((*per_draw.shape, n_keys), dtype=np.int64)
        _compiled_uniform_bits(per_draw.reshape(-1).numpy().view(np.uint64), out.reshape(-1, n_keys).view(np.uint64))
        return torch.from_numpy(out)
    bits = splitmix64(per_draw[..., None] ^ torch.arange(n_keys, device=device))  # [*batch, R, K]
    return _shift_right(bits, 11)


# SplitMix64's constants and shifts as unsigned words, for the compiled pass (numba turns mixed
# signed and unsigned integer arithmetic into floats): the same bits as the int64 constants above
_U_GOLDEN, _U_MIX1, _U_MIX2 = np.array([_GOLDEN, _MIX1, _MIX2], dtype=np.int64).view(np.uint64)
_U30, _U27, _U31, _U11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)


def _uniform_bits(per_draw, out):  # pragma: no cover - compiled
    """``out[b, i] = splitmix64(per_draw[b] ^ i) >> 11`` in uint64: :func:`splitmix64` word by word."""
    for b in range(out.shape[0]):
        h = per_draw[b]
        for i in range(out.shape[1]):
            z = (h ^ np.uint64(i)) + _U_GOLDEN
            z = (z ^ (z >> _U30)) * _U_MIX1
            z = (z ^ (z >> _U27)) * _U_MIX2
            out[b, i] = (z ^ (z >> _U31)) >> _U11


_compiled_uniform_bits: Any = None
if AVAILABLE:
    _compiled_uniform_bits = numba.njit(cache=True, nogil=True)(_uniform_bits)


#: Bits of :func:`uniform_bits`.
_UNIFORM_BITS = 53


def uniform_order(
    keys: Int[Tensor, "*batch"], n_keys: int, draws: int = 1, seed: int = 0
) -> Int[Tensor, "*batch draw k"]:
    """``selection_order(uniform_scores(keys, n_keys, draws, seed))``, the random control's orders, faster.

    On the CPU with ``K <= 1024`` each key's score and index fit one int64 (``(2^53 - 1 - bits) * 2^b
    + i``, ``b`` the bits of ``K - 1``): distinct numbers whose ascending order is the stable
    descending order of the scores, sorted by numpy's vectorised integer sort (about ten times
    torch's stable ``argsort`` on 16 draws x 1024 keys). Elsewhere, ``selection_order``.

    >>> import torch
    >>> keys = row_keys(seq=torch.arange(3))
    >>> torch.equal(uniform_order(keys, 50, draws=4), selection_order(uniform_scores(keys, 50, draws=4)))
    True
    """
    index_bits = max(1, n_keys - 1).bit_length()
    if keys.device.type != "cpu" or _UNIFORM_BITS + index_bits > 63:
        return selection_order(uniform_scores(keys, n_keys, draws, seed))
    bits = uniform_bits(keys, n_keys, draws, seed)
    packed = (((1 << _UNIFORM_BITS) - 1 - bits) << index_bits) | torch.arange(n_keys)
    return torch.from_numpy(np.sort(packed.numpy(), axis=-1) & ((1 << index_bits) - 1))


# ----------------------------------------------------------------------------- scores and order


@typechecked
def ranking_scores(
    weights: Float[Tensor, "*batch k"],
    values: Float[Tensor, "*#batch k d"] | None,
    rank_by: str = "attention",
    *,
    row_keys: Int[Tensor, "*batch"] | None = None,
    seed: int = 0,
    draw: int = 0,
) -> Float[Tensor, "*batch k"]:
    """Score of every key under ``rank_by`` (higher is selected first), float64 (definitions §7).

    Parameters
    ----------
    weights : [*batch, K]
        Attention weights ``alpha_i``.
    values : [*batch, K, d] or None
        Value vectors ``v_i`` (only ``"contribution"`` needs them); batch dimensions of size 1
        broadcast (the values of a key/value head, shared by its query heads' rows).
    rank_by : "attention", "contribution", "random" or "sink_window"
        ``alpha_i``; ``alpha_i ||v_i||``; a uniform number (see :func:`uniform_scores`); ``+inf``
        for key 0 and ``i`` for the others.
    row_keys : int64 [*batch], optional
        Keys of the rows for ``"random"`` (:func:`row_keys`); default: the row's index in the
        flattened batch (then a row's draw depends on its place in the batch).
    seed : int, default 0
        Seed of ``"random"``.
    draw : int, default 0
        Which draw of ``"random"`` (draws ``0..R-1`` of :func:`uniform_scores`).
    """
    check_rank_by(rank_by)
    batch, n_keys = weights.shape[:-1], weights.shape[-1]
    if rank_by == "attention":
        return weights.to(torch.float64)
    if rank_by == "contribution":
        if values is None:
            raise InputError('rank_by="contribution" needs the values: a_i = alpha_i ||v_i||')
        return weights.to(torch.float64) * torch.linalg.vector_norm(values.to(torch.float64), dim=-1)
    if rank_by == "sink_window":
        scores = torch.arange(n_keys, dtype=torch.float64, device=weights.device)
        scores[0] = torch.inf
        return scores.expand(*batch, n_keys)
    keys = default_row_keys(batch, weights.device) if row_keys is None else row_keys.to(torch.int64)
    return uniform_scores(keys, n_keys, draws=draw + 1, seed=check_seed(seed))[..., draw, :]


def default_row_keys(batch: Sequence[int], device: torch.device | str = "cpu") -> Int[Tensor, "*batch"]:
    """Row keys by position in the flattened batch (``row_keys(seq=index)``)."""
    return row_keys(seq=torch.arange(int(np.prod(batch, dtype=np.int64)), device=device).reshape(tuple(batch)))


def selection_order(scores: Float[Tensor, "*batch k"]) -> Int[Tensor, "*batch k"]:
    """Keys by score, highest first, ties to the lower key index: ``I_N = order[..., :N]`` (definitions §2).

    ``torch.argsort(scores, descending=True, stable=True)``; float32 and float64 scores on the CPU
    without NaN are sorted by :func:`tl_geometry.core.stable_order.stable_descending` (numpy's
    vectorised sort, ties put back in key order), which gives the same permutation faster.
    """
    fast = (
        stable_order.AVAILABLE
        and scores.device.type == "cpu"
        and scores.numel() > 0
        and scores.dtype in (torch.float32, torch.float64)
    )
    if fast:
        order = stable_order.stable_descending(scores.detach().numpy())  # None where a score is NaN
        if order is not None:
            return torch.from_numpy(order)
    return torch.argsort(scores, dim=-1, descending=True, stable=True)


@typechecked
def top_n_cut(scores: Float[Tensor, "*batch k"], n: int) -> tuple[Float[Tensor, "*batch 1"], bool]:
    """The ``n``-th largest score of every row, and whether no row has a tie across that cut.

    When the second value is True, ``scores >= threshold`` keeps exactly ``n`` keys per row (the
    set of :func:`top_n_mask`); otherwise some row has its ``n``-th and ``(n+1)``-th largest scores
    equal. Needs ``1 <= n < K``.

    >>> import torch
    >>> t, no_tie = top_n_cut(torch.tensor([[0.25, 0.5, 0.125]]), 2)
    >>> t.tolist(), no_tie
    ([[0.25]], True)
    """
    top = torch.topk(scores, n + 1, dim=-1).values
    return top[..., n - 1 : n], bool((top[..., n - 1] > top[..., n]).all())


@typechecked
def top_n_mask(scores: Float[Tensor, "*batch k"], n: int) -> Bool[Tensor, "*batch k"]:
    """``True`` at the keys of ``I_N``: the ``n`` highest scores, ties to the lower key index; all keys if ``n >= K``.

    The set of :func:`selection_order` (a stable sort), found without sorting: ``t`` = the ``n``-th
    largest score (``torch.topk``); keep every score ``> t`` and, of the scores ``== t``, the
    lowest-indexed ones until ``n`` are kept.

    >>> import torch
    >>> top_n_mask(torch.tensor([0.2, 0.5, 0.2, 0.2]), 2).tolist()
    [True, True, False, False]
    """
    n_keys = scores.shape[-1]
    if n >= n_keys:
        return torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
    threshold, no_tie = top_n_cut(scores, n)
    if no_tie:  # the usual case: exactly n scores >= t
        return scores >= threshold
    above = scores > threshold
    tied = scores == threshold
    room = n - above.sum(dim=-1, keepdim=True)
    return above | (tied & (torch.cumsum(tied, dim=-1) <= room))


__all__ = [
    "COSINE_EPS",
    "DEFAULT_N_RANDOM",
    "DETERMINISTIC_RANKINGS",
    "DISTANCES",
    "RANKINGS",
    "check_distance",
    "check_n_random",
    "check_rank_by",
    "check_rankings",
    "check_seed",
    "seed_word",
    "SEED_MAX",
    "SEED_MIN",
    "default_row_keys",
    "mix",
    "ranking_scores",
    "row_keys",
    "selection_order",
    "splitmix64",
    "top_n_cut",
    "top_n_mask",
    "uniform_bits",
    "uniform_order",
    "uniform_scores",
]
