"""Head regimes: Retriever, Reset, Mixer or Unclassified (definitions §5; paper §4.2, Figures 7, 8, 10).

:func:`head_features` summarises the sequence-mean curves of the features table per (layer, head)
(quantiles and small-/large-``N`` window means of ``cos(s(N), v_0)`` and ``cos(s(N), v_L)``).
:func:`classify_heads` picks a *candidate* from the order of ``c_sink``, ``c_last``, ``c_rest`` and
*confirms* it by the alignment conditions; every condition has a slack (>= 0 when it holds) and a
regime's score is its smallest slack::

    Retriever: c_last largest,            cos_vL_low >= retriever_cos
    Reset:     c_sink largest or c_last smallest,  cos_vL_high <= reset_cos
    Mixer:     c_sink <= c_last <= c_rest, shift_v0 <= -mixer_shift, shift_vL >= mixer_shift

``mode="strict"`` labels only confirmed candidates; ``mode="nearest"`` takes the largest score.
Details (slacks, margins, thresholds and why): docs/taxonomy.md §2; columns:
docs/columns.md#heads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from tl_geometry.capture.tables import select_query_pos
from tl_geometry.errors import InputError

#: Why a features table must be cut to one query position before averaging over N.
_ONE_K_HINT = " (curves over N of rows with different K are not averaged together)"

REGIMES = ("Retriever", "Reset", "Mixer")
UNCLASSIFIED = "Unclassified"
ALL_LABELS = REGIMES + (UNCLASSIFIED,)

#: Conditions of each regime, as ``(regime, condition name)``; the slack column is
#: ``slack_<regime lower>_<condition>``. The first condition of each is its *order* condition
#: (the candidate), the others its *alignment* conditions (the confirmation).
CONDITIONS = {
    "Retriever": ("order", "alignment"),
    "Reset": ("order", "alignment"),
    "Mixer": ("order", "sink_falls", "last_rises"),
}
MODES = ("strict", "nearest")
_TINY = np.finfo(np.float64).tiny


@dataclass(frozen=True)
class RegimeThresholds:
    """Thresholds of the head taxonomy (definitions §5). Every one is a keyword of :func:`classify_heads`.

    Attributes
    ----------
    retriever_dominance : float, default 1.0
        Retriever's order condition: ``c_last >= retriever_dominance * max(c_sink, c_rest)``. 1.0
        is definitions §5's "c_last is the largest of the three"; above 1 asks for a clear lead.
    retriever_cos : float, default 0.5
        Retriever needs ``cos(s(N), v_L) >= retriever_cos`` on at least ``stay_share`` of the
        grid. 0.5 (60 degrees): the projection of ``s`` on ``v_L`` is at least half of ``||s||``;
        four standard deviations of the cosine of two random directions in ``d = 64``
        (``1 / sqrt(d) = 0.125``).
    reset_dominance : float, default 1.0
        Reset's sink branch: ``c_sink >= reset_dominance * max(c_last, c_rest)``; 1.0 is
        definitions §5's "c_sink the largest". (Reset's other branch, ``c_last`` the smallest,
        has no threshold: it is an order.)
    reset_cos : float, default 0.3
        Reset needs ``cos(s(N), v_L) <= reset_cos`` on at least ``stay_share`` of the grid: less
        than 9 % of ``||s||^2`` along ``v_L``. Kept below ``retriever_cos`` so that a head in the
        gap is confirmed as neither.
    mixer_shift : float, default 0.1
        Mixer needs ``cos(s, v_0)`` to fall and ``cos(s, v_L)`` to rise by at least this much
        between the small-N and large-N windows. The std over sequences of these cosines is
        typically 0.15 (SmolLM2, python_docs), so with 8 sequences the standard error of a mean
        is about 0.05 and 0.1 is two standard errors.
    n_small : int, default 4
        Small-N window ``N <= n_small``: the paper's operating regime ``N in [1, 4]``.
    large_frac : float, default 0.5
        Large-N window ``N >= large_frac * K``; it ends with ``s(K)``, the head's output.
    stay_share : float, default 0.75
        "Stays high / low across N" means on at least this share of the analysed grid.
    """

    retriever_dominance: float = 1.0
    retriever_cos: float = 0.5
    reset_dominance: float = 1.0
    reset_cos: float = 0.3
    mixer_shift: float = 0.1
    n_small: int = 4
    large_frac: float = 0.5
    stay_share: float = 0.75

    def __post_init__(self) -> None:
        for name in ("retriever_dominance", "reset_dominance"):
            if not getattr(self, name) > 0:
                raise InputError(f"{name} must be positive (a ratio of norms), got {getattr(self, name)}")
        if not 0 < self.large_frac <= 1:
            raise InputError(f"large_frac must be in (0, 1], got {self.large_frac}")
        if not 0.5 <= self.stay_share <= 1:
            raise InputError(f"stay_share must be in [0.5, 1], got {self.stay_share}")
        if self.n_small < 1:
            raise InputError(f"n_small must be at least 1, got {self.n_small}")

    @classmethod
    def of(cls, **overrides: Any) -> "RegimeThresholds":
        """Defaults with ``overrides``; an unknown name is an :class:`InputError`."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise InputError(f"unknown thresholds {unknown}; known: {sorted(known)}")
        return cls(**overrides)


