"""Tests of the sink effect and the head taxonomy (definitions §5).

Expected values come from the slow loop references below (written from the text of docs/definitions.md, per row
and per N, sharing no code with the package), from hand computations, or from synthetic heads
built to be each regime.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from jaxtyping import TypeCheckError

import tl_geometry as tlg
import tl_geometry.taxonomy as tx
from tl_geometry.capture.hooks import LayerBatch, run_streaming
from tl_geometry.errors import InputError
from tl_geometry.models import ModelInfo, hook_pattern_name, hook_v_name

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------- loop reference


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    na, nb = float(a.norm()), float(b.norm())
    return 0.0 if na == 0 or nb == 0 else float(a @ b) / (na * nb)


def reference_row(weights: torch.Tensor, values: torch.Tensor, ns: list[int]) -> dict:
    """definitions §5 features of one row, with loops: weights [K], values [K, d] (float64)."""
    w, v = weights.double(), values.double()
    k = len(w)
    last = k - 1
    order = sorted(range(k), key=lambda i: (-float(w[i]), i))  # stable top-N (definitions §2)
    y = [w[i] * v[i] for i in range(k)]
    rest = torch.zeros_like(v[0])
    for i in range(k):
        if i not in (0, last):
            rest = rest + y[i]
    out = {
        "c_sink": float(y[0].norm()),
        "c_last": float(y[last].norm()),
        "c_rest": float(rest.norm()),
        "rho_0": float(np.mean([_cos(v[0], v[j]) for j in range(1, k)])) if k > 1 else math.nan,
    }
    for name in ("cos_s_v0", "cos_s_vL", "norm_s", "norm_s_minus_sink", "norm_s_minus_last"):
        out[name] = []
    for n in ns:
        selected = order[:n]
        s = torch.zeros_like(v[0])
        for i in selected:
            s = s + y[i]
        out["cos_s_v0"].append(_cos(s, v[0]))
        out["cos_s_vL"].append(_cos(s, v[last]))
        out["norm_s"].append(float(s.norm()))
        out["norm_s_minus_sink"].append(float((s - y[0]).norm()) if 0 in selected else math.nan)
        out["norm_s_minus_last"].append(float((s - y[last]).norm()) if last in selected else math.nan)
    return out


def _close(a, b, tol=1e-9) -> bool:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    same_nan = np.array_equal(np.isnan(a), np.isnan(b))
    return bool(same_nan and np.allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=0, atol=tol))


# ----------------------------------------------------------------------------- features


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "torch"])
@pytest.mark.parametrize("k", [1, 2, 3, 17])
def test_regime_features_equal_loop_reference(k: int, compiled: bool, monkeypatch) -> None:
    # s(N) as compiled running sums (where numba imports) and as the masked product (without it)
    monkeypatch.setattr("tl_geometry.core.compiled.AVAILABLE", compiled)
    gen = torch.Generator().manual_seed(k)
    # quantised weights: many ties, so the stable order matters
    weights = torch.randint(0, 4, (2, 3, k), generator=gen).double() / 4
    values = torch.randn(2, 3, k, 5, generator=gen, dtype=torch.float64)
    values[0, 0, min(1, k - 1)] = 0.0  # a zero value vector: its cosines count as 0
    ns = list(range(1, k + 1))
    f = tx.regime_features(weights, values, ns, query_positions=-1)  # the zero weights are real ones
    assert f.cos_s_v0.shape == (2, 3, k) and f.c_rest.shape == (2, 3)
    for b in range(2):
        for h in range(3):
            ref = reference_row(weights[b, h], values[b, h], ns)
            for name in ("c_sink", "c_last", "c_rest", "rho_0"):
                assert _close(getattr(f, name)[b, h], ref[name]), (name, b, h)
            for name in ("cos_s_v0", "cos_s_vL", "norm_s", "norm_s_minus_sink", "norm_s_minus_last"):
                assert _close(getattr(f, name)[b, h], ref[name]), (name, b, h)
            assert f.sink_in[b, h].tolist() == [not math.isnan(x) for x in ref["norm_s_minus_sink"]]
            assert f.last_in[b, h].tolist() == [not math.isnan(x) for x in ref["norm_s_minus_last"]]


def test_regime_features_on_a_subset_of_ns_and_float32_input() -> None:
    gen = torch.Generator().manual_seed(3)
    weights = torch.softmax(torch.randn(4, 40, generator=gen), -1)
    values = torch.randn(4, 40, 8, generator=gen)
    ns = [40, 1, 7]
    f = tx.regime_features(weights, values, ns)
    assert f.norm_s.dtype == torch.float64 and f.ns.tolist() == ns
    for r in range(4):
        ref = reference_row(weights[r], values[r], ns)
        assert _close(f.cos_s_vL[r], ref["cos_s_vL"]) and _close(f.norm_s_minus_last[r], ref["norm_s_minus_last"])


def test_wrong_shapes_raise_a_typecheck_error() -> None:
    with pytest.raises(TypeCheckError):
        tx.regime_features(torch.rand(2, 5), torch.rand(2, 6, 3))  # K differs
    with pytest.raises(TypeCheckError):
        tx.regime_features(torch.rand(3, 5), torch.rand(2, 5, 3))  # batch differs
    with pytest.raises(TypeCheckError):
        tx.regime_feature_table(torch.rand(2, 5), torch.rand(2, 5, 3))  # needs [seq, head, k]
    with pytest.raises(InputError, match="non-negative"):
        tx.regime_features(-torch.rand(2, 5), torch.rand(2, 5, 3))


# ----------------------------------------------------------------------------- observer


def _info(n_heads: int, n_kv: int, d: int) -> ModelInfo:
    return ModelInfo("synthetic", "TransformerBridge", 2, n_heads, n_kv, d, 64, 0, True)


def test_observer_means_and_stds_equal_the_loop_reference_with_gqa_and_parts() -> None:
    gen = torch.Generator().manual_seed(7)
    n_seqs, n_heads, n_kv, seq_len, d = 6, 4, 2, 12, 5
    info = _info(n_heads, n_kv, d)
    weights = torch.softmax(3 * torch.randn(n_seqs, n_heads, seq_len, seq_len, generator=gen), -1)
    values = torch.randn(n_seqs, seq_len, n_kv, d, generator=gen)
    queries = (5, 11)
    parts = tx.halves(n_seqs)
    obs = tx.TaxonomyObserver(info, ns="log", parts=parts)
    for ids in torch.arange(n_seqs).split(4):  # batches that straddle the halves
        obs.observe(LayerBatch(1, ids, queries, weights[ids][:, :, list(queries)], values[ids]))
    table = obs.features()
    assert list(table.columns) == tx.FEATURE_TABLE_COLUMNS
    for q in queries:
        ns = tlg.log_spaced_ns(q + 1)
        for h in range(n_heads):
            g = h // (n_heads // n_kv)  # definitions §1 grouping
            refs = [reference_row(weights[s, h, q, : q + 1], values[s, : q + 1, g], ns) for s in range(n_seqs)]
            rows = table[(table.query_pos == q) & (table["head"] == h)].sort_values("n")
            assert rows.n.tolist() == ns and (rows.kv_head == g).all() and (rows.n_seqs == n_seqs).all()
            for name in ("c_sink", "c_last", "c_rest", "rho_0"):
                x = np.array([r[name] for r in refs])
                assert _close(rows[name].iloc[0], x.mean()) and _close(rows[f"{name}_std"].iloc[0], x.std())
            for name in ("cos_s_v0", "cos_s_vL", "norm_s", "norm_s_minus_sink", "norm_s_minus_last"):
                x = np.array([r[name] for r in refs])  # [seq, n]
                defined = ~np.isnan(x)
                with np.errstate(invalid="ignore"):
                    mean = np.where(defined.any(0), np.nansum(x, 0) / defined.sum(0), np.nan)
                assert _close(rows[name], mean), (name, q, h)
                if name == "norm_s_minus_sink":
                    assert _close(rows["sink_in"], defined.mean(0))
    # the halves merge exactly into the whole, and each half holds only its sequences
    a, b = obs.features(0), obs.features(1)
    assert (a.n_seqs == 3).all() and (b.n_seqs == 3).all()
    assert _close(table.c_last, (a.c_last + b.c_last) / 2)
    with pytest.raises(InputError, match="already observed"):
        obs.observe(LayerBatch(1, torch.tensor([0]), queries, weights[:1][:, :, list(queries)], values[:1]))


def test_observer_state_save_load_and_merge_give_the_whole() -> None:
    import io

    gen = torch.Generator().manual_seed(2)
    info = _info(4, 2, 3)
    weights = torch.softmax(torch.randn(5, 4, 1, 9, generator=gen), -1)
    values = torch.randn(5, 9, 2, 3, generator=gen)
    whole = tx.TaxonomyObserver(info, ns=None)
    whole.observe(LayerBatch(0, torch.arange(5), (8,), weights, values))
    # save after the first batch, resume in a fresh observer, add the rest (what analyze(out_dir=) does)
    first = tx.TaxonomyObserver(info, ns=None)
    first.observe(LayerBatch(0, torch.arange(2), (8,), weights[:2], values[:2]))
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    resumed = tx.TaxonomyObserver(info, ns=None)
    resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    resumed.observe(LayerBatch(0, torch.arange(2, 5), (8,), weights[2:], values[2:]))
    pd.testing.assert_frame_equal(resumed.features(), whole.features(), rtol=1e-12)
    # two observers of disjoint sequences merge into the whole; a sequence twice is refused
    second = tx.TaxonomyObserver(info, ns=None)
    second.observe(LayerBatch(0, torch.arange(2, 5), (8,), weights[2:], values[2:]))
    pd.testing.assert_frame_equal(first.merge(second).features(), whole.features(), rtol=1e-12)
    with pytest.raises(InputError, match="twice"):
        first.merge(second)
    with pytest.raises(InputError, match="other settings"):
        tx.TaxonomyObserver(info, ns="log").load_state_dict(whole.state_dict())


def test_observer_inside_run_streaming_matches_run_with_cache(llama_bridge) -> None:
    model = llama_bridge
    info = tlg.describe_model(model)
    tokens = torch.randint(3, 200, (3, 20), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 0
    obs = tx.TaxonomyObserver(info, ns=None)
    run_streaming(model, info, tokens, torch.arange(3), list(range(info.n_layers)), (19,), [obs])
    table = obs.features()
    _, cache = model.run_with_cache(tokens)
    for layer in range(info.n_layers):
        v = cache[hook_v_name(layer)].repeat_interleave(info.n_heads // info.n_kv_heads, dim=2)  # repeat_kv
        w = cache[hook_pattern_name(layer)][:, :, 19, :20]
        f = tx.regime_features(w, v.permute(0, 2, 1, 3), None)
        got = table[table.layer == layer].sort_values(["head", "n"])
        assert _close(got.cos_s_vL.to_numpy(), f.cos_s_vL.mean(0).reshape(-1).numpy(), 1e-6)
        assert _close(got.groupby("head").c_sink.first().to_numpy(), f.c_sink.mean(0).numpy(), 1e-6)
        assert _close(got.groupby("head").rho_0.first().to_numpy(), f.rho_0.mean(0).numpy(), 1e-6)


# ----------------------------------------------------------------------------- synthetic regimes


def synthetic_heads(n_seqs: int = 8, k: int = 64, d: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights [seq, 5, K] and values [seq, 5, K, d] of five heads built to be, in order:

    0 Retriever: the last token carries most of the weight and the largest contribution;
    1 Reset: the sink carries the weight and the largest contribution, v_L orthogonal to the rest;
    2 Mixer: the sink is the top key but compressed (c_sink < c_last < c_rest), the rest points
      along v_L, so s(N) turns from v_0 (small N) to v_L (large N);
    3 none: the rest dominates and the last token is the smallest contribution;
    4 none: Mixer's norms (c_sink < c_last < c_rest) but s(N) never turns (all along v_0);
    5 none: sink-dominated, but s(N) stays aligned with v_L (a Reset needs it low);
    6 none: Mixer's norms and cos(s, v_L) rises, but cos(s, v_0) does not fall (the sink is not
      the top key and the rest points along v_0);
    7 Reset, though Mixer's alignment conditions hold too: sink-dominated with the last token between sink
      and rest, and v_L entering only at N = 41 of 64, so cos(s, v_L) is low on most of the grid
      and rises at large N (the order makes it a Reset candidate);
    8 Reset, broadly spread: the rest dominates, the last token is the smallest and orthogonal to it;
    9 Reset: the sink is the largest, the last token intermediate (c_sink > c_last > c_rest), v_L
      orthogonal to v_0;
    10 none: the last token is the largest contribution (huge v_L, small weight) but enters I_N only
      at N = 41, so cos(s, v_L) is low on most of the grid (an unconfirmed Retriever).

    Under the definitions §5 rules heads 3 (rest dominates, last smallest, but everything, v_L too,
    points along e2) and 5 are unconfirmed Resets, 4 and 6 unconfirmed Mixers, 10 an unconfirmed
    Retriever.
    """
    gen = torch.Generator().manual_seed(seed)
    eye = torch.eye(d, dtype=torch.float64)
    e0, e1, e2 = eye[0], eye[1], eye[2]

    def noise(*shape, scale):
        return scale * torch.randn(*shape, d, generator=gen, dtype=torch.float64) / math.sqrt(d)

    def weights_of(sink: float, last: float) -> torch.Tensor:
        w = torch.empty(n_seqs, k, dtype=torch.float64)
        rest = torch.rand(n_seqs, k - 2, generator=gen, dtype=torch.float64) + 0.5
        w[:, 1:-1] = (1 - sink - last) * rest / rest.sum(-1, keepdim=True)
        w[:, 0], w[:, -1] = sink, last
        return w

    def late_last(rest_total: float, sink_rank: int) -> torch.Tensor:
        """Rest weights decreasing with the key index; the sink at rank ``sink_rank`` of the order;
        the last key just above key 40, so it enters I_N at N = 41 (with the sink ranked above)."""
        w = torch.zeros(k, dtype=torch.float64)
        w[1:-1] = torch.arange(k - 2, 0, -1, dtype=torch.float64)  # key i: k - 1 - i
        w[-1] = w[40] + 0.5
        w[1:] *= rest_total / w[1:-1].sum()
        w[0] = w[1 + sink_rank] + 1e-4 if sink_rank else 1 - w[1:].sum()
        return (w / w.sum()).expand(n_seqs, k).clone()

    ws, vs = [], []
    # 0 Retriever
    v = noise(n_seqs, k, scale=1.0)
    v[:, -1] += 2 * e1
    ws.append(weights_of(0.1, 0.7)), vs.append(v)
    # 1 Reset
    v = noise(n_seqs, k, scale=1.0) + 0.3 * e2
    v[:, 0] = 2 * e0 + noise(n_seqs, scale=0.1)
    v[:, -1] = e1 + noise(n_seqs, scale=0.1)
    ws.append(weights_of(0.7, 0.02)), vs.append(v)
    # 2 Mixer
    v = e1 + noise(n_seqs, k, scale=0.5)
    v[:, 0] = 0.4 * e0 + noise(n_seqs, scale=0.02)
    v[:, -1] = 3 * e1 + noise(n_seqs, scale=0.1)
    ws.append(weights_of(0.5, 0.1)), vs.append(v)
    # 3 none: rest dominates, last smallest
    v = e2 + noise(n_seqs, k, scale=0.5)
    v[:, 0] = e0 + noise(n_seqs, scale=0.1)
    ws.append(weights_of(0.05, 0.01)), vs.append(v)
    # 4 none: Mixer norms, no turn
    v = e0 + noise(n_seqs, k, scale=0.3)
    v[:, 0] = 0.4 * e0 + noise(n_seqs, scale=0.02)
    v[:, -1] = 3 * e0 + noise(n_seqs, scale=0.1)
    ws.append(weights_of(0.5, 0.1)), vs.append(v)
    # 5 none: sink-dominated, v_L-aligned (the last token is the top key)
    v = noise(n_seqs, k, scale=1.0)
    v[:, 0] = 1.6 * e0 + noise(n_seqs, scale=0.05)
    v[:, -1] = e1 + noise(n_seqs, scale=0.05)
    ws.append(weights_of(0.45, 0.5)), vs.append(v)
    # 6 none: rest along v_0 and on top of the order; v_L (huge norm, small weight) enters at N = 41
    w = late_last(rest_total=0.98, sink_rank=10)
    v = e0 + noise(n_seqs, k, scale=0.3)
    v[:, 0] = e0 + noise(n_seqs, scale=0.02)
    v[:, -1] = (0.3 / w[0, -1]) * e1 + noise(n_seqs, scale=0.1)
    ws.append(w), vs.append(v)
    # 7 Reset and Mixer: sink on top and dominant, rest along e2, v_L (huge norm) enters at N = 41
    w = late_last(rest_total=0.395, sink_rank=0)
    v = e2 + noise(n_seqs, k, scale=0.3)
    v[:, 0] = e0 / w[0, 0] * 0.6 + noise(n_seqs, scale=0.02)
    v[:, -1] = (0.45 / w[0, -1]) * e1 + noise(n_seqs, scale=0.1)
    ws.append(w), vs.append(v)
    # 8 Reset, broadly spread: rest along e2, the last token the smallest and along e1
    v = e2 + noise(n_seqs, k, scale=0.5)
    v[:, 0] = e0 + noise(n_seqs, scale=0.1)
    v[:, -1] = e1 + noise(n_seqs, scale=0.1)
    ws.append(weights_of(0.05, 0.01)), vs.append(v)
    # 9 Reset, sink largest and last intermediate: incoherent rest (small c_rest)
    v = noise(n_seqs, k, scale=1.0)
    v[:, 0] = 2 * e0 + noise(n_seqs, scale=0.05)
    v[:, -1] = e1 + noise(n_seqs, scale=0.05)
    ws.append(weights_of(0.5, 0.2)), vs.append(v)
    # 10 unconfirmed Retriever: v_L huge with a small weight, entering at N = 41; incoherent rest
    w = late_last(rest_total=0.98, sink_rank=10)
    v = noise(n_seqs, k, scale=1.0)
    v[:, 0] = e0 + noise(n_seqs, scale=0.02)
    v[:, -1] = (1.5 / w[0, -1]) * e1 + noise(n_seqs, scale=0.1)
    ws.append(w), vs.append(v)
    return torch.stack(ws, 1), torch.stack(vs, 1)


