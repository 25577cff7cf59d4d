"""Tests of the figures (tl_geometry.plot): what each figure draws equals what pandas computes
independently from the result's tables, axes are log where the paper's are, and a missing table
is a clear InputError.

One real, small AnalysisResult of the tiny LLaMA bridge (4 windows of 40 tokens, diagnostics,
bounds and the taxonomy) is shared by every test. Its random heads are all Unclassified, so the regime figures get
a heads table whose labels are set by hand (every label present, a known pattern): the figures are
tested on the plumbing from labels to traces, the labelling itself in test_taxonomy.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch
from conftest import tiny_llama_bridge

import tl_geometry as tlg
import tl_geometry.plot as tlp
import tl_geometry.taxonomy as tx
from tl_geometry.capture.hooks import run_streaming
from tl_geometry.errors import InputError
from tl_geometry.models import hook_pattern_name, hook_v_name

LABELS = ["Retriever", "Mixer", "Reset", "Unclassified"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return tiny_llama_bridge()  # 2 layers, 4 query heads, 2 key/value heads


@pytest.fixture(scope="module")
def tokens():
    tok = torch.randint(3, 200, (4, 40), generator=torch.Generator().manual_seed(0))
    tok[:, 0] = 0  # BOS: a real sink at position 0
    return tok


@pytest.fixture(scope="module")
def result(model, tokens):
    return tlg.analyze(model, tokens, diagnostics=True, bounds=True, k_max=16, progress=False)


@pytest.fixture(scope="module")
def bare(model, tokens):
    """A result without diagnostics, bounds or taxonomy."""
    return tlg.analyze(model, tokens, taxonomy=False, progress=False)


@pytest.fixture(scope="module")
def features(model, result):
    """The regime features of a TaxonomyObserver run by hand over the result's windows."""
    info = result.model
    obs = tx.TaxonomyObserver(info, ns=result.config["ns"])
    queries = tuple(result.config["query_positions"])
    run_streaming(
        model, info, result.tokens, torch.arange(len(result.tokens)), list(range(info.n_layers)), queries, [obs]
    )
    return obs.features()


@pytest.fixture(scope="module")
def heads(result):
    """classify_heads of the result, with the labels set by hand: layer 0 heads 0..3 are
    Retriever, Mixer, Reset, Unclassified; layer 1 heads 0..3 are Mixer, Mixer, Reset, Retriever."""
    h = tx.classify_heads(result)
    labels = {(0, 0): "Retriever", (0, 1): "Mixer", (0, 2): "Reset", (0, 3): "Unclassified",
              (1, 0): "Mixer", (1, 1): "Mixer", (1, 2): "Reset", (1, 3): "Retriever"}  # fmt: skip
    h["regime"] = pd.Categorical(
        [labels[(a, b)] for a, b in zip(h["layer"], h["head"])], categories=list(tx.ALL_LABELS)
    )
    h["margin"] = np.arange(len(h), dtype=float)  # the largest margin of a regime is its last head
    return h


def _y(trace) -> np.ndarray:
    return np.asarray(trace.y, dtype=float)


def _names(fig: go.Figure) -> list[str]:
    return [t.name for t in fig.data]


def _same(a, b, tol: float = 1e-12) -> bool:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return (
        a.shape == b.shape
        and bool(np.array_equal(np.isnan(a), np.isnan(b)))
        and np.allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=0, atol=tol)
    )


# ----------------------------------------------------------------------------- colours


def test_regime_colors_cover_every_label_and_differ() -> None:
    assert set(tlp.REGIME_COLORS) == set(tx.ALL_LABELS) == set(tlp.REGIME_ORDER)
    assert len(set(tlp.REGIME_COLORS.values())) == 4
    assert tlp.REGIME_ORDER[:3] == ("Retriever", "Mixer", "Reset")  # the paper's left-to-right order


# ----------------------------------------------------------------------------- Fig. 2


