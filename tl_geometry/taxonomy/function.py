"""What the regimes do: per-head effects joined with the regimes and the separability (definitions §5).

Columns: docs/columns.md#join_heads.

* :func:`join_heads` — any per-head frame (``layer, head, ...``: activation patching, mean-ablation,
  :func:`tl_geometry.localized_loss` with ``unit="head"``) or ``[n_layers, n_heads]`` tensor, joined with the labels
  of both modes and the head's mean precision / recall at one ``N``;
* :func:`regime_function` — one per-head quantity summarised by regime: mean with a bootstrap
  interval (``scipy.stats.bootstrap``, percentile method) and a Kruskal–Wallis test of whether the
  regimes differ (``scipy.stats.kruskal``, over the regimes with at least two heads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from torch import Tensor

from tl_geometry.capture.tables import attention_rows, check_heads, effect_frame, select_query_pos
from tl_geometry.errors import InputError
from tl_geometry.taxonomy.classify import ALL_LABELS, classify_heads

#: Per-head value columns recognised without ``value=``, in this order.
KNOWN_VALUES = ("effect", "delta_loss", "delta_nll_rel")
JOIN_KEYS = ["layer", "head"]


def _per_head(effects: Any, value: str | None) -> tuple[pd.DataFrame, str]:
    """The per-head frame and its value column, from a frame or a [n_layers, n_heads] tensor."""
    if isinstance(effects, Tensor):
        name = value or "effect"
        return effect_frame(effects, name), name
    if not isinstance(effects, pd.DataFrame) or set(JOIN_KEYS) - set(effects.columns):
        raise InputError(
            "effects must be a DataFrame with layer and head columns (tlg.intervention.patching.head_out, tlg.intervention.patching."
            "mean_ablation, the localised loss) or a [n_layers, n_heads] tensor"
        )
    frame = effects
    if "unit" in frame.columns:  # tlg.localized_loss: per-head rows only
        frame = frame[frame["unit"] == "head"]
        if frame.empty:
            raise InputError("the localised-loss table has no per-head rows: run tlg.localized_loss(..., unit='head')")
    if "rank_by" in frame.columns:  # rankings: the attention order is the paper's selection
        frame = frame[frame["rank_by"] == "attention"]
    if value is None:
        found = [c for c in KNOWN_VALUES if c in frame.columns]
        if not found:
            raise InputError(f"say which column holds the per-head value: value=... (none of {list(KNOWN_VALUES)})")
        value = found[0]
    elif value not in frame.columns:
        raise InputError(f"value={value!r} is not a column of the effects frame ({list(frame.columns)})")
    if "n" in frame.columns and frame["n"].nunique() > 1:
        raise InputError("the effects frame holds several N: choose one first (frame[frame.n == N])")
    if frame.duplicated(JOIN_KEYS).any():
        frame = frame.groupby(JOIN_KEYS, as_index=False)[value].mean()  # e.g. one row per sequence
    return frame, value


def _labels(heads: Any, result: Any) -> pd.DataFrame:
    if heads is None:
        if result is None:
            raise InputError("join_heads needs the heads table (classify_heads) or a result to classify")
        heads = classify_heads(result)
    check_heads(heads, "join_heads")
    cols = [
        c for c in ("regime", "regime_strict", "regime_nearest", "margin", "deciding", "kv_head") if c in heads.columns
    ]
    return heads[JOIN_KEYS + cols]


def _separability_at(result: Any, n: int, query_pos: int | None) -> pd.DataFrame:
    sep = getattr(result, "separability", None)
    if not isinstance(sep, pd.DataFrame) or sep.empty:
        raise InputError("the result holds no separability table: pass result=None to join without it")
    sep = select_query_pos(attention_rows(sep), query_pos, "separability table")
    grid = sorted(int(x) for x in sep["n"].unique())
    if n not in grid:
        raise InputError(f"N={n} is not on the analysed grid {grid[:12]}{'...' if len(grid) > 12 else ''}: pass n=")
    at = sep[sep["n"] == n].groupby(JOIN_KEYS)[["precision", "recall"]].mean()
    return at.reset_index().assign(n=n)


def join_heads(
    effects: Any,
    heads: pd.DataFrame | None = None,
    result: Any = None,
    *,
    n: int = 4,
    value: str | None = None,
    query_pos: int | None = None,
) -> pd.DataFrame:
    """Join per-head effects with the regimes (both modes) and the separability at one ``N``.

    Parameters
    ----------
    effects : DataFrame with ``layer, head`` (and a value column), or ``[n_layers, n_heads]`` tensor
        A frame with a ``unit`` column (:func:`tl_geometry.localized_loss`) keeps its per-head
        rows, one with a ``rank_by`` column its ``"attention"`` rows; several rows per head (e.g.
        per sequence) are averaged.
    heads : DataFrame, optional
        :func:`classify_heads` output (default: ``classify_heads(result)``).
    result : AnalysisResult, optional
        Adds ``precision`` and ``recall`` (mean over sequences) at ``N = n``.
    n : the selection size of the separability columns (default 4, the paper's operating regime
        ``N in [1, 4]``); must be on the analysed grid.
    value : the value column (default: the first of :data:`KNOWN_VALUES` present; ``"effect"`` for
        a tensor).
    query_pos : the query position of the separability, when it holds several.

    Returns
    -------
    DataFrame, one row per (layer, head) of ``effects`` that has a label: ``layer, head``, the value
    column, the label columns of ``heads`` (``regime``, ``regime_strict``, ``regime_nearest``,
    ``margin``...) and, with a result, ``n, precision, recall``. ``attrs["value"]`` names the value.

    Examples
    --------
    >>> import torch
    >>> from tl_geometry.taxonomy import regime_feature_table
    >>> heads = classify_heads(regime_feature_table(torch.softmax(torch.randn(4, 3, 16), -1), torch.randn(4, 3, 16, 8)))
    >>> table = join_heads(torch.tensor([[0.1, 0.5, 0.2]]), heads)
    >>> table[["layer", "head", "effect"]].shape
    (3, 3)
    """
    frame, name = _per_head(effects, value)
    labels = _labels(heads, result)
    out = frame[JOIN_KEYS + [name]].merge(labels, on=JOIN_KEYS, how="inner")
    if result is not None:
        out = out.merge(_separability_at(result, n, query_pos), on=JOIN_KEYS, how="left")
    out = out.sort_values(JOIN_KEYS).reset_index(drop=True)
    out.attrs["value"] = name
    return out


@dataclass(frozen=True)
class RegimeFunction:
    """One per-head quantity summarised by regime.

    Attributes
    ----------
    table : DataFrame, one row per label with heads: ``regime``, ``n_heads``, ``mean``, ``median``,
        ``ci_low``, ``ci_high`` (bootstrap interval of the mean; NaN with fewer than two heads).
    value : the summarised column.
    mode : the labels used (``"strict"`` or ``"nearest"``).
    statistic, pvalue : Kruskal–Wallis H and its p-value across the regimes with at least two heads
        (NaN when fewer than two such regimes).
    confidence : level of the intervals.
    """

    table: pd.DataFrame
    value: str
    mode: str
    statistic: float
    pvalue: float
    confidence: float


def regime_function(
    result: Any,
    local: Any,
    *,
    heads: pd.DataFrame | None = None,
    mode: str = "strict",
    value: str | None = None,
    include_unclassified: bool = True,
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
) -> RegimeFunction:
    """Does function differ by regime? Per regime: mean of a per-head quantity, bootstrap interval, Kruskal–Wallis.

    Parameters
    ----------
    result : AnalysisResult (``taxonomy=True``) or anything :func:`classify_heads` takes; may be
        None when ``heads`` is given.
    local : per-head frame or ``[n_layers, n_heads]`` tensor: :func:`tl_geometry.localized_loss`
        (``unit="head"``, ``delta_nll_rel``), :func:`tl_geometry.intervention.patching.mean_ablation`
        (``delta_loss``), patching effects.
    heads : the labels (default: ``classify_heads(result, mode=mode)``).
    mode : which labels group the heads (``regime_<mode>``).
    value : the value column (see :func:`join_heads`).
    include_unclassified : keep ``Unclassified`` as a group (strict mode).
    confidence, n_resamples, seed : of ``scipy.stats.bootstrap`` (percentile intervals of the mean).

    Examples
    --------
    >>> import torch
    >>> from tl_geometry.taxonomy import regime_feature_table
    >>> feats = regime_feature_table(torch.softmax(torch.randn(4, 6, 16), -1), torch.randn(4, 6, 16, 8))
    >>> summary = regime_function(feats, torch.rand(1, 6), mode="nearest", n_resamples=99)
    >>> int(summary.table.n_heads.sum())
    6
    """
    from scipy import stats

    if heads is None:
        heads = classify_heads(result, mode=mode)
    table = join_heads(local, heads, value=value)
    name = table.attrs["value"]
    label = f"regime_{mode}" if f"regime_{mode}" in table.columns else "regime"
    groups = {}
    for regime in ALL_LABELS:
        if regime == "Unclassified" and not include_unclassified:
            continue
        x = table.loc[table[label].astype(str) == regime, name].dropna().to_numpy(dtype=np.float64)
        if len(x):
            groups[regime] = x
    rows = []
    for regime, x in groups.items():
        low = high = float("nan")
        if len(x) >= 2 and np.ptp(x) > 0:
            ci = stats.bootstrap(
                (x,),
                np.mean,
                confidence_level=confidence,
                n_resamples=n_resamples,
                method="percentile",
                random_state=seed,
            ).confidence_interval
            low, high = float(ci.low), float(ci.high)
        elif len(x) >= 2:
            low = high = float(x[0])
        rows.append(
            {
                "regime": regime,
                "n_heads": len(x),
                "mean": float(x.mean()),
                "median": float(np.median(x)),
                "ci_low": low,
                "ci_high": high,
            }
        )
    testable = [x for x in groups.values() if len(x) >= 2]
    statistic = pvalue = float("nan")
    if len(testable) >= 2 and np.ptp(np.concatenate(testable)) > 0:
        statistic, pvalue = (float(v) for v in stats.kruskal(*testable))
    summary = pd.DataFrame(rows, columns=["regime", "n_heads", "mean", "median", "ci_low", "ci_high"])
    summary["regime"] = pd.Categorical(summary["regime"], categories=list(ALL_LABELS))
    return RegimeFunction(summary, name, mode, statistic, pvalue, confidence)
