"""Per-head key budgets at a fixed mean budget ``B`` (definitions §9), chosen by one of five rules.

A budget gives every (layer, head) ``n_{l,h} >= 1`` keys per query (or "full") and a ranking; its
*mean budget* is ``(1 / H) sum_{l,h} cost_{l,h}`` with ``cost = n`` for a restricted head and
``cost = K_full = (L + 1) / 2`` (the mean number of causal keys of an ``L``-token window) for a full
one; on a layer with a sliding window of ``W`` keys, ``K_full`` is the mean of ``min(q + 1, W)``, the
keys its queries see. Rules (docs/competition.md#per-head-budgets):

* ``uniform``: ``n = B`` for every head (attention ranking);
* ``streaming``: StreamingLLM, sink + the most recent keys, ``n = B`` for every head;
* ``loss``: each head's localised loss curve on a coarse grid (one head restricted at a time)
  gives the smallest ``N`` within ``tolerance``; those sizes are scaled by one factor to meet ``B``;
* ``geometry``: the same from each head's *output error* curve
  ``e(N) = mean ||z - s(N)|| / ||z||`` (definitions §7) -- one forward pass, no loss;
* ``duo``: DuoAttention-style, full attention for the heads whose localised loss under sink +
  window is largest, sink + window for the rest; ``full_share`` of the keys go to full heads.

Rounding: sizes are integers below ``K_full``; the total cost is within ``1/2`` of ``B H`` (largest
remainders get the extra keys), so the mean budget is within ``1 / (2 H)`` of ``B``, and exactly ``B``
whenever ``B H`` and ``F K_full`` are integers (``F`` full heads; e.g. integer ``B`` and no full head).

Examples
--------
>>> import torch
>>> from tl_geometry.testing import tiny_llama_bridge
>>> from tl_geometry.corpus import from_tokens
>>> model = tiny_llama_bridge()
>>> budgets = head_budgets(model, from_tokens(torch.randint(3, 259, (2, 16))), mean_budget=4, rule="geometry")
>>> budgets.mean_budget, budgets.realised_mean()
(4.0, 4.0)
>>> from tl_geometry.intervention.context import top_n_attention
>>> with top_n_attention(model, n=budgets.n, rank_by=budgets.rank_by):
...     logits = model(torch.randint(3, 259, (1, 16)))
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from tl_geometry.capture.hooks import LayerBatch, run_streaming, values_per_head
from tl_geometry.core.numerics import local_errors
from tl_geometry.corpus import as_corpus, corpus_tokens
from tl_geometry.errors import InputError
from tl_geometry.intervention.context import check_n, head_budget, head_rankings
from tl_geometry.intervention.localized import localized_loss
from tl_geometry.intervention.loss import check_windows
from tl_geometry.intervention.restrict import restrict_pattern
from tl_geometry.models import ModelInfo, describe_model
from tl_geometry.runtime.threads import runs_model

RULES = ("uniform", "loss", "geometry", "duo", "streaming")
#: Default coarse grid of sizes on which the ``loss``, ``geometry`` and ``duo`` rules measure each head.
DEFAULT_GRID = (4, 16, 64)
BUDGET_COLUMNS = ["layer", "head", "n", "full", "rank_by", "cost"]


def full_keys(seq_len: int, window: int | None = None) -> float:
    """``K_full``: the mean number of keys the queries of an ``L``-token window see.

    ``(L + 1) / 2`` on a global layer; ``mean_q min(q + 1, W)`` on a layer with a sliding window of ``W`` keys.

    >>> full_keys(8), full_keys(8, window=3), full_keys(8, window=100)
    (4.5, 2.625, 4.5)
    """
    if window is None or window >= seq_len:
        return (seq_len + 1) / 2
    return (window * (window + 1) / 2 + (seq_len - window) * window) / seq_len


def head_full_keys(sliding_windows: Sequence[int | None], n_layers: int, n_heads: int, seq_len: int) -> np.ndarray:
    """``K_full`` of every head, layer by layer (``[n_layers * n_heads]``; ``sliding_windows`` as
    :attr:`~tl_geometry.models.ModelInfo.sliding_windows`, empty when every layer is global)."""
    windows = list(sliding_windows) or [None] * n_layers
    return np.repeat([full_keys(seq_len, w) for w in windows], n_heads).astype(np.float64)


@dataclass(frozen=True)
class HeadBudgets:
    """Per-(layer, head) budgets: pass ``n=budgets.n, rank_by=budgets.rank_by`` to ``top_n_attention``.

    Attributes
    ----------
    rule : the rule that chose them (one of ``RULES``).
    mean_budget : ``B`` asked for.
    n : int64 tensor ``[n_layers, n_heads]``, keys kept by each head's queries (``0``: full).
    rank_by : ``{(layer, head): ranking}`` of every restricted head.
    seq_len : ``L`` of the windows the budgets were chosen on (and must be evaluated on).
    want : float64 ``[n_layers, n_heads]``, each head's size before scaling (``loss``, ``geometry``;
        ``K_full`` for "full"), or its importance (``duo``); NaN for ``uniform`` and ``streaming``.
    sliding_windows : the model's windows per layer (:attr:`~tl_geometry.models.ModelInfo.sliding_windows`;
        empty: every layer global), for each full head's ``K_full``.
    """

    rule: str
    mean_budget: float
    n: Tensor
    rank_by: dict[tuple[int, int], str]
    seq_len: int
    want: Tensor
    sliding_windows: tuple[int | None, ...] = ()

    def realised_mean(self) -> float:
        """The mean over heads of each head's keys per query, "full" counted as ``K_full``."""
        return float(self.costs().mean())

    def costs(self) -> Tensor:
        """Each head's keys per query: ``n``, or its layer's ``K_full`` when full."""
        n_layers, n_heads = self.n.shape
        k_full = torch.from_numpy(head_full_keys(self.sliding_windows, n_layers, n_heads, self.seq_len))
        return torch.where(self.n > 0, self.n.to(torch.float64), k_full.reshape(n_layers, n_heads))

    def mapping(self) -> dict[tuple[int, int], int]:
        """``{(layer, head): n}`` of the restricted heads (those not named stay full)."""
        return {(int(layer), int(h)): int(self.n[layer, h]) for layer, h in torch.nonzero(self.n > 0).tolist()}

    def table(self) -> pd.DataFrame:
        """One row per (layer, head): ``layer, head, n, full, rank_by, cost``."""
        n_layers, n_heads = self.n.shape
        rows = [
            {
                "layer": layer,
                "head": head,
                "n": int(self.n[layer, head]),
                "full": bool(self.n[layer, head] <= 0),
                "rank_by": self.rank_by.get((layer, head), "full"),
                "cost": float(self.costs()[layer, head]),
            }
            for layer in range(n_layers)
            for head in range(n_heads)
        ]
        return pd.DataFrame(rows, columns=BUDGET_COLUMNS)