def test_norms_by_position_plots_the_mean_over_pairs_and_the_sink_level(result) -> None:
    fig = tlp.norms_by_position(result)
    assert _names(fig) == ["q10", "q10–q90 of pairs", "mean ||v_i||, i ≥ 1", "sink: mean ||v_0||"]
    assert fig.layout.xaxis.type == "log"
    curve = result.value_norm_curve
    rest = curve[curve.position > 0]
    want = rest.pivot_table(index="position", columns=["layer", "kv_head"], values="mean_norm")
    mean = fig.data[2]
    assert list(mean.x) == list(range(1, 40))
    assert _same(_y(mean), want.mean(axis=1).to_numpy())
    assert _same(_y(fig.data[0]), want.quantile(0.1, axis=1).to_numpy())
    assert _same(_y(fig.data[1]), want.quantile(0.9, axis=1).to_numpy())
    sink = curve.loc[curve.position == 0, "mean_norm"].mean()
    assert _same(_y(fig.data[3]), [sink, sink]) and list(fig.data[3].x) == [1, 39]
    assert "(value-space units)" in fig.layout.yaxis.title.text


def test_norms_by_position_normalized_and_linear(result) -> None:
    fig = tlp.norms_by_position(result, log_x=False, normalize=True, band=None)
    assert _names(fig) == ["mean ||v_i||, i ≥ 1", "sink: mean ||v_0||"]
    assert fig.layout.xaxis.type == "linear"
    wide = result.value_norm_curve.pivot_table(index="position", columns=["layer", "kv_head"], values="mean_norm")
    scaled = wide / wide.loc[1:].median(axis=0)  # every pair's curve over its median for i > 0
    assert _same(_y(fig.data[0]), scaled.loc[1:].mean(axis=1).to_numpy())
    assert _same(_y(fig.data[1])[0], scaled.loc[0].mean())


def test_norm_cv_histogram_bins_the_per_pair_cvs(result) -> None:
    fig = tlp.norm_cv_histogram(result)
    assert _names(fig) == ["norm_cv"] and isinstance(fig.data[0], go.Histogram)
    assert _same(np.sort(np.asarray(fig.data[0].x, dtype=float)), np.sort(result.value_norms.norm_cv.to_numpy()))
    assert f"median {result.value_norms.norm_cv.median():.3f}" in fig.layout.title.text
    assert fig.layout.shapes[0].x0 == pytest.approx(result.value_norms.norm_cv.median())


# ----------------------------------------------------------------------------- Fig. 3


def test_mae_histogram_and_its_mean(result) -> None:
    fig = tlp.mae_histogram(result)
    assert _same(np.asarray(fig.data[0].x, dtype=float), result.similarity.mae.to_numpy())
    assert f"mean MAE {result.similarity.mae.mean():.3f}" in fig.layout.title.text


def test_similarity_curves_band_median_and_one_selectable_pair(result) -> None:
    fig = tlp.similarity_curves(result)
    n_pairs = len(result.similarity)  # 4 (layer, kv_head) pairs
    assert len(fig.data) == 4 + 2 * n_pairs
    sc = result.similarity_curve
    ks = sorted(sc.k.unique())
    for name, q in (("c(k): 25th percentile", 0.25), ("c(k): median", 0.5), ("c(k): quartile band", 0.75)):
        trace = next(t for t in fig.data if t.name == name)
        want = [np.quantile(sc[sc.k == k].c.to_numpy(), q) for k in ks]
        assert _same(_y(trace), np.array(want))
    fit = next(t for t in fig.data if t.name == "fit: median")
    assert _same(_y(fit), np.array([np.median(sc[sc.k == k].fit.to_numpy()) for k in ks]))
    visible = [t.name for t in fig.data[4:] if t.visible]
    assert visible == ["L0 kv0: c(k)", "L0 kv0: fit"]  # only the first pair shows
    menu = fig.layout.updatemenus[0]
    assert (
        len(menu.buttons) == n_pairs
        and menu.buttons[2].args[0]["visible"][4:] == [False] * 4 + [True] * 2 + [False] * 2
    )

    one = sc[(sc.layer == 1) & (sc.kv_head == 0)].sort_values("k")
    fig = tlp.similarity_curves(result, pairs=[(0, 1), (1, 0)], selected=(1, 0))
    assert _names(fig)[4:] == ["L0 kv1: c(k)", "L0 kv1: fit", "L1 kv0: c(k)", "L1 kv0: fit"]
    assert _same(_y(fig.data[6]), one.c) and _same(_y(fig.data[7]), one.fit) and fig.data[6].visible
    assert fig.data[7].line.dash == "dash" and fig.layout.updatemenus[0].active == 1
    with pytest.raises(InputError, match=r"pairs \[\(5, 0\)\]"):
        tlp.similarity_curves(result, pairs=[(5, 0)])