#: The per-head columns that are the same on every row of a head (taken from its first row).
PER_HEAD_COLUMNS = [
    "kv_head",
    "query_pos",
    "n_keys",
    "n_seqs",
    "c_sink",
    "c_sink_std",
    "c_last",
    "c_last_std",
    "c_rest",
    "c_rest_std",
    "rho_0",
    "rho_0_std",
]
HEAD_FEATURE_COLUMNS = [
    "layer",
    "head",
    *PER_HEAD_COLUMNS,
    "cos_vL_low",
    "cos_vL_high",
    "cos_v0_small",
    "cos_v0_large",
    "shift_v0",
    "cos_vL_small",
    "cos_vL_large",
    "shift_vL",
    "drop_sink",
    "drop_last",
]


def head_features(
    features: pd.DataFrame,
    *,
    query_pos: int | None = None,
    n_small: int = RegimeThresholds.n_small,
    large_frac: float = RegimeThresholds.large_frac,
    stay_share: float = RegimeThresholds.stay_share,
) -> pd.DataFrame:
    """Per-(layer, head) summary of a features table (columns :data:`HEAD_FEATURE_COLUMNS`).

    Parameters
    ----------
    features : DataFrame
        The per-(layer, head, query_pos, n) table of
        :meth:`tl_geometry.taxonomy.TaxonomyObserver.features` (sequence means).
    query_pos : int, optional
        The query position to summarise; needed only when the table holds several.
    n_small, large_frac, stay_share
        Windows and quantile of the summary (see the module docstring and :class:`RegimeThresholds`).

    Returns
    -------
    DataFrame, one row per (layer, head): the sequence-mean scalars (``c_*``, ``rho_0`` and their
    std over sequences), the curve summaries, ``n_keys`` (``K``) and ``n_seqs``.
    """
    RegimeThresholds(n_small=n_small, large_frac=large_frac, stay_share=stay_share)  # validates
    missing = {"layer", "head", "query_pos", "n", "cos_s_v0", "cos_s_vL", "norm_s"} - set(features.columns)
    if missing:
        raise InputError(f"not a features table (missing columns {sorted(missing)}); use TaxonomyObserver.features()")
    t = select_query_pos(features, query_pos, hint=_ONE_K_HINT).sort_values(["layer", "head", "n"], kind="stable")
    if t.empty:
        raise InputError("the features table is empty: observe some sequences first")
    t = t.assign(n_keys=t["query_pos"] + 1)
    keys = ["layer", "head"]
    g = t.groupby(keys, sort=True)
    first = g[PER_HEAD_COLUMNS].first()
    out = first.copy()
    out["cos_vL_low"] = g["cos_s_vL"].quantile(1 - stay_share)
    out["cos_vL_high"] = g["cos_s_vL"].quantile(stay_share)

    n_min = g["n"].transform("min")
    n_max = g["n"].transform("max")
    small = t["n"] <= np.maximum(n_small, n_min)
    large = t["n"] >= np.minimum(large_frac * t["n_keys"], n_max)
    for name, curve in (("v0", "cos_s_v0"), ("vL", "cos_s_vL")):
        out[f"cos_{name}_small"] = t[small].groupby(keys)[curve].mean()
        out[f"cos_{name}_large"] = t[large].groupby(keys)[curve].mean()
        out[f"shift_{name}"] = out[f"cos_{name}_large"] - out[f"cos_{name}_small"]
    for name, loo in (("sink", "norm_s_minus_sink"), ("last", "norm_s_minus_last")):
        ratio = 1 - t[loo] / t["norm_s"].where(t["norm_s"] > 0)
        out[f"drop_{name}"] = ratio.groupby([t["layer"], t["head"]]).median()
    return out.reset_index()[HEAD_FEATURE_COLUMNS]


