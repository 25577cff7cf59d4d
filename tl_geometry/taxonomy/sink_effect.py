"""The sink effect (definitions §5; paper §4.1, Figure 6): does ``rho_0`` predict recall across heads?

Columns: docs/columns.md#figure-tables-of-the-taxonomy.

For every ``N``: take, per (layer, head), the mean of ``recall(N)`` over the sequences of the
separability table, pair it with the head's ``rho_0`` (the sink similarity of its key/value head,
definitions §3), and correlate the two across the (layer, head) pairs, with Pearson's ``r`` and
Spearman's ``rho`` (Pearson's ``r`` of the ranks, ties given their average rank). Heads whose
mean recall or ``rho_0`` is not finite are left out; ``n_heads`` counts the pairs used. A
correlation is NaN when fewer than two heads remain or when one side is constant across heads
(e.g. ``N = 1`` and ``N = K``, where recall is 1 in every head).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tl_geometry.capture.tables import attention_rows, select_query_pos
from tl_geometry.errors import InputError
from tl_geometry.io.row_sums import group_sums, is_sums_table, means_of_sums

SINK_EFFECT_COLUMNS = ["n", "pearson", "spearman", "n_heads"]


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's correlation of two 1-D arrays (NaN for fewer than 2 points or a constant side)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise InputError(f"pearson needs two 1-D arrays of one length, got {x.shape} and {y.shape}")
    if len(x) < 2:
        return float("nan")
    dx, dy = x - x.mean(), y - y.mean()
    sxx, syy = float(dx @ dx), float(dy @ dy)
    # a side whose spread is only rounding noise around its mean counts as constant
    for v, ss in ((x, sxx), (y, syy)):
        if ss <= len(v) * (1e-12 * float(np.abs(v).max())) ** 2:
            return float("nan")
    return float(np.clip((dx @ dy) / np.sqrt(sxx * syy), -1.0, 1.0))


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``x``, tied values sharing the mean of their ranks (scipy's ``rankdata``)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    # start index of each run of equal values, and the run each sorted element belongs to
    new_run = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
    run_id = np.cumsum(new_run) - 1
    starts = np.flatnonzero(new_run)
    ends = np.r_[starts[1:], len(x)]  # exclusive
    mean_rank = (starts + 1 + ends) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = mean_rank[run_id]
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation: Pearson's ``r`` of the average ranks."""
    return pearson(average_ranks(x), average_ranks(y))


#: Mean recalls (in [0, 1]) that agree to this many decimals are ties for Spearman's ranks.
TIE_DECIMALS = 12


def rho0_table(features: pd.DataFrame) -> pd.DataFrame:
    """One row per (layer, head[, query_pos]) with ``kv_head`` and ``rho_0`` from a features table."""
    cols = [c for c in ("layer", "head", "kv_head", "query_pos", "rho_0") if c in features.columns]
    if "rho_0" not in cols or "layer" not in cols:
        raise InputError("the table has no layer / rho_0 columns")
    keys = [c for c in cols if c != "rho_0"]
    return features[cols].drop_duplicates(keys).reset_index(drop=True)


def sink_effect(separability: pd.DataFrame, rho0: pd.DataFrame, *, query_pos: int | None = None) -> pd.DataFrame:
    """Per ``N``: correlation across (layer, head) of the mean ``recall(N)`` with ``rho_0`` (Fig. 6).

    Parameters
    ----------
    separability : DataFrame
        ``AnalysisResult.separability`` (columns ``seq, layer, head, query_pos, n, recall``...), or
        its sums table (``AnalysisResult.separability_sums()``, read from disk in batches).
        ``recall(N)`` is averaged over its sequences per (layer, head, N).
    rho0 : DataFrame
        ``rho_0`` per ``(layer, head)`` (e.g. :func:`rho0_table` of a features table), or per
        ``(layer, kv_head)`` (e.g. the diagnostics' similarity table), mapped to the query heads
        through the separability table's ``kv_head`` column. A ``query_pos`` column, if present,
        is matched too.
    query_pos : int, optional
        The query position to use when the tables hold several.

    Returns
    -------
    DataFrame with columns ``n, pearson, spearman, n_heads``, one row per ``N``. Spearman's ranks
    treat mean recalls equal to :data:`TIE_DECIMALS` decimals as ties (equal up to rounding).
    """
    need = {"layer", "head", "n", "recall"}
    if need - set(separability.columns):
        raise InputError(f"separability table lacks columns {sorted(need - set(separability.columns))}")
    if "rho_0" not in rho0.columns or "layer" not in rho0.columns:
        raise InputError("rho0 table needs columns layer, rho_0 and head or kv_head")
    sep = select_query_pos(attention_rows(separability), query_pos, "separability table")
    rho = select_query_pos(rho0, query_pos, "rho0 table")
    group = ["layer", "head"] + (["kv_head"] if "kv_head" in sep.columns else [])
    sums = sep if is_sums_table(sep) else group_sums(sep[[*group, "n", "recall"]], [*group, "n"])
    recall = means_of_sums(sums, [*group, "n"])[[*group, "n", "recall"]]
    if "head" in rho.columns:
        on = ["layer", "head"]
    elif "kv_head" in rho.columns and "kv_head" in recall.columns:
        on = ["layer", "kv_head"]
    else:
        raise InputError("rho0 table needs a head or a kv_head column (and the separability table kv_head)")
    rho = rho[on + ["rho_0"]]
    if rho.duplicated(on).any():
        raise InputError(f"rho0 table has several rows per {on}; give one rho_0 per head")
    merged = recall.merge(rho, on=on, how="inner")
    rows = []
    for n, part in merged.groupby("n", sort=True):
        ok = np.isfinite(part["recall"].to_numpy()) & np.isfinite(part["rho_0"].to_numpy())
        x, y = part["recall"].to_numpy()[ok], part["rho_0"].to_numpy()[ok]
        # mean recalls equal up to rounding (summed in another order) are ties for the ranks
        tied = np.round(x, TIE_DECIMALS)
        rows.append({"n": int(n), "pearson": pearson(x, y), "spearman": spearman(tied, y), "n_heads": int(ok.sum())})
    out = pd.DataFrame(rows, columns=SINK_EFFECT_COLUMNS)
    return out.astype({"n": "int64", "n_heads": "int64"})