# ----------------------------------------------------------------------------- Fig. 4


def test_attention_mass_mean_profile_and_fit_on_a_log_axis(result) -> None:
    fig = tlp.attention_mass(result)
    assert _names(fig) == ["mean α_i", "fitted profile"]
    assert fig.layout.yaxis.type == "log"
    apc = result.attention_profile_curve
    assert _same(_y(fig.data[0]), apc.groupby("position").alpha.mean().to_numpy())
    assert _same(_y(fig.data[1]), apc.groupby("position").fitted.mean().to_numpy())
    one = apc[(apc.layer == 1) & (apc["head"] == 2)].sort_values("position")
    fig = tlp.attention_mass(result, (1, 2))
    assert _same(_y(fig.data[0]), one.alpha) and _same(_y(fig.data[1]), one.fitted)
    assert "layer 1, head 2" in fig.layout.title.text
    with pytest.raises(InputError, match="layer 7, head 0"):
        tlp.attention_mass(result, (7, 0))


def test_attention_mass_without_a_fit_has_no_fit_trace(result) -> None:
    unfitted = result.attention_profile_curve.assign(fitted=np.nan)
    assert _names(tlp.attention_mass(unfitted)) == ["mean α_i"]


# ----------------------------------------------------------------------------- Fig. 5


def test_separability_plots_the_mean_per_n_on_a_log_axis(result) -> None:
    fig = tlp.separability_by_n(result)
    assert _names(fig) == ["precision", "recall"]
    assert fig.layout.xaxis.type == "log"
    sep = result.separability
    for trace, m in zip(fig.data, ("precision", "recall")):
        ns = sorted(sep.n.unique())
        assert list(trace.x) == ns
        assert _same(_y(trace), [sep.loc[sep.n == n, m].mean() for n in ns])
    # the curves are not flat: N = 1 is 1 by construction and some N in between is below 1
    assert _y(fig.data[0])[0] == 1.0 and _y(fig.data[0]).min() < 1.0
    fig = tlp.separability_by_n(result.separability, metrics=["f_at_rmin"])
    assert _names(fig) == ["f_at_rmin"]
    with pytest.raises(InputError, match="unknown metrics"):
        tlp.separability_by_n(result, metrics=["r_min"])


def test_envelopes_two_panels_with_measured_upper_lower_and_kappa(result) -> None:
    fig = tlp.envelopes_by_n(result)
    assert len(fig.data) == 6
    assert "κ = 0.5" in fig.layout.title.text
    assert _names(fig)[:3] == ["mean precision", "upper envelope (κ = 0.5)", "lower envelope (κ = 0.5)"]
    assert _names(fig)[3] == "mean recall"
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type == "log"
    sep = result.separability
    by_n = sep.groupby("n")
    for i, col in enumerate(
        ["precision", "precision_upper", "precision_lower", "recall", "recall_upper", "recall_lower"]
    ):
        assert _same(_y(fig.data[i]), by_n[col].mean().to_numpy()), col
    assert fig.data[1].line.dash == "dot" and fig.data[2].line.dash == "dash"  # the paper's styles
    assert fig.data[3].xaxis == "x2"  # recall on the right panel
    with pytest.raises(InputError, match="kappa=0.25"):
        tlp.envelopes_by_n(result, kappa=0.25)


def test_envelopes_states_the_kappa_it_was_given(result) -> None:
    table = result.separability.copy()
    table.attrs = {}
    with pytest.raises(InputError, match="pass kappa="):
        tlp.envelopes_by_n(table)
    assert "κ = 0.7" in tlp.envelopes_by_n(table, kappa=0.7).layout.title.text


# ----------------------------------------------------------------------------- Fig. 6


