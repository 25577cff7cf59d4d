"""Tests of the assumption diagnostics (definitions §3): recovery of planted parameters, violations,
batch-split / merge / resume invariance, shapes, degenerate profiles.

Expected values come from the generators' parameters or from the slow references below, which
are written from docs/definitions.md with numpy loops and share no code with the package.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxtyping import TypeCheckError

import tl_geometry.diagnostics as D
from tl_geometry.capture.hooks import LayerBatch
from tl_geometry.errors import InputError
from tl_geometry.models import ModelInfo

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------- generators


def ar1_unit(gen: torch.Generator, batch: int, n: int, d: int, beta: float) -> torch.Tensor:
    """Unit vectors with E cos(w_i, w_j) = exp(-beta |i-j|): w_i ∝ a w_{i-1} + sqrt(1-a^2) z_i."""
    a = math.exp(-beta)
    s = math.sqrt(1 - a * a)
    z = torch.randn(batch, n, d, generator=gen, dtype=torch.float64) / math.sqrt(d)
    w = torch.empty_like(z)
    w[:, 0] = z[:, 0] / z[:, 0].norm(dim=-1, keepdim=True)
    for i in range(1, n):
        x = a * w[:, i - 1] + s * z[:, i]
        w[:, i] = x / x.norm(dim=-1, keepdim=True)
    return w


def planted_head(gen, batch, n_keys, d, *, beta, rho0, lam, norm, cv) -> torch.Tensor:
    """Values [batch, n_keys, d] of one head satisfying Assumptions 1-2.

    Non-sink: AR(1) unit directions (cos = exp(-beta k) in expectation) with norms
    norm * (1 + cv * N(0, 1)). Sink: norm lam * norm, direction u_0 = sum_j c_j w_j + residual,
    with c = rho0 E^{-1} 1 for the AR(1) correlation matrix E (whose inverse is tridiagonal:
    row sums 1/(1+a) at the ends, (1-a)/(1+a) inside), so <u_0, w_k> = rho0 for every k.
    """
    n = n_keys - 1
    a = math.exp(-beta)
    w = ar1_unit(gen, batch, n, d, beta)
    c = torch.full((n,), (1 - a) / (1 + a), dtype=torch.float64)
    c[0] = c[-1] = 1 / (1 + a)
    c *= rho0
    u0 = torch.einsum("j,bjd->bd", c, w)
    r = torch.randn(batch, d, generator=gen, dtype=torch.float64)
    u0 = u0 + math.sqrt(1 - rho0 * float(c.sum())) * r / r.norm(dim=-1, keepdim=True)
    u0 = u0 / u0.norm(dim=-1, keepdim=True)
    norms = norm * (1 + cv * torch.randn(batch, n, 1, generator=gen, dtype=torch.float64))
    return torch.cat([lam * norm * u0[:, None], norms * w], dim=1)


HEADS = [  # (beta, rho0, lam, norm, cv) per key/value head
    dict(beta=0.05, rho0=0.3, lam=0.05, norm=3.0, cv=0.02),
    dict(beta=0.2, rho0=0.0, lam=0.2, norm=1.0, cv=0.05),
]


@pytest.fixture(scope="module")
def planted_values() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    heads = [planted_head(gen, 4, 256, 1024, **h) for h in HEADS]
    return torch.stack(heads, dim=2)  # [4, 256, 2, 1024]


def alternating_values(gen, batch, n_keys, d) -> torch.Tensor:
    """Violates Assumptions 1-2: v_j = (-1)^j w + noise (negative cosines at odd lags), v_0 like the rest."""
    w = torch.randn(batch, 1, d, generator=gen, dtype=torch.float64)
    sign = torch.tensor([(-1.0) ** j for j in range(n_keys)], dtype=torch.float64)[None, :, None]
    v = sign * w + 0.5 * torch.randn(batch, n_keys, d, generator=gen, dtype=torch.float64)
    return v[:, :, None, :]


def planted_profile(n_keys, *, p_sink, p_base, eta_osc, omega, eta_exp, t1, t2) -> np.ndarray:
    """Assumption 3 exactly (definitions §3), written independently of the package."""
    alpha = np.empty(n_keys)
    for i in range(n_keys):
        if i == 0:
            alpha[i] = p_sink
        elif i <= t1:
            alpha[i] = p_base
        elif i <= t2:
            alpha[i] = p_base * (1 + eta_osc * math.cos(omega * i))
        else:
            alpha[i] = p_base * math.exp(eta_exp * (i - t2))
    return alpha


# ----------------------------------------------------------------------------- references


def ref_norm_stats(values: torch.Tensor) -> pd.DataFrame:
    """Per-sequence definitions §3 norm statistics with numpy, averaged over sequences."""
    v = values.double().numpy()
    rows = []
    for g in range(v.shape[2]):
        ratio, cv = [], []
        for s in range(v.shape[0]):
            n = np.linalg.norm(v[s, :, g], axis=-1)
            ratio.append(n[0] / np.median(n[1:]))
            cv.append(np.std(n[1:]) / np.mean(n[1:]))
        rows.append(dict(kv_head=g, sink_ratio=np.mean(ratio), norm_cv=np.mean(cv)))
    return pd.DataFrame(rows)


def ref_similarity(values: torch.Tensor, k_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """c(k) [g, k_max], share of negative cosines [g], rho_0 [g] from full cosine matrices."""
    v = values.double().numpy()
    n_seq, n_keys, n_kv, _ = v.shape
    c = np.zeros((n_kv, k_max))
    neg = np.zeros(n_kv)
    rho = np.zeros(n_kv)
    for g in range(n_kv):
        sums, counts, n_neg, n_pairs, sink = np.zeros(k_max), np.zeros(k_max), 0, 0, []
        for s in range(n_seq):
            u = v[s, :, g] / np.linalg.norm(v[s, :, g], axis=-1, keepdims=True)
            cos = u @ u.T
            for k in range(1, k_max + 1):
                diag = np.array([cos[i, i + k] for i in range(1, n_keys - k)])  # i, j > 0
                sums[k - 1] += diag.sum()
                counts[k - 1] += len(diag)
                n_neg += (diag < 0).sum()
                n_pairs += len(diag)
            sink.extend(cos[0, 1:])
        c[g] = sums / counts
        neg[g] = n_neg / n_pairs
        rho[g] = np.mean(sink)
    return c, neg, rho


# ----------------------------------------------------------------------------- Assumption 1


def test_norms_recover_planted_lambda_and_cv(planted_values):
    s = D.value_norm_stats(planted_values).summary
    for g, h in enumerate(HEADS):
        row = s[s.kv_head == g].iloc[0]
        assert row.sink_ratio == pytest.approx(h["lam"], rel=0.03)
        assert row.norm_cv == pytest.approx(h["cv"], rel=0.15)
        assert row.median_norm == pytest.approx(h["norm"], rel=0.01)
        assert row.sink_norm == pytest.approx(h["lam"] * h["norm"], rel=1e-9)  # planted exactly
    curve = D.value_norm_stats(planted_values).by_position
    first = curve[(curve.kv_head == 0) & (curve.position == 0)].mean_norm.item()
    assert first == pytest.approx(HEADS[0]["lam"] * HEADS[0]["norm"], rel=1e-9)
    assert len(curve) == 2 * 256


def test_norms_match_numpy_reference():
    gen = torch.Generator().manual_seed(5)
    # per-sequence scales differ, and an even count of non-sink keys: exercises the median rule
    values = torch.randn(3, 9, 2, 4, generator=gen) * torch.tensor([1.0, 5.0, 0.2])[:, None, None, None]
    got = D.value_norm_stats(values).summary
    ref = ref_norm_stats(values)
    np.testing.assert_allclose(got.sink_ratio, ref.sink_ratio, rtol=1e-12)
    np.testing.assert_allclose(got.norm_cv, ref.norm_cv, rtol=1e-12)


# ----------------------------------------------------------------------------- Assumption 2


def test_similarity_recovers_planted_beta_and_rho0(planted_values):
    s = D.similarity_decay(planted_values, k_max=64).summary
    for g, h in enumerate(HEADS):
        row = s[s.kv_head == g].iloc[0]
        assert row.beta == pytest.approx(h["beta"], rel=0.05)
        assert row.rho_0 == pytest.approx(h["rho0"], abs=0.02)
        assert row.mae < 0.01
    # slow decay: cosines stay positive up to k = 64 (exp(-3.2) = 0.04 > the 0.03 noise)
    assert s.share_negative.iloc[0] < 0.05


@pytest.mark.parametrize("k_max", [1, 5, 40, None])  # banded blocks, and the single-block Gram (None)
def test_similarity_matches_full_cosine_reference(k_max):
    gen = torch.Generator().manual_seed(7)
    values = torch.randn(3, 70, 2, 6, generator=gen)
    values[:, 1:] += 0.8 * torch.randn(3, 1, 2, 6, generator=gen)  # positive mean cosine
    res = D.similarity_decay(values, k_max=k_max)
    kk = 68 if k_max is None else k_max
    c, neg, rho = ref_similarity(values, kk)
    curve = res.curve.sort_values(["kv_head", "k"])
    np.testing.assert_allclose(curve.c.to_numpy().reshape(2, kk), c, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.summary.share_negative, neg, rtol=1e-12)
    np.testing.assert_allclose(res.summary.rho_0, rho, rtol=1e-10)
    assert (res.summary.k_max == kk).all()


def test_exponential_fit_is_exact_on_an_exact_curve():
    from tl_geometry.diagnostics.decay_fit import fit_exponential_decay

    ks = torch.arange(1, 65)
    betas = torch.tensor([0.003, 0.05, 0.7, 4.0], dtype=torch.float64)
    beta, mae = fit_exponential_decay(torch.exp(-betas[:, None] * ks), ks)
    np.testing.assert_allclose(beta, betas, rtol=1e-6)
    assert (mae < 1e-7).all()


def test_violating_values_are_reported():
    gen = torch.Generator().manual_seed(11)
    values = alternating_values(gen, 3, 200, 256)
    sim = D.similarity_decay(values, k_max=16).summary.iloc[0]
    norms = D.value_norm_stats(values).summary.iloc[0]
    assert sim.share_negative > 0.4  # every odd lag is negative
    assert sim.mae > 0.2  # no exponential follows a sign-alternating curve
    assert 0.9 < norms.sink_ratio < 1.1  # no compressed sink
    curve = D.similarity_decay(values, k_max=16).curve
    assert (curve[curve.k % 2 == 1].c < -0.5).all()


# ----------------------------------------------------------------------------- Assumption 3

PROFILES = {
    "four_phases": dict(p_sink=0.5, p_base=1e-4, eta_osc=0.5, omega=0.05, eta_exp=0.02, t1=200, t2=800),
    "fast_oscillation": dict(p_sink=0.2, p_base=3e-4, eta_osc=0.3, omega=1.3, eta_exp=0.03, t1=100, t2=900),
    "no_oscillation": dict(p_sink=0.3, p_base=2e-4, eta_osc=0.0, omega=0.0, eta_exp=0.03, t1=600, t2=600),
    "no_recency": dict(p_sink=0.3, p_base=2e-4, eta_osc=0.4, omega=0.2, eta_exp=0.0, t1=300, t2=1023),
}


@pytest.mark.parametrize("name", list(PROFILES))
def test_profile_recovers_planted_parameters(name):
    p = PROFILES[name]
    n_keys, n_seqs, noise = 1024, 4, 0.1
    alpha = torch.tensor(planted_profile(n_keys, **p))
    gen = torch.Generator().manual_seed(3)
    weights = alpha * torch.exp(noise * torch.randn(n_seqs, 1, n_keys, generator=gen, dtype=torch.float64))
    row = D.fit_attention_profile(weights).summary.iloc[0]
    assert row.p_sink == pytest.approx(weights[:, 0, 0].mean().item(), rel=1e-12)  # definitions §3: the mean alpha_0
    # the mean of exp(noise * N) is exp(noise^2 / 2): 0.5 % above the planted value
    assert row.p_base == pytest.approx(p["p_base"] * math.exp(noise**2 / 2), rel=0.03)
    # log of a mean of 4 lognormal(0.1) factors: sd ~ 0.05, mean absolute value ~ 0.04
    assert row.fit_ok and row.fit_error < 0.06
    if p["t1"] == p["t2"]:
        assert row.T1 == row.T2 and math.isnan(row.eta_osc) and math.isnan(row.omega)
    else:
        assert abs(row.T1 - p["t1"]) <= 5
        assert row.omega == pytest.approx(p["omega"], rel=0.01)
        assert row.eta_osc == pytest.approx(p["eta_osc"], abs=0.03)
    if p["t2"] == n_keys - 1:
        assert row.T2 == n_keys - 1 and math.isnan(row.eta_exp)
    else:
        assert abs(row.T2 - p["t2"]) <= 10
        assert row.eta_exp == pytest.approx(p["eta_exp"], rel=0.1)


def test_profile_error_matches_reported_parameters():
    """fit_error is the MAE of log alpha of the law with the *reported* parameters (definitions §3)."""
    gen = torch.Generator().manual_seed(4)
    weights = torch.softmax(2 * torch.randn(6, 3, 300, generator=gen, dtype=torch.float64), dim=-1)
    weights[..., -40:] *= torch.exp(0.05 * torch.arange(40.0, dtype=torch.float64))
    fit = D.fit_attention_profile(weights)
    mean = weights.mean(0).numpy()
    for _, row in fit.summary.iterrows():
        law = planted_profile(
            300, p_sink=row.p_sink, p_base=row.p_base, omega=0.0 if math.isnan(row.omega) else row.omega,
            eta_osc=0.0 if math.isnan(row.eta_osc) else row.eta_osc,
            eta_exp=0.0 if math.isnan(row.eta_exp) else row.eta_exp, t1=row.T1, t2=row.T2,
        )  # fmt: skip
        err = np.mean(np.abs(np.log(mean[row["head"], 1:]) - np.log(law[1:])))
        assert row.fit_error == pytest.approx(err, rel=1e-9)
        fitted = fit.curve[fit.curve["head"] == row["head"]].fitted.to_numpy()
        np.testing.assert_allclose(fitted, law, rtol=1e-9)


def test_unstructured_profile_is_a_bad_fit():
    gen = torch.Generator().manual_seed(8)
    weights = torch.exp(2.0 * torch.randn(2, 512, generator=gen))  # [head, key], one sequence, no law
    row = D.fit_attention_profile(weights).summary
    assert (row.fit_error > 1.0).all() and not row.fit_ok.any()


def test_degenerate_profiles_never_raise():
    k = 64
    flat = torch.full((k,), 1.0 / k)
    rows = torch.stack([torch.zeros(k), flat, torch.full((k,), math.nan), torch.eye(k)[0], torch.eye(k)[-1]])
    s = D.fit_attention_profile(rows).summary
    zero, fl, nan, sink_only, last_only = (s.iloc[i] for i in range(5))
    assert not zero.fit_ok and zero.n_floored == k - 1
    assert fl.fit_ok and fl.fit_error < 1e-9 and fl.T1 == fl.T2 == k - 1  # a flat profile is the law
    assert fl.p_base == pytest.approx(1.0 / k)
    assert not nan.fit_ok
    assert not sink_only.fit_ok and sink_only.p_sink == 1.0  # nothing after the sink
    assert not last_only.fit_ok and last_only.n_floored == k - 2  # zeros: the fit depends on the floor
    for n_keys in (1, 2, 3, 4, 7):
        out = D.fit_attention_profile(torch.rand(2, n_keys)).summary
        assert len(out) == 2 and (out.T1 <= out.T2).all() and (out.T2 <= max(n_keys - 1, 0)).all()
    assert not D.fit_attention_profile(torch.rand(1, 1)).summary.fit_ok.any()


@settings(max_examples=60, deadline=None)
@given(
    n_keys=st.integers(1, 40),
    entries=st.lists(
        st.sampled_from([0.0, 1e-30, 1e-6, 0.01, 0.5, 1.0, 1e30, math.inf, math.nan]), min_size=40, max_size=40
    ),
)
def test_profile_fit_never_raises(n_keys, entries):
    weights = torch.tensor(entries[:n_keys], dtype=torch.float64)[None]
    s = D.fit_attention_profile(weights).summary.iloc[0]
    assert s.T1 <= s.T2 <= max(n_keys - 1, 0)
    bad = not all(math.isfinite(x) and x >= 1e-12 for x in entries[1:n_keys]) or n_keys == 1
    if bad:
        assert not s.fit_ok


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "torch"])
@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 80), d=st.integers(1, 6), k_frac=st.floats(0.0, 1.0), seed=st.integers(0, 2**31))
def test_lag_cosine_moments_match_the_diagonals(compiled, n, d, k_frac, seed):
    from tl_geometry.diagnostics.lag_cosines import lag_cosine_moments

    k_max = 1 + int(k_frac * (n - 2))
    u = torch.randn(2, n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    moments, neg = lag_cosine_moments(u, k_max, compiled=compiled)
    for r in range(2):
        g = (u[r] @ u[r].T).numpy()
        for k in range(1, k_max + 1):
            diag = np.array([g[i, i + k] for i in range(n - k)])
            assert moments.count[r, k - 1].item() == n - k
            assert moments.mean[r, k - 1].item() == pytest.approx(diag.mean(), rel=1e-12, abs=1e-12)
            assert moments.m2[r, k - 1].item() == pytest.approx(((diag - diag.mean()) ** 2).sum(), rel=1e-12, abs=1e-12)
            assert neg[r, k - 1].item() == (diag < 0).sum()


@pytest.mark.parametrize(("n", "k_max"), [(1023, 64), (300, 64), (100, 99), (64, 40)])
def test_lag_cosine_moments_compiled_agree_with_torch(n, k_max):
    """Many blocks, one block (the Gram matrix) and a partial last block: the compiled moments are
    the torch ones to rounding, the counts and negatives exactly."""
    from tl_geometry.diagnostics.lag_cosines import lag_cosine_moments

    u = torch.nn.functional.normalize(torch.randn(3, n, 16, generator=torch.Generator().manual_seed(n)), dim=-1)
    u = u.double()
    (fast, fast_neg), (slow, slow_neg) = (lag_cosine_moments(u, k_max, compiled=c) for c in (True, False))
    assert torch.equal(fast.count, slow.count) and torch.equal(fast_neg, slow_neg)
    torch.testing.assert_close(fast.mean, slow.mean, rtol=0, atol=1e-13)
    torch.testing.assert_close(fast.m2, slow.m2, rtol=1e-12, atol=1e-12)


def test_profile_fit_of_every_head_in_one_call_equals_each_head_alone():
    """30 layers x 9 heads x 1024 keys in one vectorised call: each head's fit is the one it gets alone.

    (Its cost is measured by benchmarks, not asserted here: no timed assertion.)"""
    gen = torch.Generator().manual_seed(9)
    weights = torch.softmax(torch.randn(270, 1024, generator=gen), dim=-1)
    together = D.fit_attention_profile(weights).summary
    assert len(together) == 270
    for head in (0, 133, 269):
        alone = D.fit_attention_profile(weights[head : head + 1]).summary
        pd.testing.assert_series_equal(
            alone.drop(columns="head").iloc[0], together.drop(columns="head").iloc[head], check_names=False
        )


# ----------------------------------------------------------------------------- mergeability


def _batches(n_seqs: int, splits: list[int]) -> list[slice]:
    assert sum(splits) == n_seqs
    edges = np.cumsum([0, *splits])
    return [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


@pytest.fixture(scope="module")
def stream() -> tuple[torch.Tensor, torch.Tensor]:
    """7 sequences with very different scales (a mean of batch means would differ)."""
    gen = torch.Generator().manual_seed(21)
    scale = torch.tensor([0.1, 1.0, 10.0, 1.0, 3.0, 0.5, 7.0])[:, None, None, None]
    values = torch.randn(7, 40, 2, 8, generator=gen) * scale
    values = values + torch.randn(7, 1, 2, 8, generator=gen)
    logits = torch.randn(7, 6, 2, 40, generator=gen) * scale
    causal = torch.arange(40)[None, :] > torch.tensor([20, 39])[:, None]  # query rows 20 and 39
    weights = torch.softmax(logits.masked_fill(causal, -math.inf), dim=-1)
    return values, weights


def _assert_results_equal(a, b):
    for name in ("summary", "by_position", "curve"):
        if hasattr(a, name):
            pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("splits", [[7], [1, 4, 2], [3, 1, 1, 2], [1] * 7])
def test_accumulators_do_not_depend_on_batching(stream, splits):
    values, weights = stream
    whole = (D.NormAccumulator().update(values), D.SimilarityAccumulator(10).update(values),
             D.ProfileAccumulator().update(weights[:, :, -1]))  # fmt: skip
    parts = [D.NormAccumulator(), D.SimilarityAccumulator(10), D.ProfileAccumulator()]
    for sl in _batches(7, splits)[::-1]:  # in reverse order, too
        part = (D.NormAccumulator().update(values[sl]), D.SimilarityAccumulator(10).update(values[sl]),
                D.ProfileAccumulator().update(weights[sl, :, -1]))  # fmt: skip
        for acc, p in zip(parts, part):
            acc.merge(p)
    for w, p in zip(whole, parts):
        _assert_results_equal(w.result(), p.result())


def test_batching_changes_nothing_that_averaging_averages_would(stream):
    """Guard: the scales of ``stream`` make a naive mean of per-batch results differ."""
    values, _ = stream
    a = D.value_norm_stats(values[:1]).summary.mean_norm
    b = D.value_norm_stats(values[1:]).summary.mean_norm
    pooled = D.value_norm_stats(values).summary.mean_norm
    assert not np.allclose((a + b) / 2, pooled, rtol=1e-3)


INFO = ModelInfo("toy", "test", n_layers=2, n_heads=6, n_kv_heads=2, d_head=8, n_ctx=64,
                 bos_token_id=None, values_include_value_bias=True)  # fmt: skip


def _layer_batches(values, weights, sl, layers=(0, 1)):
    ids = torch.arange(values.shape[0])[sl]
    for layer in layers:
        yield LayerBatch(layer=layer, seq_ids=ids, query_positions=(20, 39), weights=weights[sl],
                         values=values[sl] * (1 + layer))  # fmt: skip


def _observe(obs, values, weights, splits):
    for sl in _batches(values.shape[0], splits):
        for batch in _layer_batches(values, weights, sl):
            obs.observe(batch)
    return obs


def _assert_tables_equal(a: D.DiagnosticsTables, b: D.DiagnosticsTables):
    for name, table in a.as_dict().items():
        pd.testing.assert_frame_equal(table, getattr(b, name), rtol=1e-12, atol=1e-14, obj=name)


def test_observer_batching_merge_and_resume_agree(stream):
    values, weights = stream
    one = _observe(D.DiagnosticsObserver(INFO, k_max=10), values, weights, [7]).tables()
    split = _observe(D.DiagnosticsObserver(INFO, k_max=10), values, weights, [2, 1, 4]).tables()
    _assert_tables_equal(one, split)

    # two observers on disjoint sequences, merged
    a, b = D.DiagnosticsObserver(INFO, k_max=10), D.DiagnosticsObserver(INFO, k_max=10)
    for batch in _layer_batches(values, weights, slice(0, 3)):
        a.observe(batch)
    for batch in _layer_batches(values, weights, slice(3, 7)):
        b.observe(batch)
    _assert_tables_equal(one, b.merge(a).tables())

    # resume: save after 5 sequences, reload into a fresh observer, continue
    first = D.DiagnosticsObserver(INFO, k_max=10)
    for batch in _layer_batches(values, weights, slice(0, 5)):
        first.observe(batch)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    resumed = D.DiagnosticsObserver(INFO, k_max=10).load_state_dict(torch.load(buf))
    for batch in _layer_batches(values, weights, slice(5, 7)):
        resumed.observe(batch)
    _assert_tables_equal(one, resumed.tables())


def test_observer_tables_match_the_functions(stream):
    values, weights = stream
    tables = _observe(D.DiagnosticsObserver(INFO, k_max=10), values, weights, [3, 4]).tables()
    for layer in (0, 1):
        v = values * (1 + layer)
        norms = tables.value_norms[tables.value_norms.layer == layer].drop(columns="layer").reset_index(drop=True)
        pd.testing.assert_frame_equal(norms, D.value_norm_stats(v).summary, rtol=1e-12)
        sim = tables.similarity[tables.similarity.layer == layer].drop(columns="layer").reset_index(drop=True)
        pd.testing.assert_frame_equal(sim, D.similarity_decay(v, k_max=10).summary, rtol=1e-12)
        prof = tables.attention_profile[tables.attention_profile.layer == layer].reset_index(drop=True)
        direct = D.fit_attention_profile(weights[:, :, 1, :40]).summary  # the last query row: 39
        pd.testing.assert_frame_equal(prof[direct.columns], direct, rtol=1e-12)
    ap = tables.attention_profile
    assert (ap.query_pos == 39).all() and (ap.n_keys == 40).all()
    assert ap.kv_head.tolist() == [h // 3 for h in range(6)] * 2  # grouped-query: g = h // 3
    assert set(tables.similarity_curve.k) == set(range(1, 11))
    assert len(tables.value_norm_curve) == 2 * 2 * 40
    assert len(tables.attention_profile_curve) == 2 * 6 * 40


def test_observer_refuses_double_counting(stream):
    values, weights = stream
    obs = _observe(D.DiagnosticsObserver(INFO), values, weights, [7])
    with pytest.raises(InputError, match="already observed"):
        obs.observe(next(_layer_batches(values, weights, slice(2, 3))))
    with pytest.raises(InputError, match="twice"):
        obs.merge(_observe(D.DiagnosticsObserver(INFO), values, weights, [7]))
    with pytest.raises(InputError, match="settings"):
        obs.merge(D.DiagnosticsObserver(INFO, k_max=5))


def test_merging_mismatched_geometry_raises():
    a = D.NormAccumulator().update(torch.randn(2, 10, 1, 4))
    with pytest.raises(InputError, match="n_keys"):
        a.merge(D.NormAccumulator().update(torch.randn(2, 12, 1, 4)))
    p = D.ProfileAccumulator().update(torch.rand(2, 3, 10))
    with pytest.raises(InputError):
        p.merge(D.ProfileAccumulator().update(torch.rand(2, 3, 11)))


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    "call",
    [
        lambda: D.value_norm_stats(torch.randn(4, 8, 16)),  # no kv_head axis
        lambda: D.similarity_decay(torch.randn(8, 3, 16)),
        lambda: D.fit_attention_profile(torch.rand(16)),  # no head axis
        lambda: D.value_norm_stats(torch.randint(0, 3, (2, 8, 1, 4))),  # not floating point
    ],
)
def test_wrong_shapes_raise_jaxtyping_errors(call):
    with pytest.raises(TypeCheckError):
        call()


def test_empty_batches_give_empty_tables():
    assert D.value_norm_stats(torch.rand(0, 10, 1, 4)).summary.empty
    assert D.similarity_decay(torch.rand(0, 10, 1, 4)).curve.empty
    assert D.fit_attention_profile(torch.rand(0, 3, 10)).summary.empty


def test_too_short_windows_raise_input_errors():
    with pytest.raises(InputError, match="at least 2"):
        D.value_norm_stats(torch.randn(2, 1, 1, 4))
    with pytest.raises(InputError, match="at least 3"):
        D.similarity_decay(torch.randn(2, 2, 1, 4))
    with pytest.raises(InputError, match="k_max"):
        D.similarity_decay(torch.randn(2, 8, 1, 4), k_max=0)


@pytest.mark.parametrize("observer", ["diagnostics", "taxonomy"])
@pytest.mark.parametrize("heads, kv_heads", [(5, 2), (6, 3)], ids=["query-heads", "kv-heads"])
def test_accumulating_observers_refuse_a_batch_of_other_heads(observer, heads, kv_heads):
    from tl_geometry.taxonomy import TaxonomyObserver

    obs = D.DiagnosticsObserver(INFO) if observer == "diagnostics" else TaxonomyObserver(INFO, ns=[1, 2])
    weights = torch.softmax(torch.randn(1, heads, 1, 10), dim=-1)
    batch = LayerBatch(0, torch.tensor([0]), (9,), weights, torch.randn(1, 10, kv_heads, 8))
    with pytest.raises(InputError, match=f"layer 0: values have {kv_heads} key/value heads and weights {heads} heads"):
        obs.observe(batch)