@pytest.fixture(scope="module")
def synthetic_table() -> pd.DataFrame:
    w, v = synthetic_heads()
    return tx.regime_feature_table(w, v, "log")


STRICT = ["Retriever", "Reset", "Mixer", "Unclassified", "Unclassified", "Unclassified", "Unclassified", "Reset",
          "Reset", "Reset", "Unclassified"]  # fmt: skip
CANDIDATES = ["Retriever", "Reset", "Mixer", "Reset", "Mixer", "Reset", "Mixer", "Reset", "Reset", "Reset", "Retriever"]


def test_synthetic_heads_get_their_regime(synthetic_table) -> None:
    heads = tx.classify_heads(synthetic_table)
    assert heads.attrs["mode"] == "strict"
    assert heads.regime.astype(str).tolist() == STRICT
    assert heads.candidate.tolist() == CANDIDATES
    assert heads.confirmed.tolist() == [r != "Unclassified" for r in STRICT]
    assert (heads.margin > 0).all()
    # the features that decided the labels are all there
    for col in ("c_sink", "c_last", "c_rest", "rho_0", "cos_vL_low", "cos_vL_high", "shift_v0", "shift_vL",
                "drop_sink", "drop_last", "score_retriever", "score_reset", "score_mixer", "deciding",
                "regime_strict", "regime_nearest"):  # fmt: skip
        assert col in heads.columns
    h = heads.set_index("head")
    assert h.c_last[0] > max(h.c_sink[0], h.c_rest[0]) and h.cos_vL_low[0] >= 0.5
    assert h.c_sink[1] > max(h.c_last[1], h.c_rest[1]) and h.cos_vL_high[1] <= 0.3
    assert h.c_sink[2] < h.c_last[2] < h.c_rest[2] and h.shift_v0[2] < -0.1 and h.shift_vL[2] > 0.1
    assert h.drop_last[0] > h.drop_sink[0] and h.drop_sink[1] > h.drop_last[1]  # Figure 7's signatures
    # broadly spread (rest largest, last smallest) and v_L apart: Reset
    assert h.c_rest[8] > h.c_sink[8] > h.c_last[8] and h.cos_vL_high[8] <= 0.3
    # sink largest, last intermediate: Reset (not Mixer: the sink is the largest)
    assert h.c_sink[9] > h.c_last[9] > h.c_rest[9] and h.slack_mixer_order[9] < 0
    # sink-dominated and Mixer's alignments hold too: the order makes it a Reset candidate
    assert h.slack_mixer_sink_falls[7] > 0 and h.slack_mixer_last_rises[7] > 0 and h.regime[7] == "Reset"