# ----------------------------------------------------------------------------- checks


def check_rule(rule: Any) -> str:
    if not isinstance(rule, str) or rule not in RULES:
        raise InputError(f"rule={rule!r} is not a budget rule: use one of {', '.join(map(repr, RULES))}")
    return rule


def check_mean_budget(mean_budget: Any, seq_len: int, k_full: float | None = None) -> float:
    """``B`` as a float in ``[1, K_full]`` (``k_full``: the mean over heads, by default ``(L + 1) / 2``);
    otherwise one :class:`InputError`."""
    if isinstance(mean_budget, bool) or not isinstance(mean_budget, numbers.Real) or not math.isfinite(mean_budget):
        raise InputError(f"mean_budget must be a number >= 1 (keys per query, mean over heads), got {mean_budget!r}")
    k_full = full_keys(seq_len) if k_full is None else k_full
    if not 1 <= float(mean_budget) <= k_full:
        raise InputError(
            f"mean_budget={mean_budget} is outside [1, {k_full}]: a head keeps at least 1 key and at most all "
            f"the keys its queries see ({k_full} on average in windows of {seq_len} tokens)"
        )
    return float(mean_budget)


def check_grid(grid: Any, seq_len: int) -> tuple[int, ...]:
    try:
        sizes = sorted({check_n(n) for n in grid})
    except TypeError:
        raise InputError(f"grid must be a list of sizes >= 1, got {grid!r}") from None
    sizes = [n for n in sizes if n < seq_len]
    if not sizes:
        raise InputError(f"grid {grid!r} has no size below the window length {seq_len}")
    return tuple(sizes)