def _log_ratio(a: pd.Series, b: pd.Series) -> pd.Series:
    return np.log(np.maximum(a, _TINY)) - np.log(np.maximum(b, _TINY))


def _slacks(h: pd.DataFrame, th: RegimeThresholds) -> dict[str, pd.Series]:
    """Every condition's slack (>= 0 iff it holds), named ``slack_<regime>_<condition>``."""
    sink, last, rest = h["c_sink"], h["c_last"], h["c_rest"]
    sink_largest = _log_ratio(sink, np.maximum(last, rest)) - math.log(th.reset_dominance)
    last_smallest = _log_ratio(np.minimum(sink, rest), last)
    return {
        "slack_retriever_order": _log_ratio(last, np.maximum(sink, rest)) - math.log(th.retriever_dominance),
        "slack_retriever_alignment": h["cos_vL_low"] - th.retriever_cos,
        "slack_reset_order": np.maximum(sink_largest, last_smallest),
        "slack_reset_alignment": th.reset_cos - h["cos_vL_high"],
        "slack_mixer_order": np.minimum(_log_ratio(last, sink), _log_ratio(rest, last)),
        "slack_mixer_sink_falls": -h["shift_v0"] - th.mixer_shift,
        "slack_mixer_last_rises": h["shift_vL"] - th.mixer_shift,
    }


def _as_head_table(obj: Any, query_pos: int | None, th: RegimeThresholds) -> pd.DataFrame:
    table = obj
    if not isinstance(obj, pd.DataFrame):
        table = getattr(obj, "regime_features", None)
        if not isinstance(table, pd.DataFrame):
            raise InputError(
                f"classify_heads needs a features table or a result holding one; {type(obj).__name__} has no "
                "`regime_features` DataFrame (run a TaxonomyObserver and pass observer.features())"
            )
    if "n" in table.columns:
        return head_features(
            table, query_pos=query_pos, n_small=th.n_small, large_frac=th.large_frac, stay_share=th.stay_share
        )
    missing = set(HEAD_FEATURE_COLUMNS) - set(table.columns)
    if missing:
        raise InputError(f"not a features or head-features table (missing columns {sorted(missing)})")
    return select_query_pos(table, query_pos, hint=_ONE_K_HINT)[HEAD_FEATURE_COLUMNS]


