"""Top-N selection of one attention row (definitions §2, paper eq. 1).

The keys of a row are ordered by attention weight, largest first; ties go to the lower key index
(a stable sort). ``I_N`` is the first ``N`` keys of that order, so ``I_1 ⊂ I_2 ⊂ … ⊂ I_K`` and
the representative vectors ``s(N) = sum_{i in I_N} alpha_i v_i`` are the prefix sums of the
contributions taken in that order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from einops import repeat
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.core.checks import typechecked
from tl_geometry.core.rankings import selection_order
from tl_geometry.core.size_names import DEFAULT_NS as DEFAULT_NS  # the grid by name lives without torch
from tl_geometry.errors import InputError

#: What ``ns`` may be: None / "all" (every N), "log", a sequence of ints, a 1-D int array or tensor.
#: Checked by :func:`resolve_ns` (with messages that say what to do), not by the type checker.
NsLike = Any


def log_spaced_ns(n_keys: int, dense_below: int = 8, per_octave: int = 4) -> list[int]:
    """The default grid of selection sizes ``N`` for a row of ``n_keys`` keys.

    Every ``N`` from 1 to ``dense_below``, then ``per_octave`` points per doubling (rounded,
    de-duplicated), and always ``N = n_keys``. For ``n_keys = 1024`` this gives 37 values
    instead of 1024.

    Parameters
    ----------
    n_keys : int
        ``K``, the number of keys of the row (query position + 1).
    dense_below : int, default 8
        Every ``N <= dense_below`` is kept: small ``N`` is where the paper's separability is
        strongest and changes fastest.
    per_octave : int, default 4
        Grid points per doubling of ``N`` above ``dense_below``.
    """
    if n_keys < 1:
        raise InputError(f"a row needs at least one key, got n_keys={n_keys}")
    dense = list(range(1, min(n_keys, dense_below) + 1))
    if n_keys <= dense_below:
        return dense
    n_points = int(np.ceil(np.log2(n_keys / dense_below) * per_octave)) + 1
    geometric = np.unique(np.round(np.geomspace(dense_below, n_keys, n_points)).astype(int))
    return sorted(set(dense) | {int(n) for n in geometric} | {n_keys})


def clip_ns(ns: NsLike, n_keys: int) -> NsLike:
    """``ns`` for a row of ``n_keys`` keys analysed beside longer rows (query positions of one window).

    The rule (the log grid's, which ends at ``N = K``): a size of an explicit list above the row's
    ``K`` keys becomes ``K`` (selecting every key), kept once; the other sizes, and ``None``,
    ``"all"`` and ``"log"`` (grids of the row's own ``K``), are unchanged. The rows of that query
    then carry ``n = K``. Input :func:`resolve_ns` refuses is returned as it is, for its message.

    >>> clip_ns([1, 4, 16], 6), clip_ns([1, 16, 32], 6), clip_ns([16, 6], 6), clip_ns("log", 6)
    ([1, 4, 6], [1, 6], [6], 'log')
    """
    if ns is None or isinstance(ns, str):
        return ns
    try:
        values = torch.as_tensor(np.asarray(ns) if not isinstance(ns, Tensor) else ns)
    except (TypeError, ValueError):
        return ns
    if values.ndim != 1 or values.is_floating_point() or values.dtype == torch.bool:
        return ns
    given = [int(n) for n in values.tolist()]
    if max(given, default=0) <= n_keys:
        return ns
    clipped: list[int] = []
    for n in given:
        if n > n_keys:
            if n_keys in given or n_keys in clipped:
                continue
            n = n_keys
        clipped.append(n)
    return clipped


def resolve_ns(ns: NsLike, n_keys: int, device: torch.device | str = "cpu") -> Int[Tensor, " n"]:
    """Turn the user's ``ns`` into a 1-D int64 tensor of selection sizes, checked against ``K``.

    Parameters
    ----------
    ns : None, "all", "log", sequence of int, or 1-D int tensor
        ``None`` or ``"all"``: every ``N`` from 1 to ``K``. ``"log"``: :func:`log_spaced_ns`.
        Otherwise the sizes themselves, each in ``1..K``, in the order given (rows of several
        lengths: :func:`clip_ns` first).
    n_keys : int
        ``K``, the number of keys of the rows.
    """
    if ns is None or (isinstance(ns, str) and ns == "all"):
        return torch.arange(1, n_keys + 1, device=device)
    if isinstance(ns, str):
        if ns == "log":
            return torch.tensor(log_spaced_ns(n_keys), dtype=torch.int64, device=device)
        raise InputError(f"ns={ns!r} is not understood: use None/'all' (every N), 'log', or a list of ints")
    try:
        values = torch.as_tensor(np.asarray(ns) if not isinstance(ns, Tensor) else ns, device=device)
    except (TypeError, ValueError, OverflowError, RuntimeError):  # 10**30, ragged or mixed lists
        raise InputError(
            f"ns must be a 1-D list of selection sizes (integers below 2**63), got {str(ns)[:80]}"
        ) from None
    if values.ndim != 1 or values.numel() == 0:
        raise InputError(f"ns must be a non-empty 1-D list of selection sizes, got shape {tuple(values.shape)}")
    if values.is_floating_point() or values.dtype == torch.bool:
        raise InputError(f"ns must hold integers, got dtype {values.dtype}")
    values = values.to(torch.int64)
    bad = values[(values < 1) | (values > n_keys)]
    if bad.numel():
        raise InputError(
            f"N out of range: {bad.tolist()[:5]} (rows have K={n_keys} keys, so 1 <= N <= {n_keys}); "
            f"drop those sizes or use ns=None for every N"
        )
    return values


@typechecked
def sort_by_weight(
    weights: Float[Tensor, "row k"], values: Float[Tensor, "row k d"]
) -> tuple[Int[Tensor, "row k"], Float[Tensor, "row k d"]]:
    """Order each row's keys by weight (descending, stable) and form the sorted contributions.

    Returns
    -------
    order : [row, k] int64
        ``order[r, t]`` is the key index of the ``t``-th largest weight; ``I_N = order[r, :N]``.
    contributions : [row, k, d]
        ``y_{order[r, t]} = alpha_{order[r, t]} v_{order[r, t]}`` in that order.
    """
    order = selection_order(weights)
    sorted_weights = torch.gather(weights, -1, order)
    sorted_values = torch.gather(values, -2, repeat(order, "row k -> row k d", d=values.shape[-1]))
    return order, sorted_weights[..., None] * sorted_values