def test_sink_correlation_equals_an_independent_pandas_computation(result) -> None:
    fig = tlp.sink_correlation(result)  # rho_0 of result.regime_features
    assert _names(fig) == ["Pearson r", "Spearman ρ"]
    assert fig.layout.xaxis.type == "log"
    sep = result.separability
    recall = sep.groupby(["layer", "head", "kv_head", "n"]).recall.mean().reset_index()
    both = recall.merge(result.similarity[["layer", "kv_head", "rho_0"]], on=["layer", "kv_head"])
    ns = sorted(sep.n.unique())
    pearson = [both[both.n == n][["recall", "rho_0"]].corr().iloc[0, 1] for n in ns]
    tied = both.assign(recall=both.recall.round(12))  # mean recalls equal up to rounding are ties
    spearman = [tied[tied.n == n][["recall", "rho_0"]].corr(method="spearman").iloc[0, 1] for n in ns]
    assert list(fig.data[0].x) == ns
    finite = np.isfinite(_y(fig.data[0]))
    assert finite.sum() >= len(ns) - 2  # only N = 1 and N = K are constant across heads
    assert _same(_y(fig.data[0])[finite], np.asarray(pearson)[finite], 1e-9)
    assert _same(_y(fig.data[1])[finite], np.asarray(spearman)[finite], 1e-9)
    assert np.isnan(_y(fig.data[0])[0])  # N = 1: recall is 1 in every head
    # rho_0 of the diagnostics (per key/value head) gives the same curves for the last query
    again = tlp.sink_correlation(result, rho0=result.similarity)
    assert _same(_y(again.data[0]), _y(fig.data[0]), 1e-9) and _same(_y(again.data[1]), _y(fig.data[1]), 1e-9)
    # a sink-effect table is drawn as it is
    table = pd.DataFrame({"n": [1, 2, 4], "pearson": [0.1, 0.5, -0.2], "spearman": [0.0, 0.4, -0.3]})
    fig = tlp.sink_correlation(table)
    assert _same(_y(fig.data[0]), table.pearson) and _same(_y(fig.data[1]), table.spearman)


# ----------------------------------------------------------------------------- Fig. 7


def test_regime_diagnostics_one_column_per_regime_example(result, features, heads) -> None:
    fig = tlp.regime_diagnostics(result, heads)  # result.regime_features
    # examples: the largest-margin head of each regime, in the paper's order Retriever, Mixer, Reset
    assert [a.text for a in fig.layout.annotations[:3]] == [
        "Retriever: layer 1, head 3", "Mixer: layer 1, head 1", "Reset: layer 1, head 2",
    ]  # fmt: skip
    assert len(fig.data) == 3 * 5 + 5  # five curves per column, then five legend keys
    assert [t.showlegend for t in fig.data[:15]] == [False] * 15
    assert [t.name for t in fig.data[15:]] == [name for _, name, _, _ in tlp.regime_curves.CURVES]
    for col, (regime, (layer, head)) in enumerate(zip(LABELS, [(1, 3), (1, 1), (1, 2)])):
        part = features[(features.layer == layer) & (features["head"] == head)].sort_values("n")
        traces = fig.data[5 * col : 5 * col + 5]
        assert {t.line.color for t in traces} == {tlp.REGIME_COLORS[regime]}
        for t, column in zip(traces, ["norm_s", "norm_s_minus_sink", "norm_s_minus_last", "cos_s_v0", "cos_s_vL"]):
            assert _same(_y(t), part[column]), (regime, column)
    assert fig.data[3].yaxis == "y4" and fig.data[0].yaxis == "y"  # cosines in the bottom row
    assert all(fig.layout[f"xaxis{i}"].type == "log" for i in ("", "2", "3", "4", "5", "6"))
    # the features table itself, here from a TaxonomyObserver run by hand, draws the same curves
    by_hand = tlp.regime_diagnostics(features, heads)
    assert all(_same(_y(a), _y(b), 1e-9) for a, b in zip(fig.data[:15], by_hand.data[:15]))


def test_regime_diagnostics_chosen_heads_and_errors(bare, features, heads) -> None:
    fig = tlp.regime_diagnostics(features, heads, layer_heads={"Reset": (0, 2)})
    assert fig.layout.annotations[0].text == "Reset: layer 0, head 2" and len(fig.data) == 10
    assert fig.data[0].line.color == tlp.REGIME_COLORS["Reset"]
    unlabelled = heads.assign(regime="Unclassified")
    with pytest.raises(InputError, match="layer_heads"):
        tlp.regime_diagnostics(features, unlabelled)
    with pytest.raises(InputError, match=r"run tlg\.analyze\(\.\.\., taxonomy=True\)"):
        tlp.regime_diagnostics(bare, heads)  # this result holds no regime_features


# ----------------------------------------------------------------------------- Fig. 8


