"""Loss curve, effective set size, localised loss and geometry vs function (definitions §8)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from intervention_reference import hf_nll, hf_top_n, ignoring_pattern_edits

import tl_geometry as tlg
from tl_geometry.corpus import from_tokens
from tl_geometry.errors import InputError, ModelError
from tl_geometry.intervention import curve as curve_module
from tl_geometry.intervention.curve import CURVE_COLUMNS, SparsificationCurve
from tl_geometry.intervention.loss import corpus_nll


@pytest.fixture(scope="module")
def windows():
    torch.manual_seed(2)
    return torch.randint(3, 259, (3, 16))


def test_curve_points_match_the_hand_built_reference(pair, windows) -> None:
    plain, bridge = pair
    curve = tlg.sparsification_curve(bridge, from_tokens(windows), ns=[2, 5, 16, 40], rank_by=("attention", "contribution"),
                                     renormalize=(False, True), batch_size=2, progress=False)  # fmt: skip
    assert list(curve.table.columns) == CURVE_COLUMNS
    assert len(curve.table) == 2 * 2 * 4
    full = hf_nll(plain, windows)
    assert curve.nll_full == pytest.approx(full, abs=2e-6)
    for row in curve.table.itertuples():
        if row.n >= 16:  # the window length: nothing is restricted
            assert row.nll == curve.nll_full and row.delta_nll_rel == 0.0
            continue
        with hf_top_n(row.n, row.rank_by, row.renormalize):
            expected = hf_nll(plain, windows)
        assert row.nll == pytest.approx(expected, abs=2e-6)
        assert row.delta_nll_rel == pytest.approx((expected - full) / full, abs=1e-6)
        assert row.n_tokens == 3 * 15


def fake_curve(delta, sizes, rank_by="attention"):
    """A curve over ``sizes`` whose loss is the function ``delta(n)``, measurable at any n."""
    measured = []

    def measure(r, f, n, stage="refine"):
        measured.append(n)
        return {"rank_by": r, "renormalize": f, "n": n, "nll": 1.0 + delta(n), "nll_full": 1.0,
                "delta_nll_rel": delta(n), "n_tokens": 10, "stage": stage}  # fmt: skip

    table = pd.DataFrame([measure(rank_by, False, n, "grid") for n in sizes], columns=CURVE_COLUMNS)
    measured.clear()
    return SparsificationCurve(table=table, nll_full=1.0, config={}, _measure=measure), measured


def test_effective_set_size_grid_and_bisection() -> None:
    curve, measured = fake_curve(lambda n: max(0.0, (40 - n) / 100), [1, 2, 4, 8, 16, 32, 64])
    grid = curve.effective_set_size(0.05, refine=False)
    assert grid.n_star.tolist() == [64] and grid.n_refined.tolist() == [0]
    refined = curve.effective_set_size(0.05, refine=True)
    assert refined.n_star.tolist() == [35]  # delta(35) = 0.05 <= tau, delta(34) = 0.06
    assert sorted(measured) == sorted({48, 40, 36, 34, 35})  # bisection between 32 (fails) and 64 (passes)
    assert refined.sizes_tried.iloc[0] == "1,2,4,8,16,32,34,35,36,40,48,64"
    assert set(curve.table[curve.table.stage == "refine"].n) == {48, 40, 36, 34, 35}


def test_the_bars_count_every_pass_the_grid_and_the_n_star_search(pair, windows, monkeypatch) -> None:
    """One bar over the grid's passes, one over the N* search's (its total known before the first
    pass, the bisection's most); no bar per refinement pass."""
    from tl_geometry.intervention import loss as loss_module

    bars: list = []
    real = curve_module.tqdm

    class Recorded(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.total_at_start, self.shown = self.total, not self.disable  # close() sets disable
            bars.append(self)

    monkeypatch.setattr(curve_module, "tqdm", Recorded)
    monkeypatch.setattr(loss_module, "tqdm", Recorded)
    curve = tlg.sparsification_curve(pair[1], from_tokens(windows), ns=[1, 8], rank_by="attention", progress=True)
    grid_bars = len(bars)
    n_star = curve.effective_set_size(0.001)
    refined = int((curve.table.stage == "refine").sum())
    shown = [b for b in bars[grid_bars:] if b.shown]
    if refined:
        assert [b.desc for b in shown] == ["N* search"]
        # two curves (renormalize False, True), gap 7 each: at most ceil(log2 7) = 3 passes per curve
        assert shown[0].n == refined <= shown[0].total_at_start <= 6
    else:
        assert shown == [] and n_star.n_refined.tolist() == [0]
    assert [b.desc for b in bars[:grid_bars] if b.shown] == ["full model", "curve passes"]


def test_effective_set_size_is_over_the_sizes_evaluated_when_not_monotone() -> None:
    spiky = {1: 0.5, 2: 0.01, 4: 0.2, 8: 0.0}
    curve, _ = fake_curve(spiky.__getitem__, [1, 2, 4, 8])
    assert curve.effective_set_size(0.05, refine=False).n_star.tolist() == [2]
    assert curve.effective_set_size(0.5, refine=True).n_star.tolist() == [1]


def test_n_star_table_refines_each_tolerance_to_integers_and_keeps_censored_ones() -> None:
    delta = lambda n: max(0.0, (40 - n) / 100) + (0.5 if n < 2 else 0.0)  # noqa: E731
    curve, _ = fake_curve(delta, [1, 2, 4, 8, 16, 32, 64])
    table = curve.n_star_table((0.10, 0.01, 0.05, -0.0), refine=True)
    assert table.tolerance.tolist() == [0.0, 0.01, 0.05, 0.10]
    for row in table.itertuples():  # a loop over every integer size: the smallest one within tau
        assert row.n_star == min(n for n in range(1, 65) if delta(n) <= row.tolerance)
    assert table.n_star.tolist() == [40, 39, 35, 30] and not table.censored.any()
    censored = fake_curve(lambda n: 1.0, [1, 2, 8])[0].n_star_table([0.05])
    assert censored.censored.tolist() == [True] and censored.n_star_text.tolist() == ["> 8"]
    assert censored.n_max.tolist() == [8] and censored.n_star.isna().all()


def test_no_size_passes_gives_na() -> None:
    curve, _ = fake_curve(lambda n: 1.0, [1, 2])
    out = curve.effective_set_size(0.05)
    assert out.n_star.isna().all() and out.sizes_tried.tolist() == ["1,2"]


@pytest.mark.parametrize("tolerance", [-0.01, float("nan"), float("inf"), "5%", True])
def test_bad_tolerance(tolerance) -> None:
    curve, _ = fake_curve(lambda n: 0.0, [1])
    with pytest.raises(InputError, match="tolerance must be a finite number >= 0"):
        curve.effective_set_size(tolerance)


def test_resume_equals_uninterrupted(pair, windows, tmp_path, monkeypatch) -> None:
    _, bridge = pair
    kwargs = dict(ns=[1, 3], rank_by=("attention", "random"), renormalize=(False, True), batch_size=2, progress=False)
    whole = tlg.sparsification_curve(bridge, from_tokens(windows), **kwargs)
    calls = {"n": 0}
    real = curve_module.corpus_nll

    def failing(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(curve_module, "corpus_nll", failing)
    with pytest.raises(KeyboardInterrupt):
        tlg.sparsification_curve(bridge, from_tokens(windows), out_dir=tmp_path, **kwargs)
    saved = json.loads((tmp_path / "curve.json").read_text())
    assert len(saved["rows"]) == 3  # full loss + 3 points written before the interruption
    monkeypatch.setattr(curve_module, "corpus_nll", real)
    resumed = tlg.sparsification_curve(bridge, from_tokens(windows), out_dir=tmp_path, **kwargs)
    pd.testing.assert_frame_equal(resumed.table, whole.table)
    loaded = tlg.load_curve(tmp_path)
    pd.testing.assert_frame_equal(loaded.table, whole.table)
    with pytest.raises(InputError, match="refine=True needs the model"):
        loaded.effective_set_size(refine=True)
    other = windows.flip(0)
    with pytest.raises(InputError, match="another run"):
        tlg.sparsification_curve(bridge, from_tokens(other), out_dir=tmp_path, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(ns=[0, 2]), "integer >= 1"),
        (dict(ns="log"), "not understood"),
        (dict(rank_by="value"), "is not a ranking"),
        (dict(renormalize="no"), "renormalize must be"),
        (dict(batch_size=0), "batch_size"),
    ],
)
def test_bad_curve_input_writes_nothing(pair, windows, tmp_path, kwargs, match) -> None:
    out = tmp_path / "curve"
    with pytest.raises(InputError, match=match):
        tlg.sparsification_curve(pair[1], from_tokens(windows), out_dir=out, progress=False, **kwargs)
    assert not out.exists()


def test_one_token_windows_refused(pair, tmp_path) -> None:
    out = tmp_path / "curve"
    with pytest.raises(InputError, match="at least 2"):
        tlg.sparsification_curve(pair[1], from_tokens(torch.randint(3, 259, (4, 1))), out_dir=out, progress=False)
    with pytest.raises(InputError, match="at least 2"):
        tlg.localized_loss(pair[1], from_tokens(torch.randint(3, 259, (4, 1))), progress=False)
    assert not out.exists()


def test_model_ignoring_pattern_edits_refused_before_any_pass_nothing_written(
    pair, windows, tmp_path, monkeypatch
) -> None:
    model = ignoring_pattern_edits(pair[1])
    passes = []
    monkeypatch.setattr(curve_module, "corpus_nll", lambda *a, **k: passes.append(1))
    out = tmp_path / "curve"
    with pytest.raises(ModelError, match='attn_implementation="eager"'):
        tlg.sparsification_curve(model, from_tokens(windows), ns=[1], out_dir=out, progress=False)
    with pytest.raises(ModelError, match='attn_implementation="eager"'):
        tlg.localized_loss(model, from_tokens(windows), n=1, unit="layer", progress=False)
    assert not out.exists() and not passes
    assert all(len(p.fwd_hooks) == 0 for p in model.hook_dict.values())


def test_localized_loss_by_layer_and_head(pair, windows) -> None:
    _, bridge = pair
    by_layer = tlg.localized_loss(bridge, from_tokens(windows), n=2, unit="layer", progress=False)
    by_head = tlg.localized_loss(bridge, from_tokens(windows), n=2, unit="head", renormalize=True, progress=False)
    assert by_layer[["layer"]].values.ravel().tolist() == [0, 1] and by_layer["head"].isna().all()
    assert list(zip(by_head["layer"], by_head["head"])) == [(layer, h) for layer in range(2) for h in range(4)]
    full = corpus_nll(bridge, windows, progress=False).nll
    with tlg.top_n_attention(bridge, n=2, layers=1, heads=2, renormalize=True):
        only = corpus_nll(bridge, windows, progress=False).nll
    row = by_head[(by_head.layer == 1) & (by_head["head"] == 2)].iloc[0]
    assert row.nll == pytest.approx(only, abs=1e-12) and row.delta_nll_rel == pytest.approx((only - full) / full)
    assert (by_layer.delta_nll_rel != 0).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(unit="block"), "not a unit"), (dict(n=0), "n must be"), (dict(rank_by="x"), "not a ranking")],
)
def test_localized_bad_input(pair, windows, kwargs, match) -> None:
    with pytest.raises(InputError, match=match):
        tlg.localized_loss(pair[1], from_tokens(windows), progress=False, **kwargs)