def test_every_unclassified_path(synthetic_table) -> None:
    h = tx.classify_heads(synthetic_table).set_index("head")
    # unconfirmed Retriever: the last token is the largest contribution, cos(s, v_L) low on most N
    assert h.slack_retriever_order[10] > 0 and h.deciding[10] == "slack_retriever_alignment"
    # unconfirmed Reset, sink branch: sink-dominated but s(N) aligned with v_L
    assert h.c_sink[5] > max(h.c_last[5], h.c_rest[5]) and h.deciding[5] == "slack_reset_alignment"
    # unconfirmed Reset, spread branch: last smallest, but v_L points along the rest
    assert h.c_last[3] < min(h.c_sink[3], h.c_rest[3]) and h.deciding[3] == "slack_reset_alignment"
    # unconfirmed Mixer: no turn at all (fails on the alignment, not on the order)
    assert h.slack_mixer_order[4] > 0 and h.deciding[4] in ("slack_mixer_sink_falls", "slack_mixer_last_rises")
    # unconfirmed Mixer: v_L rises but v_0 does not fall
    assert h.slack_mixer_order[6] > 0 and h.slack_mixer_last_rises[6] > 0 and h.deciding[6] == "slack_mixer_sink_falls"
    # no candidate: with a dominance above 1 no order condition may hold (head 0, Retriever by 2.8x)
    lead = float(np.log(h.c_last[0] / max(h.c_sink[0], h.c_rest[0])))
    strict = tx.classify_heads(synthetic_table, retriever_dominance=math.exp(lead) * 1.01).set_index("head")
    assert pd.isna(strict.candidate[0]) and strict.regime[0] == "Unclassified" and not strict.confirmed[0]
    assert strict.deciding[0] == "slack_retriever_order" and strict.margin[0] == pytest.approx(math.log(1.01))
    nearest = tx.classify_heads(synthetic_table, mode="nearest", retriever_dominance=math.exp(lead) * 1.01)
    assert nearest.regime[0] == "Retriever"  # missed by 1 %, the nearest regime still