def test_regimes_by_layer_stacks_the_shares_with_the_regime_colors(heads) -> None:
    fig = tlp.regimes_by_layer(heads)
    assert _names(fig) == LABELS
    assert fig.layout.barmode == "stack"
    assert [t.marker.color for t in fig.data] == [tlp.REGIME_COLORS[r] for r in LABELS]
    share = pd.crosstab(heads.layer, heads.regime.astype(str), normalize="index").reindex(columns=LABELS, fill_value=0)
    for trace, regime in zip(fig.data, LABELS):
        assert list(trace.x) == [0, 1]
        assert _same(_y(trace), share[regime].to_numpy()), regime
    assert _same(_y(fig.data[1]), [0.25, 0.5])  # Mixer: 1 of 4 heads in layer 0, 2 of 4 in layer 1
    assert "share of heads" in fig.layout.yaxis.title.text


# ----------------------------------------------------------------------------- Fig. 10


def test_contributions_scatter_points_and_colors() -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.softmax(torch.randn(6, generator=gen), -1)
    v = torch.randn(6, 4, generator=gen)
    fig = tlp.contributions_scatter(w, v)
    assert _names(fig) == ["other keys", "sink (i = 0)", "last token (i = L)"]
    assert fig.layout.yaxis.type == "log" and fig.layout.coloraxis.cmin == -1
    contrib = (w[:, None] * v).norm(dim=-1).double().numpy()
    cos = torch.nn.functional.cosine_similarity(v, v[-1:].expand_as(v), dim=-1).double().numpy()
    other, sink, last = fig.data
    assert list(other.x) == [1, 2, 3, 4] and list(sink.x) == [0] and list(last.x) == [5]
    assert _same(_y(other), contrib[1:5], 1e-6) and _same(_y(sink), contrib[:1], 1e-6)
    assert _same(np.asarray(other.marker.color, dtype=float), cos[1:5], 1e-6)
    assert _same(np.asarray(last.marker.color, dtype=float), [1.0], 1e-6)
    # several rows (query positions 2 and 5 of one sequence): keys 0..q of each
    rows = torch.softmax(torch.randn(2, 6, generator=gen), -1)
    fig = tlp.contributions_scatter(rows, v, query_positions=[2, 5])
    assert list(fig.data[2].x) == [2, 5] and len(fig.data[0].x) == 1 + 4
    with pytest.raises(InputError, match="query_positions"):
        tlp.contributions_scatter(rows, v, query_positions=[2, 6])
    with pytest.raises(InputError, match="non-negative"):
        tlp.contributions_scatter(-w, v)