def test_geometry_vs_function_over_n_per_ranking() -> None:
    ns = [1, 2, 4, 8]
    sep = pd.DataFrame(
        [{"rank_by": r, "n": n, "layer": 0, "head": 0, "f_at_rmax": (n if r == "attention" else -n) + s, "f_at_rmin": 1.0}
         for r in ("attention", "random") for n in ns for s in (0.0, 0.5)]
    )  # fmt: skip
    table = pd.DataFrame(
        [{"rank_by": r, "renormalize": False, "n": n, "nll": 0, "nll_full": 1, "delta_nll_rel": 1.0 / n, "n_tokens": 1, "stage": "grid"}
         for r in ("attention", "random") for n in ns]
    )[CURVE_COLUMNS]  # fmt: skip
    out = tlg.geometry_vs_function(sep, SparsificationCurve(table=table, nll_full=1.0, config={}))
    by = out.set_index(["rank_by", "geometry"])
    assert by.loc[("attention", "f_at_rmax"), "rho"] == pytest.approx(-1.0)
    assert by.loc[("random", "f_at_rmax"), "rho"] == pytest.approx(1.0)
    assert math.isnan(by.loc[("attention", "f_at_rmin"), "rho"])  # constant geometry: no correlation
    assert (out.n_points == 4).all()