def test_nearest_labels_every_head_and_keeps_the_confirmed_ones(synthetic_table) -> None:
    strict = tx.classify_heads(synthetic_table)
    nearest = tx.classify_heads(synthetic_table, mode="nearest")
    assert nearest.attrs["mode"] == "nearest" and (nearest.regime != "Unclassified").all()
    assert nearest.regime.astype(str).tolist() == CANDIDATES  # here the candidate is also the nearest
    confirmed = strict.regime != "Unclassified"
    assert (nearest.regime[confirmed] == strict.regime[confirmed]).all()
    assert (strict.regime_nearest == nearest.regime).all() and (nearest.regime_strict == strict.regime).all()
    # nearest = the largest score; margin = its lead over the runner-up (a slow reference)
    scores = nearest[["score_retriever", "score_reset", "score_mixer"]].to_numpy()
    for row, s in zip(nearest.itertuples(), scores):
        best = ["Retriever", "Reset", "Mixer"][int(np.argmax(s))]
        assert row.regime == best
        assert row.margin == pytest.approx(sorted(s)[-1] - sorted(s)[-2], abs=1e-12)
        assert row.deciding.startswith(f"slack_{best.lower()}_")
    with pytest.raises(InputError, match="mode must be one of"):
        tx.classify_heads(synthetic_table, mode="loose")