def check_tolerance(tolerance: Any, what: str = "tolerance") -> float:
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or not float(tolerance) >= 0:
        raise InputError(f"{what} must be a number >= 0, got {tolerance!r}")
    return float(tolerance)


# ----------------------------------------------------------------------------- allocation


def allocate(want: np.ndarray, mean_budget: float, seq_len: int, k_full: np.ndarray | None = None) -> np.ndarray:
    """Integer sizes (``0``: full) proportional to ``want`` whose mean cost is ``mean_budget``.

    Scale ``x_h = clip(s want_h, 1, K_full_h)`` with ``s`` found by bisection so that
    ``sum x_h = B H``; heads at ``K_full_h`` are full; the others get ``floor(x_h)``, then one more key
    each (largest remainders first; a head already at the largest size below ``K_full_h`` becomes full)
    until the total is within ``1/2`` of ``B H``. ``k_full``: each head's ``K_full``
    (:func:`head_full_keys`; by default ``(L + 1) / 2`` for every head).

    >>> allocate(np.array([1.0, 1.0, 2.0, 4.0]), 4, seq_len=64).tolist()
    [2, 2, 4, 8]
    """
    want = np.clip(np.asarray(want, dtype=np.float64), 1e-12, None)
    k_full = np.full(want.size, full_keys(seq_len)) if k_full is None else np.asarray(k_full, dtype=np.float64)
    target = mean_budget * want.size
    if target >= k_full.sum():
        return np.zeros(want.size, dtype=np.int64)

    def spent(scale: float) -> float:
        return float(np.clip(scale * want, 1.0, k_full).sum())

    low, high = 0.0, float((k_full / want).max())
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if spent(mid) < target else (low, mid)
    x = np.clip(high * want, 1.0, k_full)
    full = x >= k_full
    cap = np.ceil(k_full).astype(np.int64) - 1  # the largest size cheaper than full
    x = np.minimum(x, cap)
    sizes = np.floor(x).astype(np.int64)
    spent_now = float(sizes[~full].sum() + k_full[full].sum())
    order = [h for h in np.argsort(-(x - sizes), kind="stable") if not full[h]]
    while target - spent_now > 0.5 and order:  # one key (or promotion to full) at a time
        h = order.pop(0)
        if sizes[h] < cap[h]:
            sizes[h] += 1
            spent_now += 1
            order.append(h)
        else:
            full[h] = True
            spent_now += k_full[h] - cap[h]
    sizes[full] = 0
    return sizes


# ----------------------------------------------------------------------------- head curves


class OutputErrorObserver:
    """Accumulates ``sum ||z - s(N)|| / ||z||`` over every query row, per (layer, head, N)."""

    def __init__(self, info: ModelInfo, grid: Sequence[int]):
        self.info, self.grid = info, tuple(grid)
        self.sums = torch.zeros(info.n_layers, info.n_heads, len(self.grid), dtype=torch.float64)
        self.rows = torch.zeros(info.n_layers, info.n_heads, dtype=torch.float64)

    def observe(self, batch: LayerBatch) -> None:
        weights = batch.weights.to(torch.float64)  # [b, h, q, k]
        values = values_per_head(batch.values, self.info.kv_head_of()).to(torch.float64)  # [b, h, k, d]
        z = weights @ values
        window = self.info.sliding_window(batch.layer)
        for i, n in enumerate(self.grid):
            centers = restrict_pattern(weights, weights, n, window=window) @ values
            deletion, _ = local_errors(z, centers, torch.ones(z.shape[:-1], dtype=torch.float64))
            self.sums[batch.layer, :, i] += torch.nan_to_num(deletion, nan=0.0).sum(dim=(0, 2)).cpu()
        self.rows[batch.layer] += weights.shape[0] * weights.shape[2]

    def curves(self) -> Tensor:
        """``[n_layers, n_heads, len(grid)]`` mean output error."""
        return self.sums / self.rows[..., None]