def classify_heads(obj: Any, *, mode: str = "strict", query_pos: int | None = None, **thresholds: Any) -> pd.DataFrame:
    """Label every (layer, head) Retriever, Reset, Mixer or Unclassified (definitions §5).

    Parameters
    ----------
    obj : DataFrame or result
        A features table (:meth:`TaxonomyObserver.features`, one row per ``(layer, head,
        query_pos, n)``), a head-features table (:func:`head_features`), or an object with a
        ``regime_features`` DataFrame attribute (an :class:`~tl_geometry.AnalysisResult` that
        ran the taxonomy observer).
    mode : {"strict", "nearest"}, default "strict"
        ``"strict"``: an unconfirmed candidate is ``Unclassified``. ``"nearest"``: every head
        takes the regime it misses least (see the module docstring).
    query_pos : int, optional
        Which query position to classify when the table holds several.
    **thresholds
        Any field of :class:`RegimeThresholds` (``retriever_dominance=1.0, retriever_cos=0.5,
        reset_dominance=1.0, reset_cos=0.3, mixer_shift=0.1, n_small=4, large_frac=0.5,
        stay_share=0.75``).

    Returns
    -------
    DataFrame, one row per (layer, head): ``regime`` (the label of ``mode``), ``margin`` and
    ``deciding`` (of ``mode``), ``regime_strict`` and ``regime_nearest`` (both labels),
    ``candidate`` (from the order of the contributions; ``None`` when no order condition holds),
    ``confirmed``, ``score_retriever``, ``score_reset``, ``score_mixer`` (smallest slack of each
    regime; it holds iff >= 0), every ``slack_*`` and every head feature
    (:data:`HEAD_FEATURE_COLUMNS`). ``attrs["thresholds"]`` records the thresholds used and
    ``attrs["mode"]`` the mode.

    Examples
    --------
    >>> import torch
    >>> from tl_geometry.taxonomy import classify_heads, regime_feature_table
    >>> w = torch.softmax(torch.randn(4, 3, 32), -1)   # [seq, head, key] weights
    >>> v = torch.randn(4, 3, 32, 8)                   # [seq, head, key, d_head] values
    >>> heads = classify_heads(regime_feature_table(w, v), mode="nearest")
    >>> bool(heads.regime.isin(["Retriever", "Reset", "Mixer"]).all())   # nearest labels every head
    True
    """
    if mode not in MODES:
        raise InputError(f"mode must be one of {list(MODES)}, got {mode!r}")
    th = RegimeThresholds.of(**thresholds)
    h = _as_head_table(obj, query_pos, th).reset_index(drop=True)
    slacks = pd.DataFrame(_slacks(h, th))
    labels = _decide(slacks)
    chosen = labels[mode]
    out = pd.DataFrame(
        {
            "layer": h["layer"],
            "head": h["head"],
            "regime": _categorical(chosen["label"]),
            "margin": chosen["margin"],
            "deciding": chosen["deciding"],
            "regime_strict": _categorical(labels["strict"]["label"]),
            "regime_nearest": _categorical(labels["nearest"]["label"]),
            "candidate": labels["candidate"],
            "confirmed": labels["confirmed"],
            **{f"score_{r.lower()}": labels["scores"][:, i] for i, r in enumerate(REGIMES)},
        }
    )
    out = pd.concat([out, slacks, h.drop(columns=["layer", "head"])], axis=1)
    out.attrs["thresholds"] = asdict(th)
    out.attrs["mode"] = mode
    return out


def _categorical(labels: np.ndarray) -> pd.Categorical:
    return pd.Categorical(labels, categories=list(ALL_LABELS))


def _decide(slacks: pd.DataFrame) -> dict[str, Any]:
    """Candidate, scores and both modes' labels, margins and deciding slacks from the slacks."""
    rows = np.arange(len(slacks))
    order = np.stack([slacks[f"slack_{r.lower()}_order"].to_numpy() for r in REGIMES], axis=1)  # [heads, 3]
    columns = [[f"slack_{r.lower()}_{c}" for c in CONDITIONS[r]] for r in REGIMES]
    blocks = [slacks[cols].to_numpy() for cols in columns]
    scores = np.stack([b.min(axis=1) for b in blocks], axis=1)  # [heads, 3]
    tightest = np.stack([np.array(cols)[b.argmin(axis=1)] for cols, b in zip(columns, blocks)], axis=1)

    cand = order.argmax(axis=1)
    has_candidate = order[rows, cand] >= 0
    confirmed = has_candidate & (scores[rows, cand] >= 0)
    regimes = np.array(REGIMES, dtype=object)
    candidate = np.where(has_candidate, regimes[cand], None)

    # strict: the confirmed candidate, its score as margin; else the regime closest to holding
    closest = np.abs(scores).argmin(axis=1)
    strict_idx = np.where(confirmed, cand, closest)
    strict = {
        "label": np.where(confirmed, regimes[cand], UNCLASSIFIED),
        "margin": np.abs(scores[rows, strict_idx]),
        "deciding": tightest[rows, strict_idx],
    }
    # nearest: the confirmed candidate, else the largest score; margin: lead over the runner-up
    nearest_idx = np.where(confirmed, cand, scores.argmax(axis=1))
    others = np.where(np.arange(len(REGIMES))[None, :] == nearest_idx[:, None], -np.inf, scores)
    nearest = {
        "label": regimes[nearest_idx],
        "margin": scores[rows, nearest_idx] - others.max(axis=1),
        "deciding": tightest[rows, nearest_idx],
    }
    return {"strict": strict, "nearest": nearest, "candidate": candidate, "confirmed": confirmed, "scores": scores}