def test_head_features_summarise_the_mean_curves(synthetic_table) -> None:
    hf = tx.head_features(synthetic_table, n_small=2, large_frac=0.25, stay_share=0.6)
    assert list(hf.columns) == tx.HEAD_FEATURE_COLUMNS
    for _, row in hf.iterrows():
        t = synthetic_table[synthetic_table["head"] == row["head"]].sort_values("n")
        n, k = t.n.to_numpy(), int(row.n_keys)
        small, large = n <= 2, n >= 0.25 * k
        assert row.cos_vL_low == pytest.approx(np.quantile(t.cos_s_vL, 0.4))
        assert row.cos_vL_high == pytest.approx(np.quantile(t.cos_s_vL, 0.6))
        assert row.cos_v0_small == pytest.approx(t.cos_s_v0[small].mean())
        assert row.shift_v0 == pytest.approx(t.cos_s_v0[large].mean() - t.cos_s_v0[small].mean())
        assert row.shift_vL == pytest.approx(t.cos_s_vL[large].mean() - t.cos_s_vL[small].mean())
        drop = (1 - t.norm_s_minus_last / t.norm_s).dropna()
        assert row.drop_last == pytest.approx(np.median(drop))
        assert row.c_rest == t.c_rest.iloc[0] and row.n_keys == 64