def output_error_curves(model: Any, tokens: Tensor, grid: Sequence[int], batch_size: int = 4) -> Tensor:
    """Each head's mean output error ``e(N) = ||z - s(N)|| / ||z||`` over all query rows, on ``grid``."""
    info = describe_model(model)
    observer = OutputErrorObserver(info, grid)
    positions = tuple(range(tokens.shape[1]))
    for start in range(0, tokens.shape[0], batch_size):
        ids = torch.arange(start, min(start + batch_size, tokens.shape[0]))
        run_streaming(model, info, tokens[ids], ids, range(info.n_layers), positions, [observer])
    return observer.curves()


def localized_curves(
    model: Any, tokens: Tensor, grid: Sequence[int], rank_by: str, batch_size: int, progress: bool
) -> Tensor:
    """Each head's localised ``delta_nll_rel`` on ``grid``: ``[n_layers, n_heads, len(grid)]``."""
    info = describe_model(model)
    out = torch.zeros(info.n_layers, info.n_heads, len(grid), dtype=torch.float64)
    for i, n in enumerate(grid):
        table = localized_loss(
            model, tokens, n=n, unit="head", rank_by=rank_by, batch_size=batch_size, progress=progress
        )
        layers = torch.tensor(table["layer"].to_numpy(dtype=np.int64, copy=True))
        heads = torch.tensor(table["head"].to_numpy(dtype=np.int64, copy=True))
        out[layers, heads, i] = torch.tensor(table["delta_nll_rel"].to_numpy(dtype=np.float64, copy=True))
    return out


def smallest_within(curves: Tensor, grid: Sequence[int], tolerance: float, k_full: float | Tensor) -> Tensor:
    """Per head, the smallest grid size whose value is ``<= tolerance`` (``k_full`` if none: a number,
    or each head's ``[n_layers, n_heads]``)."""
    sizes = torch.tensor(grid, dtype=torch.float64)
    within = curves <= tolerance
    first = torch.where(within, sizes, torch.inf).amin(dim=-1)
    return torch.where(torch.isfinite(first), first, torch.as_tensor(k_full, dtype=torch.float64))


# ----------------------------------------------------------------------------- the rules


