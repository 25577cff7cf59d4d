"""Clusters of heads on their Figure 7 features (definitions §5): planted regimes are recovered,
structureless heads claim no structure, a seed fixes the result, the features match a slow reference."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from test_taxonomy import synthetic_heads

import tl_geometry as tlg
import tl_geometry.taxonomy as tx
from tl_geometry.errors import InputError


@pytest.fixture(scope="module")
def planted() -> pd.DataFrame:
    """30 heads: the Retriever, Reset and Mixer of ``synthetic_heads`` drawn with ten seeds (layer = seed)."""
    tables = []
    for seed in range(10):
        w, v = synthetic_heads(seed=seed)
        tables.append(tx.regime_feature_table(w[:, :3], v[:, :3], "log", layer=seed))
    return pd.concat(tables, ignore_index=True)


def test_three_planted_regimes_are_recovered(planted) -> None:
    clusters = tlg.regime_clusters(planted, k=range(2, 7), seed=0)
    assert clusters.silhouette.k.tolist() == [2, 3, 4, 5, 6]
    assert clusters.best_k == 3 and clusters.has_structure
    truth = clusters.labels["head"].map({0: "Retriever", 1: "Reset", 2: "Mixer"})
    from sklearn.metrics import adjusted_rand_score

    assert adjusted_rand_score(truth, clusters.labels.cluster_k3) >= 0.9
    agree = clusters.agreement.set_index("mode").ari
    assert agree["strict"] >= 0.9 and agree["nearest"] >= 0.9
    table = clusters.contingency["strict"]
    assert list(table.index) == list(tx.ALL_LABELS) and table.to_numpy().sum() == 30
    assert sorted(table.max(axis=1).tolist()) == [0, 10, 10, 10]  # each regime in one cluster


def test_structureless_heads_claim_no_structure() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.softmax(2 * torch.randn(8, 40, 64, generator=gen, dtype=torch.float64), -1)
    v = torch.randn(8, 40, 64, 16, generator=gen, dtype=torch.float64)
    clusters = tlg.regime_clusters(tx.regime_feature_table(w, v, "log"), k=range(2, 7), seed=0)
    assert clusters.silhouette.silhouette.max() < tx.STRUCTURE_SILHOUETTE and not clusters.has_structure


def test_clusters_are_deterministic_for_a_seed(planted) -> None:
    a = tlg.regime_clusters(planted, k=[2, 4], seed=5)
    b = tlg.regime_clusters(planted, k=[2, 4], seed=5)
    pd.testing.assert_frame_equal(a.labels, b.labels)
    pd.testing.assert_frame_equal(a.silhouette, b.silhouette)
    assert a.silhouette.k.tolist() == [2, 4] and "cluster_k3" in a.labels  # k = 3 always for the agreement


def test_cluster_features_against_a_loop_reference(planted) -> None:
    feats = tx.cluster_features(planted)
    ns = sorted(planted.n.unique())
    assert list(feats.columns) == (["layer", "head"] + [f"cos_v0_n{n}" for n in ns] + [f"cos_vL_n{n}" for n in ns]
                                   + ["log_share_sink", "log_share_last", "log_share_rest"])  # fmt: skip
    for row in feats.itertuples(index=False):
        t = planted[(planted.layer == row.layer) & (planted["head"] == row.head)].set_index("n")
        total = t.c_sink.iloc[0] + t.c_last.iloc[0] + t.c_rest.iloc[0]
        assert math.isclose(row.log_share_last, math.log(t.c_last.iloc[0] / total), abs_tol=1e-12)
        assert math.isclose(getattr(row, f"cos_vL_n{ns[-1]}"), t.cos_s_vL[ns[-1]], abs_tol=1e-12)
        assert math.isclose(getattr(row, f"cos_v0_n{ns[0]}"), t.cos_s_v0[ns[0]], abs_tol=1e-12)
    x = tlg.regime_clusters(planted, k=[2]).standardized
    assert np.allclose(x.mean(0), 0, atol=1e-9) and np.allclose(x.std(0)[x.std(0) > 0], 1, atol=1e-9)


def test_bad_input_is_one_clear_error(planted) -> None:
    with pytest.raises(InputError, match="each k must be in 2..29"):
        tlg.regime_clusters(planted, k=[2, 30])
    with pytest.raises(InputError, match="taxonomy=True"):
        tlg.regime_clusters(object())


def test_cluster_plane_is_the_first_two_principal_components(planted) -> None:
    clusters = tlg.regime_clusters(planted, k=[2, 3])
    fig = tlg.plot.cluster_scatter(clusters)
    assert sum(len(t.x) for t in fig.data) == 30
    # principal components by hand: SVD of the centred standardised features, up to each axis' sign
    x = clusters.standardized - clusters.standardized.mean(0)
    u, s, _ = np.linalg.svd(x, full_matrices=False)
    want = {f"L{a}H{b}": (u[i, 0] * s[0], u[i, 1] * s[1]) for i, (a, b) in
            enumerate(zip(clusters.labels.layer, clusters.labels["head"]))}  # fmt: skip
    got = {name: (px, py) for t in fig.data for name, px, py in zip(t.text, t.x, t.y)}
    sign = [np.sign(got["L0H0"][i] / want["L0H0"][i]) for i in (0, 1)]
    for name, (px, py) in got.items():
        assert px == pytest.approx(sign[0] * want[name][0], abs=1e-9) and py == pytest.approx(
            sign[1] * want[name][1], abs=1e-9
        )
    # one symbol per rule label, one colour per cluster
    for t in fig.data:
        cluster, label = t.name.split(" · ")
        assert t.marker.symbol == tlg.plot.REGIME_SYMBOLS[label]
        members = clusters.labels[(clusters.labels.cluster_k3 == int(cluster.split()[1]))
                                  & (clusters.labels.regime_strict.astype(str) == label)]  # fmt: skip
        assert len(members) == len(t.x)
    with pytest.raises(InputError, match="k=5"):
        tlg.plot.cluster_scatter(clusters, k=5)
