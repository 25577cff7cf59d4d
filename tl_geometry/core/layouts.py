"""Which keys an attention row may be measured over: query positions and TransformerLens' layouts.

A query at position ``q`` sees the keys ``0..q`` (definitions §1). The tensor functions
(:func:`tl_geometry.separability`, :func:`tl_geometry.precision_recall_at_radius`) take rows in one
of two layouts:

* ``layout="rows"`` (default): ``weights [*batch, K]`` and ``values [*batch, K, d]``, every key of
  a row measured. With ``query_positions=q`` the rows are cut to their causal keys ``0..q``.
* ``layout="tl"``: what ``run_with_cache`` gives, ``pattern [batch, head, query, key]`` and
  ``hook_v [batch, pos, kv_head, d_head]``; query head ``h`` reads key/value head
  ``h // (n_heads // n_kv_heads)`` (TransformerLens' grouping), and ``query_positions`` (required)
  names the position of every query row, so each row is cut to its own causal keys.

A full causal row of a query before the last position (``pattern[:, :, q, :]``) ends in keys of
weight exactly 0, the future keys. Measured as they stand, they would count as non-selected tokens.
Without its position such a row cannot be told apart from a row whose last weights are genuine
zeros (float32 softmax underflows below ``1e-45``), so the rows layout refuses a row of more than one
key whose last weight is exactly 0 unless ``query_positions`` says where its query is
(:func:`causal_rows`).

Examples
--------
>>> import torch
>>> resolve_query_positions("last", 5), resolve_query_positions([-1, 0, 2], 5)
((4,), (0, 2, 4))
>>> w = torch.tensor([[0.6, 0.4, 0.0, 0.0]])
>>> causal_rows(w, torch.ones(1, 4, 2), None)
Traceback (most recent call last):
...
tl_geometry.errors.InputError: 1 of 1 attention rows end in keys of weight exactly 0, ...
>>> causal_rows(w, torch.ones(1, 4, 2), 1)[0]
tensor([[0.6000, 0.4000]])
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.core.checks import is_integer
from tl_geometry.errors import InputError

#: The layouts the tensor functions accept (see the module docstring).
LAYOUTS = ("rows", "tl")
Layout = Literal["rows", "tl"]


def check_layout(layout: Any) -> str:
    """``layout`` if it is one of :data:`LAYOUTS`, else :class:`InputError`."""
    if layout not in LAYOUTS:
        raise InputError(
            f"layout={layout!r} is not understood: use 'rows' (weights [*batch, K], values [*batch, K, d]) or 'tl' "
            "(TransformerLens' pattern [batch, head, query, key] and hook_v [batch, pos, kv_head, d_head])"
        )
    return str(layout)


def resolve_query_positions(spec: Any, seq_len: int) -> tuple[int, ...]:
    """Query positions from a user spec: ``"last"``, ``"all"``, an int, a sequence of ints, or a range/slice.

    Negative positions count from the end (``-1`` is the last). Returned sorted and unique.
    Position 0 has a single key and is allowed, though every metric is trivially 1 there.
    """
    if isinstance(spec, str):
        if spec == "all":
            return tuple(range(seq_len))
        if spec != "last":
            raise InputError(
                f"query_positions={spec!r} is not understood: use 'last', 'all', an int, a list or a range"
            )
        return (seq_len - 1,)
    if isinstance(spec, slice):
        spec = range(*spec.indices(seq_len))
    if isinstance(spec, Tensor):
        spec = spec.tolist()
    items = [spec] if is_integer(spec) else list(spec)
    if not items:
        raise InputError("query_positions is empty: give at least one position")
    out = set()
    for q in items:
        if not is_integer(q):
            raise InputError(f"query positions must be ints, got {q!r}")
        p = int(q) + seq_len if q < 0 else int(q)
        if not 0 <= p < seq_len:
            raise InputError(f"query position {q} is outside windows of {seq_len} tokens (valid: 0..{seq_len - 1})")
        out.add(p)
    return tuple(sorted(out))


def causal_rows(
    weights: Float[Tensor, "*batch k"], values: Float[Tensor, "*batch k d"], query_position: Any
) -> tuple[Tensor, Tensor]:
    """Rows of the ``"rows"`` layout cut to the causal keys ``0..q`` of their query.

    Parameters
    ----------
    weights : [*batch, K] and values : [*batch, K, d]
        The rows, every one of the same query position.
    query_position : int or None
        ``q`` (negative counts from ``K``: ``-1`` keeps every key). None: the rows are taken as
        they are, and a row of more than one key whose last weight is exactly 0 raises
        :class:`InputError` (the full row of an earlier query; see the module docstring).
    """
    n_keys = weights.shape[-1]
    if query_position is None:
        if n_keys > 1:
            ends_in_zero = weights[..., -1] == 0
            if bool(ends_in_zero.any()):
                raise InputError(
                    f"{int(ends_in_zero.sum())} of {ends_in_zero.numel()} attention rows end in keys of weight "
                    "exactly 0, as the full causal row of an earlier query does (its future keys weigh 0): "
                    "measured as they stand, those keys would count as unselected tokens. Say where the "
                    "query is: query_positions=q keeps the keys 0..q (use layout='tl' for a pattern "
                    "[batch, head, query, key] with hook_v); if the zeros are real weights of keys the "
                    "query sees, pass query_positions=-1"
                )
        return weights, values
    if not is_integer(query_position):
        raise InputError(
            f"with layout='rows', query_positions is the one position of every row's query (an int), got "
            f"{query_position!r}; for rows of several queries use layout='tl' (pattern [batch, head, query, key])"
        )
    (q,) = resolve_query_positions(int(query_position), n_keys)
    return weights[..., : q + 1], values[..., : q + 1, :]


def tl_kv_head_of(n_heads: int, n_kv_heads: int) -> Int[Tensor, " head"]:
    """TransformerLens' grouping: query head ``h`` reads key/value head ``h // (n_heads // n_kv_heads)``."""
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise InputError(
            f"the pattern has {n_heads} heads and hook_v {n_kv_heads}: with layout='tl', hook_v needs "
            "[batch, pos, kv_head, d_head] with n_heads a multiple of kv_head"
        )
    return torch.arange(n_heads) // (n_heads // n_kv_heads)


