"""Per-head interventions (activation patching through transformer_lens.patching, mean-ablation) and
their join with the regimes and the separability, each against a hand-written reference."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import build, model_kinds

import tl_geometry as tlg
from tl_geometry.errors import InputError


def _tokens(seed: int, shape=(2, 9)) -> torch.Tensor:
    return torch.randint(3, 259, shape, generator=torch.Generator().manual_seed(seed))


def _metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 7].mean()


@pytest.mark.parametrize("kind", model_kinds())
def test_head_out_equals_patching_each_head_by_hand(kind, one_thread) -> None:
    model = build(kind)
    clean, corrupt = _tokens(0), _tokens(1)
    effects = tlg.intervention.patching.head_out(model, clean, corrupt, _metric)
    info = tlg.describe_model(model)
    columns = ["layer", "head", "method", "corrupted_metric", "patched_metric", "effect"]
    assert list(effects.columns) == columns and len(effects) == info.n_layers * info.n_heads
    _, cache = model.run_with_cache(clean)
    with torch.inference_mode():
        baseline = float(_metric(model(corrupt)))
    assert effects.corrupted_metric.tolist() == pytest.approx([baseline] * len(effects), abs=1e-6)
    for row in effects.itertuples(index=False):
        name = f"blocks.{row.layer}.attn.hook_z"

        def patch(z, hook, h=row.head, name=name):
            z[:, :, h] = cache[name][:, :, h]
            return z

        with torch.inference_mode():
            want = float(_metric(model.run_with_hooks(corrupt, fwd_hooks=[(name, patch)])))
        assert row.patched_metric == pytest.approx(want, abs=1e-6)
        assert row.effect == pytest.approx(want - baseline, abs=1e-6)


def test_head_out_rejects_bad_tokens_before_running(llama_bridge) -> None:
    with pytest.raises(InputError, match="same shape"):
        tlg.intervention.patching.head_out(llama_bridge, _tokens(0), _tokens(1, (2, 7)), _metric)
    with pytest.raises(InputError, match="integer tensor"):
        tlg.intervention.patching.head_out(llama_bridge, _tokens(0).float(), _tokens(1), _metric)


@pytest.mark.parametrize("kind", model_kinds())
def test_mean_ablation_equals_a_loop_reference(kind, one_thread) -> None:
    model = build(kind)
    tokens = _tokens(2, (3, 10))
    table = tlg.intervention.patching.mean_ablation(model, tokens)

    def loss(logits):  # mean -log p(next token), by gather
        logp = logits[:, :-1].double().log_softmax(-1)
        return float(-logp.gather(-1, tokens[:, 1:, None]).mean())

    with torch.inference_mode():
        logits, cache = model.run_with_cache(tokens)
        clean = loss(logits)
        for row in table.itertuples(index=False):
            name = f"blocks.{row.layer}.attn.hook_z"
            z = cache[name][:, :, row.head]  # [batch, pos, d_head]
            mean = z.sum(dim=(0, 1)) / (z.shape[0] * z.shape[1])

            def ablate(act, hook, h=row.head, mean=mean):
                act[:, :, h] = mean
                return act

            ablated = loss(model.run_with_hooks(tokens, fwd_hooks=[(name, ablate)]))
            assert row.loss_clean == pytest.approx(clean, abs=1e-9)
            assert row.loss_ablated == pytest.approx(ablated, abs=1e-5)
            assert row.delta_loss == pytest.approx(ablated - clean, abs=1e-5)
    assert (table.rel_delta == table.delta_loss / table.loss_clean).all()


@pytest.fixture(scope="module")
def tiny_result(llama_bridge):
    corpus = _tokens(3, (4, 12))
    return tlg.analyze(llama_bridge, corpus, batch_size=2, progress=False)


def test_join_heads_with_a_tensor_a_frame_and_the_separability(tiny_result) -> None:
    heads = tiny_result.classify_heads()
    effects = torch.arange(8, dtype=torch.float64).reshape(2, 4)
    table = tlg.join_heads(effects, heads, tiny_result, n=2)
    assert list(table[["layer", "head"]].itertuples(index=False, name=None)) == [
        (a, h) for a in range(2) for h in range(4)
    ]
    assert table.effect.tolist() == list(range(8)) and table.attrs["value"] == "effect"
    assert (table.regime.astype(str) == heads.regime.astype(str)).all() and "regime_nearest" in table
    sep = tiny_result.separability
    want = sep[sep.n == 2].groupby(["layer", "head"]).recall.mean().to_numpy()
    assert np.allclose(table.recall.to_numpy(), want, atol=1e-12) and (table.n == 2).all()
    # a frame with a rank_by column keeps the attention rows; several rows per head are averaged
    frame = pd.DataFrame({"layer": [0, 0, 0, 1], "head": [1, 1, 1, 2], "rank_by": ["attention", "attention", "norm", "attention"],
                          "delta_loss": [1.0, 3.0, 100.0, 5.0]})  # fmt: skip
    joined = tlg.join_heads(frame, heads)
    assert joined.delta_loss.tolist() == [2.0, 5.0] and joined.attrs["value"] == "delta_loss"
    with pytest.raises(InputError, match="not on the analysed grid"):
        tlg.join_heads(effects, heads, tiny_result, n=9999)
    with pytest.raises(InputError, match="value="):
        tlg.join_heads(frame.rename(columns={"delta_loss": "x"}), heads)


def _kruskal_by_hand(groups: list[np.ndarray]) -> float:
    """H = 12 / (N (N + 1)) sum R_g^2 / n_g - 3 (N + 1), no ties."""
    values = np.concatenate(groups)
    ranks = values.argsort().argsort() + 1.0
    n, start, total = len(values), 0, 0.0
    for g in groups:
        total += ranks[start : start + len(g)].sum() ** 2 / len(g)
        start += len(g)
    return 12 / (n * (n + 1)) * total - 3 * (n + 1)


def test_regime_function_summaries_and_the_kruskal_wallis_test() -> None:
    labels = ["Retriever"] * 6 + ["Reset"] * 8 + ["Mixer"] * 5 + ["Unclassified"]
    heads = pd.DataFrame({"layer": 0, "head": range(20), "regime": pd.Categorical(labels)})
    rng = np.random.default_rng(0)
    shift = {"Retriever": 1.0, "Reset": 0.0, "Mixer": 0.2, "Unclassified": 0.0}
    value = np.array([shift[r] for r in labels]) + 0.1 * rng.standard_normal(20)
    local = pd.DataFrame({"layer": 0, "head": range(20), "delta_loss": value})
    out = tlg.regime_function(None, local, heads=heads, n_resamples=999)
    t = out.table.set_index(out.table.regime.astype(str))
    for regime in ("Retriever", "Reset", "Mixer"):
        x = value[np.array(labels) == regime]
        assert t.loc[regime, "n_heads"] == len(x) and t.loc[regime, "mean"] == pytest.approx(x.mean(), abs=1e-12)
        assert t.loc[regime, "ci_low"] < x.mean() < t.loc[regime, "ci_high"]
    assert np.isnan(t.loc["Unclassified", "ci_low"])  # one head: no interval, and not in the test
    groups = [value[np.array(labels) == r] for r in ("Retriever", "Reset", "Mixer")]
    assert out.statistic == pytest.approx(_kruskal_by_hand(groups), abs=1e-9) and out.pvalue < 0.01
    # same values in every regime: no difference
    flat = tlg.regime_function(None, local.assign(delta_loss=rng.permutation(value - [shift[r] for r in labels])),
                               heads=heads, n_resamples=99)  # fmt: skip
    assert flat.pvalue > 0.01


def test_effect_by_regime_draws_every_head_in_its_regime_box() -> None:
    labels = ["Retriever", "Reset", "Reset", "Mixer", "Unclassified"]
    table = pd.DataFrame({"layer": 0, "head": range(5), "regime_strict": labels, "regime_nearest": labels[:4] + ["Reset"],
                          "delta_loss": [0.5, 0.1, 0.2, 0.3, 0.4]})  # fmt: skip
    table.attrs["value"] = "delta_loss"
    fig = tlg.plot.effect_by_regime(table)
    assert [t.name for t in fig.data] == [
        "Retriever (1 heads)",
        "Mixer (1 heads)",
        "Reset (2 heads)",
        "Unclassified (1 heads)",
    ]
    assert list(fig.data[2].y) == [0.1, 0.2] and list(fig.data[2].text) == ["L0H1", "L0H2"]
    nearest = tlg.plot.effect_by_regime(table, mode="nearest")
    assert [t.name for t in nearest.data][-1] == "Reset (3 heads)" and list(nearest.data[-1].y) == [0.1, 0.2, 0.4]
    with pytest.raises(InputError, match="value="):
        tlg.plot.effect_by_regime(table.drop(columns="delta_loss"))


def test_localized_loss_joins_by_head(llama_bridge, tiny_result) -> None:
    from tl_geometry.corpus import from_tokens

    local = tlg.localized_loss(llama_bridge, from_tokens(_tokens(4, (2, 12))), n=2, unit="head", progress=False)
    heads = tiny_result.classify_heads()
    table = tlg.join_heads(local, heads)
    assert table.attrs["value"] == "delta_nll_rel" and len(table) == 8
    want = local.set_index(["layer", "head"]).delta_nll_rel
    assert all(row.delta_nll_rel == want[(row.layer, row.head)] for row in table.itertuples())
    summary = tlg.regime_function(tiny_result, local, mode="nearest", n_resamples=99)
    assert summary.value == "delta_nll_rel" and summary.table.n_heads.sum() == 8
    by_layer = tlg.localized_loss(llama_bridge, from_tokens(_tokens(4, (2, 12))), n=2, unit="layer", progress=False)
    with pytest.raises(InputError, match="unit='head'"):
        tlg.join_heads(by_layer, heads)


@pytest.mark.parametrize("kind", model_kinds())
def test_stacked_patching_equals_transformer_lens_one_pass_per_head(kind, one_thread) -> None:
    from transformer_lens import patching as tl_patching

    model = build(kind)
    clean, corrupt = _tokens(5), _tokens(6)
    with torch.inference_mode():
        _, cache = model.run_with_cache(clean)
        want = tl_patching.get_act_patch_attn_head_out_all_pos(model, corrupt, cache, _metric).cpu()
    for per_pass in (3, None):  # groups that straddle layers; every head in one pass
        got = tlg.intervention.patching.patch_head_out(model, clean, corrupt, _metric, heads_per_pass=per_pass)
        assert got.shape == want.shape and torch.allclose(got, want.float(), atol=1e-6, rtol=0)
    frame = tlg.intervention.patching.head_out(model, clean, corrupt, _metric)
    assert frame.patched_metric.tolist() == pytest.approx(want.flatten().double().tolist(), abs=1e-6)


def _hand_attribution(model, clean, corrupt, metric) -> torch.Tensor:
    """Per layer, one run in which that layer's hook_z is a leaf tensor; (z_clean - z_corrupt) . grad by head."""
    info = tlg.describe_model(model)
    _, cache = model.run_with_cache(clean)
    out = torch.zeros(info.n_layers, info.n_heads, dtype=torch.float64)
    for layer in range(info.n_layers):
        name = f"blocks.{layer}.attn.hook_z"
        leaf = {}

        def as_leaf(z, hook, leaf=leaf):
            leaf["z"] = z.detach().clone().requires_grad_(True)
            return leaf["z"]

        with torch.enable_grad():
            metric(model.run_with_hooks(corrupt, fwd_hooks=[(name, as_leaf)])).backward()
        diff = (cache[name] - leaf["z"].detach()).double()
        for head in range(info.n_heads):
            out[layer, head] = (diff[:, :, head] * leaf["z"].grad[:, :, head].double()).sum()
    return out


