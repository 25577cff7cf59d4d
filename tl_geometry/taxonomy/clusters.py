"""Are the three regimes real? Cluster the heads on their Figure 7 features (definitions §5).

Per (layer, head) the cluster features are the mean curves ``cos(s(N), v_0)`` and
``cos(s(N), v_L)`` at every ``N`` of the grid and the log contribution shares
``log(c_x / (c_sink + c_last + c_rest))``; standardised, they are clustered by k-means for every
``k``, scored by the mean silhouette, and compared at ``k = 3`` with the rule labels (adjusted Rand
index). The data claim clusters only when the best silhouette reaches
:data:`STRUCTURE_SILHOUETTE` (0.5, Kaufman and Rousseeuw). Details: docs/taxonomy.md §5;
columns: docs/columns.md#regime-clusters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import pandas as pd

from tl_geometry.errors import InputError
from tl_geometry.taxonomy.classify import ALL_LABELS, MODES, classify_heads

#: Best mean silhouette from which the clustering is taken as structure (Kaufman and Rousseeuw).
STRUCTURE_SILHOUETTE = 0.5
#: The number of clusters compared with the three rule regimes.
RULE_K = 3
_TINY = np.finfo(np.float64).tiny


@dataclass(frozen=True)
class RegimeClusters:
    """k-means clusterings of the heads on their standardised Figure 7 features.

    Attributes
    ----------
    features : DataFrame, one row per (layer, head): ``layer``, ``head``, then the raw features
        (``cos_v0_n{N}``, ``cos_vL_n{N}`` per ``N`` of the grid, ``log_share_sink``,
        ``log_share_last``, ``log_share_rest``).
    standardized : [heads, features] float64 array, the standardised features (row order of
        ``features``).
    labels : DataFrame, one row per (layer, head): ``layer``, ``head``, ``regime_strict``,
        ``regime_nearest`` and ``cluster_k{k}`` for every ``k``.
    silhouette : DataFrame, one row per ``k``: ``k``, ``silhouette`` (mean over heads),
        ``inertia`` (k-means' within-cluster sum of squares).
    agreement : DataFrame, one row per mode (``strict``, ``nearest``): ``mode``, ``k`` (3),
        ``ari`` (adjusted Rand index of the k = 3 clusters with that mode's labels).
    contingency : dict mode -> DataFrame, rule label (rows, all four) x cluster (columns), head
        counts.
    seed : int
    """

    features: pd.DataFrame
    standardized: np.ndarray = field(repr=False)
    labels: pd.DataFrame = field(repr=False)
    silhouette: pd.DataFrame = field(repr=False)
    agreement: pd.DataFrame = field(repr=False)
    contingency: dict[str, pd.DataFrame] = field(repr=False)
    seed: int = 0

    @property
    def best_k(self) -> int:
        """The ``k`` with the largest mean silhouette."""
        return int(self.silhouette.loc[self.silhouette["silhouette"].idxmax(), "k"])

    @property
    def has_structure(self) -> bool:
        """Whether the best mean silhouette reaches :data:`STRUCTURE_SILHOUETTE`."""
        return bool(self.silhouette["silhouette"].max() >= STRUCTURE_SILHOUETTE)

    def __repr__(self) -> str:
        best = self.silhouette["silhouette"].max()
        return (
            f"RegimeClusters(heads={len(self.features)}, k={self.silhouette['k'].tolist()}, "
            f"best silhouette {best:.3f} at k={self.best_k}, has_structure={self.has_structure})"
        )


def cluster_features(obj: Any, *, query_pos: int | None = None) -> pd.DataFrame:
    """The per-head cluster features (see the module docstring) of a features table or a result.

    Returns a DataFrame, one row per (layer, head): ``layer``, ``head``, ``cos_v0_n{N}`` and
    ``cos_vL_n{N}`` for every ``N`` of the grid (ascending), ``log_share_sink``,
    ``log_share_last``, ``log_share_rest``.
    """
    table = obj if isinstance(obj, pd.DataFrame) else getattr(obj, "regime_features", None)
    if not isinstance(table, pd.DataFrame) or {"n", "cos_s_v0", "cos_s_vL", "c_sink"} - set(table.columns):
        raise InputError(
            "regime_clusters needs the per-N features table: run tlg.analyze(..., taxonomy=True) and pass the "
            "result, or pass TaxonomyObserver.features()"
        )
    from tl_geometry.capture.tables import select_query_pos

    t = select_query_pos(table, query_pos, "features table", " (curves over N of different K are not clustered)")
    if t.empty:
        raise InputError("the features table is empty: observe some sequences first")
    curves = t.pivot_table(index=["layer", "head"], columns="n", values=["cos_s_v0", "cos_s_vL"], aggfunc="first")
    if curves.isna().any().any():
        raise InputError("the heads of the features table do not share one grid of N: analyse them together")
    curves.columns = [f"cos_{'v0' if name == 'cos_s_v0' else 'vL'}_n{int(n)}" for name, n in curves.columns]
    scalars = t.groupby(["layer", "head"])[["c_sink", "c_last", "c_rest"]].first()
    total = scalars.sum(axis=1)
    shares = np.log(np.maximum(scalars.div(total.where(total > 0), axis=0).fillna(0).to_numpy(), _TINY))
    out = curves.copy()
    for i, name in enumerate(("sink", "last", "rest")):
        out[f"log_share_{name}"] = shares[:, i]
    return out.reset_index()


def regime_clusters(
    obj: Any,
    k: Iterable[int] = range(2, 7),
    *,
    seed: int = 0,
    query_pos: int | None = None,
    **thresholds: Any,
) -> RegimeClusters:
    """Cluster the heads on their standardised Figure 7 features and compare with the rule labels.

    Parameters
    ----------
    obj : AnalysisResult (``taxonomy=True``) or the per-N features table of
        :meth:`TaxonomyObserver.features` / :func:`regime_feature_table`.
    k : the numbers of clusters (each in ``2 .. heads - 1``); ``3`` is always added for the
        agreement with the three rule regimes.
    seed : ``random_state`` of k-means: the same seed gives the same clusters.
    query_pos : the query position, when the table holds several.
    **thresholds : passed to :func:`classify_heads` for the rule labels of both modes.

    Returns
    -------
    :class:`RegimeClusters`: ``.silhouette`` per ``k``, ``.agreement`` (ARI of ``k = 3`` with the
    strict and nearest labels), ``.contingency``, ``.has_structure``.

    Examples
    --------
    >>> import torch
    >>> from tl_geometry.taxonomy import regime_clusters, regime_feature_table
    >>> w = torch.softmax(3 * torch.randn(8, 12, 32, generator=torch.Generator().manual_seed(0)), -1)
    >>> v = torch.randn(8, 12, 32, 8, generator=torch.Generator().manual_seed(1))
    >>> clusters = regime_clusters(regime_feature_table(w, v), k=[2, 3, 4])
    >>> clusters.silhouette.k.tolist()
    [2, 3, 4]
    """
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score, silhouette_score
    from sklearn.preprocessing import StandardScaler

    ks = sorted({int(x) for x in k} | {RULE_K})
    features = cluster_features(obj, query_pos=query_pos)
    n_heads = len(features)
    bad = [x for x in ks if not 2 <= x < n_heads]
    if bad:
        raise InputError(f"k={bad}: each k must be in 2..{n_heads - 1} (there are {n_heads} heads)")
    table = obj if isinstance(obj, pd.DataFrame) else obj.regime_features
    rules = classify_heads(table, query_pos=query_pos, **thresholds)
    labels = features[["layer", "head"]].merge(
        rules[["layer", "head", "regime_strict", "regime_nearest"]], on=["layer", "head"], how="left"
    )
    x = StandardScaler().fit_transform(features.drop(columns=["layer", "head"]).to_numpy(dtype=np.float64))
    rows = []
    for n_clusters in ks:
        model = KMeans(n_clusters=n_clusters, n_init=10, random_state=seed).fit(x)
        labels[f"cluster_k{n_clusters}"] = model.labels_
        score = silhouette_score(x, model.labels_) if len(set(model.labels_)) > 1 else float("nan")
        rows.append({"k": n_clusters, "silhouette": float(score), "inertia": float(model.inertia_)})
    silhouette = pd.DataFrame(rows)
    silhouette = silhouette[silhouette["k"].isin(set(int(x) for x in k))].reset_index(drop=True)
    clusters = labels[f"cluster_k{RULE_K}"]
    agreement, contingency = [], {}
    for mode in MODES:
        rule = labels[f"regime_{mode}"].astype(str)
        agreement.append({"mode": mode, "k": RULE_K, "ari": float(adjusted_rand_score(rule, clusters))})
        contingency[mode] = pd.crosstab(
            pd.Categorical(rule, categories=list(ALL_LABELS)),
            clusters,
            rownames=["regime"],
            colnames=["cluster"],
            dropna=False,
        )
    return RegimeClusters(
        features=features,
        standardized=x,
        labels=labels,
        silhouette=silhouette,
        agreement=pd.DataFrame(agreement),
        contingency=contingency,
        seed=seed,
    )
