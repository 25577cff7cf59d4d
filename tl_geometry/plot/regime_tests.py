"""Are the regimes real, and do they differ in function? The cluster plane and effects by regime (definitions §5)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tl_geometry.errors import InputError
from tl_geometry.plot.base import as_array, base_layout
from tl_geometry.plot.colors import REGIME_COLORS, REGIME_ORDER

#: Marker symbol of each rule label in the cluster plane.
REGIME_SYMBOLS = {"Retriever": "circle", "Mixer": "diamond", "Reset": "square", "Unclassified": "x"}
_CLUSTER_COLORS = ("#E69F00", "#56B4E9", "#CC79A7", "#F0E442", "#0072B2", "#D55E00", "#009E73", "#000000")


def cluster_scatter(clusters: Any, *, k: int = 3, mode: str = "strict") -> go.Figure:
    """The heads in the plane of the first two principal components, coloured by k-means cluster, marked by rule label.

    Parameters
    ----------
    clusters : :class:`tl_geometry.taxonomy.RegimeClusters` (``tlg.regime_clusters(result)``).
    k : which clustering colours the points (one of the ``k`` clustered).
    mode : which rule labels set the marker symbols (``"strict"`` or ``"nearest"``).

    Returns
    -------
    plotly.graph_objects.Figure
        One trace per (cluster, rule label) present, named ``"cluster {c} · {label}"``: ``x``, ``y``
        the head's coordinates on the first two principal components (``sklearn.decomposition.PCA``,
        ``random_state=clusters.seed``) of the standardised features; hover text ``L{layer}H{head}``.
        The axis titles give each component's share of the variance; the title the silhouette of ``k``
        and the adjusted Rand index with the rule labels.

    Notes
    -----
    How to read it: three separate clouds, each of one symbol, would be the paper's three robust
    regimes. Overlapping clouds and mixed symbols mean the features vary continuously.
    """
    from sklearn.decomposition import PCA

    column = f"cluster_k{k}"
    labels = getattr(clusters, "labels", None)
    if not isinstance(labels, pd.DataFrame) or column not in labels.columns:
        raise InputError(f"regime_clusters() needs tlg.regime_clusters(result) with k={k} among its k")
    if f"regime_{mode}" not in labels.columns:
        raise InputError(f"mode must be 'strict' or 'nearest', got {mode!r}")
    pca = PCA(n_components=2, random_state=clusters.seed)
    xy = pca.fit_transform(clusters.standardized)
    regime = labels[f"regime_{mode}"].astype(str).to_numpy()
    cluster = labels[column].to_numpy()
    names = [f"L{a}H{b}" for a, b in zip(labels["layer"], labels["head"])]
    fig = go.Figure()
    for c in sorted(set(cluster.tolist())):
        for label in REGIME_ORDER:
            mask = (cluster == c) & (regime == label)
            if not mask.any():
                continue
            fig.add_trace(
                go.Scatter(
                    x=as_array(xy[mask, 0]),
                    y=as_array(xy[mask, 1]),
                    mode="markers",
                    name=f"cluster {c} · {label}",
                    text=[n for n, m in zip(names, mask) if m],
                    hovertemplate="%{text}<extra>%{fullData.name}</extra>",
                    marker=dict(
                        color=_CLUSTER_COLORS[c % len(_CLUSTER_COLORS)],
                        symbol=REGIME_SYMBOLS[label],
                        size=8,
                        line=dict(width=0.5, color="black"),
                    ),
                )
            )
    sil = clusters.silhouette.set_index("k")["silhouette"]
    ari = clusters.agreement.set_index("mode")["ari"]
    sil_text = f"silhouette {sil[k]:.2f}" if k in sil.index else ""
    title = (
        f"Heads on their standardised Fig. 7 features: k-means k={k} ({sil_text}), ARI with rule labels "
        f"{ari.get('strict', np.nan):.2f} strict / {ari.get('nearest', np.nan):.2f} nearest"
    )
    share = pca.explained_variance_ratio_
    return base_layout(
        fig,
        title,
        f"principal component 1 ({share[0]:.0%} of the variance)",
        f"principal component 2 ({share[1]:.0%} of the variance)",
    )


def effect_by_regime(table: pd.DataFrame, *, mode: str = "strict", value: str | None = None) -> go.Figure:
    """A per-head effect by regime: one box with every head as a point, per regime.

    Parameters
    ----------
    table : :func:`tl_geometry.join_heads` output (``regime_strict`` / ``regime_nearest`` or
        ``regime``, and the value column named in ``attrs["value"]``).
    mode : the labels grouping the heads.
    value : the value column (default ``table.attrs["value"]``).

    Returns
    -------
    plotly.graph_objects.Figure
        One ``go.Box`` per regime present (order Retriever, Mixer, Reset, Unclassified), named
        ``"{regime} ({n} heads)"``, ``y`` the heads' values, all points shown, hover
        ``L{layer}H{head}``.
    """
    if not isinstance(table, pd.DataFrame) or {"layer", "head"} - set(table.columns):
        raise InputError("effect_by_regime() needs the table of tl_geometry.join_heads(effects, heads, result)")
    value = value or table.attrs.get("value")
    if value is None or value not in table.columns:
        raise InputError(f"effect_by_regime(): say which column to draw, value=... (columns {list(table.columns)})")
    label = f"regime_{mode}" if f"regime_{mode}" in table.columns else "regime"
    if label not in table.columns:
        raise InputError("effect_by_regime(): the table has no regime column: join it with classify_heads")
    fig = go.Figure()
    regimes = table[label].astype(str)
    for regime in REGIME_ORDER:
        part = table[regimes == regime]
        if part.empty:
            continue
        fig.add_trace(
            go.Box(
                y=as_array(part[value]),
                name=f"{regime} ({len(part)} heads)",
                boxpoints="all",
                jitter=0.4,
                pointpos=0,
                text=[f"L{a}H{b}" for a, b in zip(part["layer"], part["head"])],
                marker_color=REGIME_COLORS[regime],
            )
        )
    title = f"{value} of each head, by regime ({mode} labels)"
    return base_layout(fig, title, "regime", value)