def test_margin_is_the_distance_to_the_nearest_label_change(synthetic_table) -> None:
    heads = tx.classify_heads(synthetic_table).set_index("head")
    scores = heads[["score_retriever", "score_reset", "score_mixer"]].to_numpy()
    assert heads.margin[0] == pytest.approx(scores[0, 0])  # Retriever: its own tightest slack
    assert heads.margin[2] == pytest.approx(scores[2, 2])  # Mixer: its own tightest slack
    for unclassified in (3, 4, 5, 6, 10):  # the regime closest to holding
        assert heads.margin[unclassified] == pytest.approx(min(abs(scores[unclassified]).tolist()))
    # a label's slack is the smallest of its conditions, order included
    assert heads.margin[7] == pytest.approx(heads.slack_reset_order[7]) and heads.deciding[7] == "slack_reset_order"
    # moving the deciding threshold by just more than the margin changes the label
    cos_low = heads.cos_vL_low[0]
    assert tx.classify_heads(synthetic_table, retriever_cos=cos_low - 1e-6).regime[0] == "Retriever"
    relabel = tx.classify_heads(synthetic_table, retriever_cos=cos_low + 1e-6)
    assert relabel.regime[0] == "Unclassified" and relabel.deciding[0] == "slack_retriever_alignment"
    assert relabel.margin[0] == pytest.approx(1e-6, abs=1e-9)
    # classify again from the head-features table alone, with other thresholds
    hf = tx.head_features(synthetic_table)
    again = tx.classify_heads(hf, mixer_shift=10.0)
    assert again.regime.astype(str).tolist()[:3] == ["Retriever", "Reset", "Unclassified"]
    assert again.attrs["thresholds"]["mixer_shift"] == 10.0
    with pytest.raises(InputError, match="unknown thresholds"):
        tx.classify_heads(synthetic_table, retriver_cos=0.4)