def tl_rows(
    pattern: Tensor, hook_v: Tensor, query_positions: Any
) -> tuple[Float[Tensor, "batch head query key"], Float[Tensor, "batch key kv_head d"], tuple[int, ...], Tensor]:
    """Check TransformerLens' layout and say which query rows are measured.

    Parameters
    ----------
    pattern : [batch, head, query, key]
        ``hook_pattern``: every query row (``query == key``, the whole pattern) or some of them.
    hook_v : [batch, pos, kv_head, d_head]
        ``hook_v`` of the same positions (``pos == key``).
    query_positions : "last", "all", int, list of int or range
        With the whole pattern: the positions whose rows are measured. With some rows: the
        position of each row, in order, one per row.

    Returns
    -------
    (weights [batch, head, n_queries, key], hook_v, positions, kv_head_of [head])
    """
    if query_positions is None:
        raise InputError(
            "layout='tl' needs query_positions: the positions of the rows to measure ('last', 'all', a list), "
            "or with some rows of the pattern the position of each"
        )
    if pattern.ndim != 4:
        raise InputError(
            f"with layout='tl' the pattern must be [batch, head, query, key], got shape {tuple(pattern.shape)}: "
            "keep the query axis (pattern[:, :, [q]]) and give query_positions=[q]"
        )
    if hook_v.ndim != 4:
        raise InputError(
            f"with layout='tl' hook_v must be [batch, pos, kv_head, d_head], got shape {tuple(hook_v.shape)}"
        )
    n_batch, n_heads, n_rows, n_keys = pattern.shape
    if hook_v.shape[0] != n_batch or hook_v.shape[1] != n_keys:
        raise InputError(
            f"hook_v of shape {tuple(hook_v.shape)} does not match the pattern {tuple(pattern.shape)}: "
            "give hook_v [batch, pos, kv_head, d_head] with the pattern's batch and pos == key"
        )
    kv_head_of = tl_kv_head_of(n_heads, hook_v.shape[2])
    if n_rows == n_keys:  # the whole pattern: row q is query q
        positions = resolve_query_positions(query_positions, n_keys)
        index = torch.tensor(positions, dtype=torch.int64, device=pattern.device)
        return pattern.index_select(2, index), hook_v, positions, kv_head_of
    given = [query_positions] if is_integer(query_positions) else query_positions
    if isinstance(given, str) or len(given) != n_rows:
        raise InputError(
            f"the pattern holds {n_rows} query rows of {n_keys} keys: give query_positions as the position of "
            f"each row ({n_rows} ints), or pass the whole pattern [batch, head, {n_keys}, {n_keys}]"
        )
    positions = tuple(resolve_query_positions(q, n_keys)[0] for q in given)
    return pattern, hook_v, positions, kv_head_of


def values_per_head(hook_v: Float[Tensor, "batch key kv_head d"], kv_head_of: Tensor) -> Tensor:
    """``hook_v`` seen by every query head: ``[batch, head, key, d]``, contiguous (one gather), so
    that the rows of a head are one block of memory for what follows.

    >>> import torch
    >>> v = torch.randn(2, 5, 3, 4)
    >>> per_head = values_per_head(v, torch.tensor([0, 0, 1, 2]))
    >>> per_head.shape, per_head.is_contiguous(), torch.equal(per_head[:, 1], v[:, :, 0])
    (torch.Size([2, 4, 5, 4]), True, True)
    """
    return hook_v.transpose(1, 2).index_select(1, kv_head_of.to(hook_v.device))


def pack_rows(x: Tensor, trailing: int) -> tuple[Tensor, list[tuple[int, ...] | list[int]]]:
    """``einops.pack([x], "* ...")`` keeping the last ``trailing`` dimensions: the rows ``[R, ...]`` and
    the batch shapes for ``einops.unpack``, as a view where ``x``'s layout allows (einops copies).

    >>> import torch
    >>> x = torch.randn(2, 3, 5)
    >>> rows, packing = pack_rows(x, 1)
    >>> rows.shape, rows.data_ptr() == x.data_ptr(), packing
    (torch.Size([6, 5]), True, [(2, 3)])
    """
    batch, kept = x.shape[: x.ndim - trailing], x.shape[x.ndim - trailing :]
    return x.reshape(math.prod(batch), *kept), [tuple(batch)]


__all__ = [
    "LAYOUTS",
    "Layout",
    "causal_rows",
    "check_layout",
    "pack_rows",
    "values_per_head",
    "resolve_query_positions",
    "tl_kv_head_of",
    "tl_rows",
]