@runs_model
def head_budgets(
    model: Any,
    corpus: Any,
    mean_budget: float | Sequence[float],
    rule: str = "geometry",
    *,
    grid: Sequence[int] = DEFAULT_GRID,
    tolerance: float = 0.01,
    error_tolerance: float = 0.1,
    full_share: float = 0.5,
    batch_size: int = 4,
    progress: bool = True,
) -> Any:
    """Per-(layer, head) budgets whose mean over heads is ``mean_budget`` (``B``), chosen by ``rule``.

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer with eager attention.
    corpus : a corpus or token windows ``[n_seqs, L]`` to choose the budgets on (evaluate them on
        other windows of the same length, :func:`evaluate_budgets`).
    mean_budget : float in ``[1, (L + 1) / 2]``, or a list of them
        ``B``, keys per query averaged over heads ("full" counts ``(L + 1) / 2``). A list measures
        the heads once and returns one budget per ``B``.
    rule : "uniform", "loss", "geometry", "duo" or "streaming"
        See the module docstring. ``geometry`` uses the head output error ``||z - s(N)|| / ||z||``
        under deletion: it is the geometric quantity the restriction changes (the distance the head's
        output moves), measured in one pass without the loss.
    grid : sizes on which ``loss``, ``geometry`` and ``duo`` measure each head (coarse: the
        ``loss`` and ``duo`` rules cost one pass over the corpus per head and size).
    tolerance : ``loss``: a head's size is the smallest grid size with localised
        ``delta_nll_rel <= tolerance``.
    error_tolerance : ``geometry``: the smallest grid size with output error ``<= error_tolerance``.
    full_share : ``duo``: share of the total keys ``B H`` spent on full heads.
    batch_size, progress : windows per forward pass; progress bars.

    Returns
    -------
    :class:`HeadBudgets` (a list of them for a list of ``B``);
    ``top_n_attention(model, n=b.n, rank_by=b.rank_by)`` applies one.
    """
    rule = check_rule(rule)
    info = describe_model(model)
    tokens = check_windows(corpus_tokens(model, as_corpus(corpus, 512), info))
    seq_len = tokens.shape[1]
    several = not isinstance(mean_budget, numbers.Real)
    asked = list(mean_budget) if isinstance(mean_budget, Sequence) else [mean_budget]
    if not asked:
        raise InputError("mean_budget is empty: pass a number or a list of numbers")
    k_full_heads = head_full_keys(info.sliding_windows, info.n_layers, info.n_heads, seq_len)
    means = [check_mean_budget(b, seq_len, float(k_full_heads.mean())) for b in asked]
    grid = check_grid(grid, seq_len)
    tolerance = check_tolerance(tolerance)
    error_tolerance = check_tolerance(error_tolerance, "error_tolerance")
    if isinstance(full_share, bool) or not isinstance(full_share, numbers.Real) or not 0 <= full_share < 1:
        raise InputError(f"full_share must be a number in [0, 1), got {full_share!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise InputError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    shape = (info.n_layers, info.n_heads)
    k_full = torch.from_numpy(k_full_heads).reshape(shape)
    want = torch.full(shape, torch.nan, dtype=torch.float64)
    if rule == "geometry":
        want = smallest_within(output_error_curves(model, tokens, grid, batch_size), grid, error_tolerance, k_full)
    elif rule == "loss":
        curves = localized_curves(model, tokens, grid, "attention", batch_size, progress)
        want = smallest_within(curves, grid, tolerance, k_full)
    elif rule == "duo":
        want = localized_curves(model, tokens, grid[:1], "sink_window", batch_size, progress)[..., 0]
    ranking = "sink_window" if rule in ("streaming", "duo") else "attention"
    out = []
    for mean in means:
        if rule in ("uniform", "streaming"):
            sizes = allocate(np.ones(info.n_layers * info.n_heads), mean, seq_len, k_full_heads)
        elif rule == "duo":
            sizes = duo_sizes(want.flatten().numpy(), mean, seq_len, full_share, k_full_heads)
        else:
            sizes = allocate(want.flatten().numpy(), mean, seq_len, k_full_heads)
        n = torch.as_tensor(sizes, dtype=torch.int64).reshape(shape)
        rank_by = {(int(layer), int(h)): ranking for layer, h in torch.nonzero(n > 0).tolist()}
        out.append(
            HeadBudgets(
                rule=rule,
                mean_budget=mean,
                n=n,
                rank_by=rank_by,
                seq_len=seq_len,
                want=want,
                sliding_windows=info.sliding_windows,
            )
        )
    return out if several else out[0]


def duo_sizes(
    importance: np.ndarray, mean_budget: float, seq_len: int, full_share: float, k_full: np.ndarray | None = None
) -> np.ndarray:
    """Full for the ``F`` most important heads, an equal window for the rest: ``F`` the most heads, in
    order of importance, whose ``K_full`` sum to at most ``full_share B H`` (``F = floor(full_share B H
    / K_full)`` when every head has one ``K_full``; ``k_full`` as for :func:`allocate`).

    >>> duo_sizes(np.array([0.1, 0.9, 0.2, 0.3]), 8, seq_len=31, full_share=0.5).tolist()
    [5, 0, 5, 6]
    """
    n_heads = importance.size
    k_full = np.full(n_heads, full_keys(seq_len)) if k_full is None else np.asarray(k_full, dtype=np.float64)
    order = np.argsort(-importance, kind="stable")
    if bool((k_full == k_full[0]).all()):  # one K_full: as the rule is stated
        n_full = min(int(math.floor(full_share * mean_budget * n_heads / k_full[0])), n_heads - 1)
    else:
        spent = np.cumsum(k_full[order])
        n_full = min(int((spent <= full_share * mean_budget * n_heads).sum()), n_heads - 1)
    while n_full > 0 and (mean_budget * n_heads - k_full[order[:n_full]].sum()) < (n_heads - n_full):
        n_full -= 1  # every streaming head keeps at least one key
    want = np.ones(n_heads)
    rest = order[n_full:]
    sizes = np.zeros(n_heads, dtype=np.int64)
    left = (mean_budget * n_heads - k_full[order[:n_full]].sum()) / rest.size
    sizes[rest] = allocate(want[rest], left, seq_len, k_full[rest])
    return sizes


# ----------------------------------------------------------------------------- checking a budget


def check_budgets(budgets: Any, info: ModelInfo, seq_len: int) -> HeadBudgets:
    """A :class:`HeadBudgets` that fits the model and ``seq_len`` and meets its ``B``; else one :class:`InputError`."""
    if not isinstance(budgets, HeadBudgets):
        raise InputError(f"expected HeadBudgets (from tlg.head_budgets), got {type(budgets).__name__}")
    if tuple(budgets.n.shape) != (info.n_layers, info.n_heads):
        raise InputError(
            f"the {budgets.rule} budgets have shape {list(budgets.n.shape)}, the model [{info.n_layers}, {info.n_heads}]"
        )
    if budgets.seq_len != seq_len:
        raise InputError(
            f"the {budgets.rule} budgets were chosen for windows of {budgets.seq_len} tokens; the evaluation "
            f"windows have {seq_len}: choose and evaluate on windows of one length"
        )
    n_heads = info.n_layers * info.n_heads
    if abs(budgets.realised_mean() - budgets.mean_budget) > 1 / (2 * n_heads) + 1e-9:
        raise InputError(
            f"the {budgets.rule} budgets have mean {budgets.realised_mean():.4f}, not B={budgets.mean_budget} "
            f"(within 1/(2H) = {1 / (2 * n_heads):.4f})"
        )
    return budgets


def as_head_budgets(
    n: Mapping[tuple[int, int], int] | Tensor, rank_by: Any, info: ModelInfo, seq_len: int, rule: str = "custom"
) -> HeadBudgets:
    """Wrap a user's per-head ``n`` (and ranking) as :class:`HeadBudgets` whose ``B`` is its realised mean."""
    sizes = head_budget(info, n)
    rankings = head_rankings(info, rank_by)
    sizes = torch.where(sizes > 0, sizes, torch.zeros_like(sizes))
    table = {(int(layer), int(h)): rankings[layer][h] for layer, h in torch.nonzero(sizes > 0).tolist()}
    budgets = HeadBudgets(
        rule=rule,
        mean_budget=math.nan,
        n=sizes,
        rank_by=table,
        seq_len=seq_len,
        want=torch.full(sizes.shape, torch.nan, dtype=torch.float64),
        sliding_windows=info.sliding_windows,
    )
    return replace(budgets, mean_budget=budgets.realised_mean())


__all__ = [
    "BUDGET_COLUMNS",
    "DEFAULT_GRID",
    "RULES",
    "HeadBudgets",
    "OutputErrorObserver",
    "allocate",
    "as_head_budgets",
    "check_budgets",
    "check_mean_budget",
    "check_rule",
    "duo_sizes",
    "full_keys",
    "head_full_keys",
    "head_budgets",
    "localized_curves",
    "output_error_curves",
    "smallest_within",
]