def test_classify_needs_one_query_position_and_a_table() -> None:
    gen = torch.Generator().manual_seed(1)
    w = torch.softmax(torch.randn(2, 2, 10, generator=gen), -1)
    v = torch.randn(2, 2, 10, 4, generator=gen)
    two = pd.concat([tx.regime_feature_table(w, v), tx.regime_feature_table(w[..., :8], v[:, :, :8])])
    with pytest.raises(InputError, match="query_pos"):
        tx.classify_heads(two)
    assert len(tx.classify_heads(two, query_pos=7)) == 2
    with pytest.raises(InputError, match="regime_features"):
        tx.classify_heads(object())


# ----------------------------------------------------------------------------- correlations


def test_pearson_and_spearman_against_a_hand_computation() -> None:
    x, y = np.array([1.0, 2.0, 2.0, 3.0]), np.array([2.0, 1.0, 4.0, 8.0])
    assert tx.average_ranks(x).tolist() == [1.0, 2.5, 2.5, 4.0]
    # Pearson: dx = (-1, 0, 0, 1), dy = (-1.75, -2.75, 0.25, 4.25): 6 / sqrt(2 * 28.75)
    assert tx.pearson(x, y) == pytest.approx(6 / math.sqrt(57.5), abs=1e-12)
    # Spearman: ranks (1, 2.5, 2.5, 4) and (2, 1, 3, 4): 3 / sqrt(4.5 * 5)
    assert tx.spearman(x, y) == pytest.approx(3 / math.sqrt(22.5), abs=1e-12)
    assert math.isnan(tx.pearson(np.ones(4), y)) and math.isnan(tx.spearman(x[:1], y[:1]))


def test_sink_effect_per_n_against_a_hand_computation() -> None:
    # four (layer, head) pairs, two sequences each; kv_head g = head // 2
    rows = []
    recall_n2 = {(0, 0): (1.0, 1.0), (0, 1): (2.0, 2.0), (1, 0): (1.5, 2.5), (1, 1): (3.0, 3.0)}
    for (layer, head), rs in recall_n2.items():
        for seq, r in enumerate(rs):
            rows.append(dict(seq=seq, layer=layer, head=head, kv_head=0, query_pos=9, n=1, recall=1.0))
            rows.append(dict(seq=seq, layer=layer, head=head, kv_head=0, query_pos=9, n=2, recall=r))
    sep = pd.DataFrame(rows)
    # mean recall(2) = (1, 2, 2, 3) against rho_0 = (2, 1, 4, 8): the hand example above
    rho = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "rho_0": [2.0, 1.0, 4.0, 8.0]})
    out = tx.sink_effect(sep, rho).set_index("n")
    assert list(out.reset_index().columns) == ["n", "pearson", "spearman", "n_heads"]
    assert out.pearson[2] == pytest.approx(6 / math.sqrt(57.5))
    assert out.spearman[2] == pytest.approx(3 / math.sqrt(22.5))
    assert out.n_heads[2] == 4 and math.isnan(out.pearson[1])  # recall(1) = 1 everywhere
    # per (layer, kv_head): heads of one kv head share rho_0
    rho_kv = pd.DataFrame({"layer": [0, 1], "kv_head": [0, 0], "rho_0": [1.0, 2.0]})
    out_kv = tx.sink_effect(sep, rho_kv).set_index("n")
    assert out_kv.pearson[2] == pytest.approx(tx.pearson(np.array([1, 2, 2, 3.0]), np.array([1, 1, 2, 2.0])))
    # a head without rho_0 is left out
    out3 = tx.sink_effect(sep, rho.iloc[:3]).set_index("n")
    assert out3.n_heads[2] == 3