@pytest.mark.parametrize("kind", model_kinds())
def test_attribution_equals_the_gradient_product_by_hand(kind, one_thread) -> None:
    model = build(kind)
    clean, corrupt = _tokens(7), _tokens(8)
    got = tlg.intervention.patching.attribute_head_out(model, clean, corrupt, _metric)
    want = _hand_attribution(model, clean, corrupt, _metric)
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-5)
    assert want.abs().max() > 1e-3  # not trivially zero


def test_attribution_is_the_limit_of_exact_patching(llama_bridge, one_thread) -> None:
    """Patching a fraction eps of (z_clean - z_corrupt) into one head: (metric(eps) - metric(-eps)) / (2 eps) -> attribution."""
    clean, corrupt = _tokens(9), _tokens(10)
    attribution = tlg.intervention.patching.attribute_head_out(llama_bridge, clean, corrupt, _metric)
    _, cache = llama_bridge.run_with_cache(clean)
    _, base = llama_bridge.run_with_cache(corrupt)
    eps = 1e-2
    for layer, head in [(0, 1), (1, 3)]:
        name = f"blocks.{layer}.attn.hook_z"
        step = cache[name][:, :, head] - base[name][:, :, head]

        def run(scale, name=name, head=head, step=step):
            def patch(z, hook):
                z[:, :, head] = z[:, :, head] + scale * step
                return z

            with torch.inference_mode():
                return float(_metric(llama_bridge.run_with_hooks(corrupt, fwd_hooks=[(name, patch)])))

        slope = (run(eps) - run(-eps)) / (2 * eps)
        assert float(attribution[layer, head]) == pytest.approx(slope, rel=2e-3, abs=1e-4)