def test_geometry_vs_function_across_heads() -> None:
    sep = pd.DataFrame(
        [
            {"n": 8, "layer": layer, "head": h, "f_at_rmax": layer * 2 + h, "f_at_rmin": -(layer * 2 + h)}
            for layer in range(2)
            for h in range(2)
        ]
    )
    local = pd.DataFrame([{"unit": "head", "layer": layer, "head": h, "rank_by": "attention", "renormalize": False, "n": 8,
                           "delta_nll_rel": float(layer * 2 + h) ** 2} for layer in range(2) for h in range(2)])  # fmt: skip
    local["head"] = local["head"].astype("Int64")
    out = tlg.geometry_vs_function(sep, local).set_index("geometry")
    assert out.loc["f_at_rmax", "rho"] == pytest.approx(1.0) and out.loc["f_at_rmin", "rho"] == pytest.approx(-1.0)
    assert (out.comparison == "across_heads").all()


def test_geometry_vs_function_bad_input() -> None:
    with pytest.raises(InputError, match="SparsificationCurve or the table"):
        tlg.geometry_vs_function(pd.DataFrame({"f_at_rmax": [], "f_at_rmin": []}), [1, 2])


def test_window_nll_takes_the_log_softmax_in_float64() -> None:
    """Float32 logits over a large vocabulary: the per-window NLL equals a float64 cross-entropy (a
    float32 log-softmax is off by ~1e-6 relative here, which is what the SmolLM2 reference caught)."""
    from tl_geometry.intervention.loss import window_nll

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 33, 49152, generator=gen) * 8
    tokens = torch.randint(0, 49152, (2, 33), generator=gen)
    expected = torch.stack([
        torch.nn.functional.cross_entropy(logits[b, :-1].double(), tokens[b, 1:], reduction="sum") for b in range(2)
    ])  # fmt: skip
    assert torch.allclose(window_nll(logits, tokens), expected, rtol=1e-13, atol=0)