# ----------------------------------------------------------------------------- summaries


def test_shares_pr_curves_and_stability(synthetic_table) -> None:
    heads = tx.classify_heads(synthetic_table)
    shares = tx.regime_shares(heads)
    assert len(shares) == 4 and shares.share.sum() == pytest.approx(1.0)
    got = dict(zip(shares.regime.astype(str), shares.n_heads))
    assert got == {"Retriever": 1, "Reset": 4, "Mixer": 1, "Unclassified": 5}

    w, v = synthetic_heads()
    res = tlg.separability(w, v, "log")
    sep = pd.DataFrame(
        [dict(seq=s, layer=0, head=h, query_pos=63, n=int(n), precision=float(res.precision[s, h, i]),
              recall=float(res.recall[s, h, i]), f_at_rmax=float(res.f_at_rmax[s, h, i]),
              f_at_rmin=float(res.f_at_rmin[s, h, i]))
         for s in range(w.shape[0]) for h in range(w.shape[1]) for i, n in enumerate(res.ns)]
    )  # fmt: skip
    pr = tx.regime_pr_curves(sep, heads)
    un = pr[pr.regime == "Unclassified"].set_index("n")
    hand = res.recall[:, [3, 4, 5, 6, 10]].mean(0).mean(0).numpy()  # mean over seqs, then over the five heads
    assert _close(un.recall.to_numpy(), hand, 1e-12) and (un.n_heads == 5).all() and (un.n_rows == 40).all()

    # stability: two halves of the same heads give the same labels; a broken half changes two
    w, v = synthetic_heads(n_seqs=16, seed=3)
    acc_a = tx.regime_feature_table(w[:8], v[:8], "log")
    acc_b = tx.regime_feature_table(w[8:], v[8:], "log")
    same = tx.classification_stability(acc_a, acc_b)
    assert same.n_heads == 11 and same.n_changed == 0 and same.transitions().to_numpy().trace() == 11
    same_nearest = tx.classification_stability(acc_a, acc_b, mode="nearest")
    assert same_nearest.n_changed == 0 and same_nearest.transitions().loc["Unclassified"].sum() == 0
    swapped = w[8:].clone()
    swapped[:, [0, 1]] = swapped[:, [1, 0]]  # Retriever's weights on Reset's values and back
    vs = v[8:].clone()
    vs[:, [0, 1]] = vs[:, [1, 0]]
    changed = tx.classification_stability(acc_a, tx.regime_feature_table(swapped, vs, "log"))
    assert changed.n_changed == 2 and changed.table.changed.tolist()[:2] == [True, True]


def test_regime_features_of_a_full_causal_row_are_cut_or_refused() -> None:
    """Key ``L`` is the query: a full causal row of an earlier query (trailing weights exactly 0) is
    refused, and with ``query_positions=q`` gives the features of its causal keys (issue 20)."""
    torch.manual_seed(0)
    causal = torch.softmax(torch.randn(3, 6, dtype=torch.float64), -1)
    weights = torch.cat([causal, torch.zeros(3, 6, dtype=torch.float64)], -1)
    values = torch.randn(3, 12, 4, dtype=torch.float64)
    with pytest.raises(InputError, match="weight exactly 0"):
        tx.regime_features(weights, values, "all")
    cut = tx.regime_features(weights, values, "all", query_positions=5)
    ref = tx.regime_features(causal, values[:, :6], "all")
    assert torch.equal(cut.cos_s_vL.nan_to_num(-9), ref.cos_s_vL.nan_to_num(-9))
    assert torch.equal(cut.rho_0, ref.rho_0)
