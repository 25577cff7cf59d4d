"""Tables built on the head labels: regime shares by depth (Figure 8), precision / recall by regime

Columns: docs/columns.md#figure-tables-of-the-taxonomy.
(Figure 11) and the stability of the labels between disjoint halves of the sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tl_geometry.capture.tables import attention_rows, check_heads, select_query_pos
from tl_geometry.io.row_sums import group_sums, is_sums_table, means_of_sums
from tl_geometry.taxonomy.classify import ALL_LABELS, classify_heads

SHARE_COLUMNS = ["layer", "regime", "n_heads", "share"]
PR_COLUMNS = [
    "regime",
    "n",
    "precision",
    "precision_std",
    "recall",
    "recall_std",
    "f_at_rmax",
    "f_at_rmin",
    "n_heads",
    "n_rows",
]


def regime_shares(heads: pd.DataFrame) -> pd.DataFrame:
    """Share of each regime among the heads of each layer (Figure 8), long form.

    One row per (layer, regime) for all four labels (zero counts included): ``n_heads`` and
    ``share = n_heads / heads in the layer``.
    """
    check_heads(heads, "regime_shares")
    counts = pd.crosstab(heads["layer"], pd.Categorical(heads["regime"], categories=list(ALL_LABELS)), dropna=False)
    counts = counts.reindex(columns=list(ALL_LABELS), fill_value=0)
    long = counts.stack().rename("n_heads").reset_index()
    long.columns = ["layer", "regime", "n_heads"]
    long["share"] = long["n_heads"] / long.groupby("layer")["n_heads"].transform("sum")
    long["regime"] = pd.Categorical(long["regime"], categories=list(ALL_LABELS))
    return long.sort_values(["layer", "regime"]).reset_index(drop=True)[SHARE_COLUMNS]


def regime_pr_curves(separability: pd.DataFrame, heads: pd.DataFrame, *, query_pos: int | None = None) -> pd.DataFrame:
    """Mean precision and recall per ``N`` for each regime (Figure 11).

    Per (layer, head, N) the metrics are first averaged over the sequences of ``separability``;
    then, per (regime, N), averaged over the heads of that regime (``*_std``: population std across
    those heads). ``n_heads`` heads and ``n_rows`` separability rows enter each mean. Regimes
    without heads have no rows.

    Parameters
    ----------
    separability : ``AnalysisResult.separability``, or its sums table (``AnalysisResult.separability_sums()``).
    heads : :func:`classify_heads` output (one query position).
    query_pos : int, optional; needed when ``separability`` holds several query positions.
    """
    check_heads(heads, "regime_pr_curves")
    sep = select_query_pos(attention_rows(separability), query_pos, "separability table")
    metrics = ["precision", "recall", "f_at_rmax", "f_at_rmin"]
    keys = ["layer", "head", "n"]
    sums = sep if is_sums_table(sep) else group_sums(sep[[*keys, *metrics]], keys)
    per_head = means_of_sums(sums, keys)[[*keys, *metrics, "n_rows"]]
    per_head = per_head.merge(heads[["layer", "head", "regime"]], on=["layer", "head"], how="inner")
    g = per_head.groupby(["regime", "n"], observed=True)
    out = g[metrics].mean()
    out["precision_std"] = g["precision"].std(ddof=0)
    out["recall_std"] = g["recall"].std(ddof=0)
    out["n_heads"] = g.size()
    out["n_rows"] = g["n_rows"].sum()
    out = out.reset_index()
    out["regime"] = pd.Categorical(out["regime"], categories=list(ALL_LABELS))
    return out.sort_values(["regime", "n"]).reset_index(drop=True)[PR_COLUMNS]


@dataclass(frozen=True)
class ClassificationStability:
    """Labels of two disjoint sets of sequences, head by head.

    Attributes
    ----------
    table : DataFrame, one row per (layer, head) present in both: ``regime_a``, ``regime_b``,
        ``margin_a``, ``margin_b``, ``changed``.
    n_changed : number of heads whose label differs.
    n_heads : number of heads compared.
    """

    table: pd.DataFrame
    n_changed: int
    n_heads: int

    @property
    def share_changed(self) -> float:
        return self.n_changed / self.n_heads if self.n_heads else float("nan")

    def transitions(self) -> pd.DataFrame:
        """Counts of (label on the first half, label on the second half), all four labels."""
        cats = list(ALL_LABELS)
        return pd.crosstab(
            pd.Categorical(self.table["regime_a"], categories=cats),
            pd.Categorical(self.table["regime_b"], categories=cats),
            rownames=["regime_a"],
            colnames=["regime_b"],
            dropna=False,
        )


def classification_stability(
    first: Any, second: Any, *, mode: str = "strict", query_pos: int | None = None, **thresholds: Any
) -> ClassificationStability:
    """Classify two disjoint halves of the sequences separately and count the labels that change.

    ``first`` and ``second`` are anything :func:`classify_heads` takes, typically
    ``observer.features(0)`` and ``observer.features(1)`` of a
    ``TaxonomyObserver(info, ns, parts=halves(n_seqs))``. The same ``mode`` (``"strict"`` or
    ``"nearest"``) and ``thresholds`` apply to both.
    """
    a = classify_heads(first, mode=mode, query_pos=query_pos, **thresholds)
    b = classify_heads(second, mode=mode, query_pos=query_pos, **thresholds)
    both = a[["layer", "head", "regime", "margin"]].merge(
        b[["layer", "head", "regime", "margin"]], on=["layer", "head"], suffixes=("_a", "_b"), how="inner"
    )
    both["changed"] = both["regime_a"].astype(str).to_numpy() != both["regime_b"].astype(str).to_numpy()
    return ClassificationStability(table=both, n_changed=int(np.sum(both["changed"])), n_heads=len(both))