def test_contributions_from_model_matches_run_with_cache(model, tokens) -> None:
    fig = tlp.contributions_from_model(model, tokens, 1, 3, seq=2, query_positions=[19, 39])
    _, cache = model.run_with_cache(tokens[2:3])
    pattern = cache[hook_pattern_name(1)][0, 3]  # [q, k]
    values = cache[hook_v_name(1)][0, :, 3 // 2]  # head 3 reads key/value head 1
    want = {q: (pattern[q, : q + 1, None] * values[: q + 1]).norm(dim=-1).double().numpy() for q in (19, 39)}
    last = fig.data[2]
    assert list(last.x) == [19, 39]
    assert _same(_y(last), [want[19][19], want[39][39]], 1e-6)
    sink = fig.data[1]
    assert _same(_y(sink), [want[19][0], want[39][0]], 1e-6)
    assert "layer 1, head 3" in fig.layout.title.text
    with pytest.raises(InputError, match="does not exist"):
        tlp.contributions_from_model(model, tokens, 2, 0)


# ----------------------------------------------------------------------------- Fig. 11


def test_regime_pr_means_per_head_then_per_regime(result, heads) -> None:
    fig = tlp.regime_pr(result, heads)
    assert _names(fig) == LABELS + LABELS  # precision panel, then recall panel
    assert [t.showlegend for t in fig.data] == [True] * 4 + [False] * 4
    assert [t.line.color for t in fig.data[:4]] == [tlp.REGIME_COLORS[r] for r in LABELS]
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type == "log"
    per_head = result.separability.groupby(["layer", "head", "n"])[["precision", "recall"]].mean().reset_index()
    per_head = per_head.merge(heads[["layer", "head"]].assign(regime=heads.regime.astype(str)), on=["layer", "head"])
    for i, (metric, regime) in enumerate([(m, r) for m in ("precision", "recall") for r in LABELS]):
        want = per_head[per_head.regime == regime].groupby("n")[metric].mean()
        assert list(fig.data[i].x) == want.index.tolist()
        assert _same(_y(fig.data[i]), want.to_numpy()), (metric, regime)
    assert _names(tlp.regime_pr(result, heads, include_unclassified=False)) == LABELS[:3] * 2


# ----------------------------------------------------------------------------- heatmap


def test_head_heatmap_of_recall_at_one_n_with_regimes_on_hover(result, heads) -> None:
    fig = tlp.head_heatmap(result.separability, "recall", heads, n=4)
    (hm,) = fig.data
    sep = result.separability
    want = sep[sep.n == 4].pivot_table(index="layer", columns="head", values="recall", aggfunc="mean")
    assert _same(np.asarray(hm.z, dtype=float), want.to_numpy())
    assert list(hm.y) == [0, 1] and list(hm.x) == [0, 1, 2, 3]
    assert np.asarray(hm.customdata)[1, 3] == "Retriever" and np.asarray(hm.customdata)[0, 3] == "Unclassified"
    assert "regime" in hm.hovertemplate
    with pytest.raises(InputError, match="pass n="):
        tlp.head_heatmap(sep, "recall")
    with pytest.raises(InputError, match="n=10 is not in the table"):
        tlp.head_heatmap(sep, "recall", n=10)
    with pytest.raises(InputError, match="no column 'recal'"):
        tlp.head_heatmap(sep, "recal", n=4)


def test_head_heatmap_maps_key_value_head_tables_to_query_heads(result, heads) -> None:
    fig = tlp.head_heatmap(result.value_norms, "sink_ratio", model=result)
    vn = result.value_norms.set_index(["layer", "kv_head"]).sink_ratio
    want = np.array([[vn[(layer, h // 2)] for h in range(4)] for layer in range(2)])  # 2 query heads per kv head
    assert _same(np.asarray(fig.data[0].z, dtype=float), want)
    # rho_0 has both signs here: a diverging scale centred on 0
    sim = result.similarity
    assert (sim.rho_0 < 0).any() and (sim.rho_0 > 0).any()
    fig = tlp.head_heatmap(sim, "rho_0", heads)
    assert fig.data[0].zmid == 0
    with pytest.raises(InputError, match="model=result.model"):
        tlp.head_heatmap(sim, "rho_0")


# ----------------------------------------------------------------------------- missing tables


@pytest.mark.parametrize(
    "figure",
    [tlp.norms_by_position, tlp.norm_cv_histogram, tlp.mae_histogram, tlp.similarity_curves, tlp.attention_mass,
     tlp.sink_correlation],
)  # fmt: skip
def test_diagnostics_figures_say_which_option_they_need(bare, figure) -> None:
    with pytest.raises(InputError, match=r"tlg\.analyze\(\.\.\., diagnostics=True\)") as info:
        figure(bare)
    assert figure.__name__ in str(info.value)


def test_envelopes_without_bounds_say_which_option_they_need(bare) -> None:
    with pytest.raises(InputError, match=r"run tlg\.analyze\(\.\.\., bounds=True\)"):
        tlp.envelopes_by_n(bare)


def test_figures_without_diagnostics_still_work_where_they_need_none(result, bare, heads) -> None:
    assert _names(tlp.separability_by_n(bare)) == ["precision", "recall"]
    assert len(tlp.regime_pr(bare, heads).data) == 8
    # rho_0 of the taxonomy alone is enough for the sink effect
    taxonomy_only = dataclasses.replace(result, similarity=None, value_norms=None)
    assert _same(_y(tlp.sink_correlation(taxonomy_only).data[0]), _y(tlp.sink_correlation(result).data[0]))


def test_heads_table_is_checked(result) -> None:
    with pytest.raises(InputError, match="classify_heads"):
        tlp.regimes_by_layer(result.separability)
    with pytest.raises(InputError, match="classify_heads"):
        tlp.regime_pr(result, result.attention_profile)


def test_envelopes_by_n_labels_its_log_axes_in_full(result) -> None:
    """plotly labels a log axis' ticks between decades with their first digit ("2" for 20)."""
    layout = tlp.envelopes_by_n(result).to_plotly_json()["layout"]
    for name in ("xaxis", "xaxis2"):
        values, labels = layout[name]["tickvals"], layout[name]["ticktext"]
        assert len(values) >= 3 and [float(label) for label in labels] == pytest.approx(list(values))
        assert labels[:3] == ["1", "2", "5"] and "10" in labels