def test_exact_and_attribution_frames_share_the_baseline_and_the_meaning_of_effect(llama_bridge, one_thread) -> None:
    """``effect`` is the change from the corrupted run's metric for both methods: on a pair a small
    step apart (clean = corrupted but one token), the estimate is close to the exact change, and
    ``join_heads`` takes that change, never the patched metric."""
    patching = tlg.intervention.patching

    def metric(logits):  # offset: the patched metric sits far from its change
        return _metric(logits) + 3.0

    corrupt = _tokens(11)
    clean = corrupt.clone()
    clean[:, -3] = (clean[:, -3] + 1) % 256 + 3
    exact = patching.head_out(llama_bridge, clean, corrupt, metric, method="exact")
    estimate = patching.head_out(llama_bridge, clean, corrupt, metric, method="attribution")
    assert exact.method.eq("exact").all() and estimate.method.eq("attribution").all()
    with torch.inference_mode():
        baseline = float(metric(llama_bridge(corrupt)))
    for frame in (exact, estimate):
        assert frame.corrupted_metric.tolist() == pytest.approx([baseline] * len(frame), abs=1e-6)
        assert (frame.effect - (frame.patched_metric - frame.corrupted_metric)).abs().max() < 1e-9
    tensor = patching.attribute_head_out(llama_bridge, clean, corrupt, metric).flatten().double()
    assert estimate.effect.tolist() == pytest.approx(tensor.tolist(), abs=1e-7)
    # the same scale: the exact change and its estimate, not the patched metric (about the baseline)
    scale = exact.effect.abs().max()
    assert scale > 1e-4 and abs(baseline) > 10 * scale
    assert (exact.effect - estimate.effect).abs().max() < 0.5 * scale
    heads = pd.DataFrame({"layer": exact.layer, "head": exact["head"], "regime": "diffuse"})
    joined = tlg.join_heads(exact, heads)
    assert joined.attrs["value"] == "effect"
    assert joined.effect.tolist() == pytest.approx(exact.effect.tolist(), abs=1e-12)


def test_patching_rejects_bad_settings_before_running(llama_bridge) -> None:
    patching = tlg.intervention.patching
    with pytest.raises(InputError, match="heads_per_pass"):
        patching.patch_head_out(llama_bridge, _tokens(0), _tokens(1), _metric, heads_per_pass=0)
    with pytest.raises(InputError, match="method"):
        patching.head_out(llama_bridge, _tokens(0), _tokens(1), _metric, method="gradient")
    with pytest.raises(InputError, match="scalar tensor"):
        patching.attribute_head_out(llama_bridge, _tokens(0), _tokens(1), lambda logits: 1.0)


@pytest.mark.parametrize(
    ("metric", "message"),
    [
        (lambda logits: logits[:, -1, 7], r"scalar, got a tensor of shape \(2,\)"),
        (lambda logits: "high", r"scalar tensor or a number, got str"),
        (lambda logits: logits[:, -1, 7].mean() * float("nan"), r"returned nan on the clean run"),
    ],
    ids=["vector", "string", "nan"],
)
def test_patch_head_out_checks_the_metric_before_the_patched_passes(llama_bridge, metric, message, monkeypatch) -> None:
    """Issue 47: a metric that is not a finite scalar is one error after the clean run, not after every pass."""
    patched_passes = []
    run_with_hooks = type(llama_bridge).run_with_hooks

    def counted(self, *args, **kwargs):
        patched_passes.append(1)
        return run_with_hooks(self, *args, **kwargs)

    monkeypatch.setattr(type(llama_bridge), "run_with_hooks", counted)
    with pytest.raises(InputError, match=message):
        tlg.intervention.patching.patch_head_out(llama_bridge, _tokens(0), _tokens(1), metric, heads_per_pass=1)
    assert patched_passes == []
