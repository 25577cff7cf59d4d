"""analyze with several rankings (definitions §7): the rank_by column, the random control keyed by
(seq, layer, head, query_pos), consumers that read the attention rows, bad input before loading."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from conftest import build

import tl_geometry as tlg
import tl_geometry.cli.app as cli
import tl_geometry.pipeline.plan
from tl_geometry.core.rankings import row_keys
from tl_geometry.errors import InputError
from tl_geometry.models import hook_pattern_name, hook_v_name

TEXT = ["The quick brown fox jumps over the lazy dog. " * 12, "Attention is a weighting of values. " * 10]
METRICS = [
    "precision",
    "recall",
    "r_min",
    "r_max",
    "f_at_rmax",
    "f_at_rmin",
    "retained_mass",
    "local_error_del",
    "local_error_ren",
]


@pytest.fixture(scope="module")
def model():
    return build("llama_bridge")


@pytest.fixture(scope="module")
def corpus():
    return tlg.corpus.from_texts(TEXT, n_seqs=3, seq_len=24)


@pytest.fixture(scope="module")
def two(model, corpus):
    return tlg.analyze(
        model, corpus, ns="log", query_positions=[7, -1], batch_size=2, progress=False,
        rank_by=("attention", "random", "contribution"), n_random=4, seed=3,
    )  # fmt: skip


def test_random_rows_equal_the_engine_on_run_with_cache_with_row_keys(model, two):
    """By hand: the pattern and values of a full forward pass, the engine with row_keys(seq, layer, head, q)."""
    info = tlg.describe_model(model)
    _, cache = model.run_with_cache(two.tokens)
    table = two.separability
    for layer in range(info.n_layers):
        v = cache[hook_v_name(layer)].repeat_interleave(info.n_heads // info.n_kv_heads, dim=2)
        pattern = cache[hook_pattern_name(layer)]
        for q in (7, 23):
            seqs, heads = torch.arange(3)[:, None], torch.arange(info.n_heads)[None, :]
            res = tlg.separability(
                pattern[:, :, q, : q + 1], v[:, : q + 1].permute(0, 2, 1, 3), "log", rank_by="random", n_random=4,
                seed=3, row_keys=row_keys(seq=seqs, layer=layer, head=heads, query_pos=q),
            )  # fmt: skip
            got = table[(table.rank_by == "random") & (table.layer == layer) & (table.query_pos == q)]
            got = got.sort_values(["seq", "head", "n"])
            for m in METRICS:
                want = getattr(res, m).reshape(-1).double()
                assert torch.allclose(torch.tensor(got[m].to_numpy()), want, rtol=1e-9, atol=1e-12, equal_nan=True), m
            assert set(got.n_draws) == {4} and set(got.distance) == {"euclidean"}


def test_attention_rows_equal_an_attention_only_run_and_consumers_read_them(model, corpus, two):
    one = tlg.analyze(model, corpus, ns="log", query_positions=[7, -1], batch_size=3, progress=False)
    assert one.separability.rank_by.unique().tolist() == ["attention"]
    assert two.separability.rank_by.unique().tolist() == ["attention", "random", "contribution"]
    att = two.separability[two.separability.rank_by == "attention"].reset_index(drop=True)
    pd.testing.assert_frame_equal(att, one.separability)
    pd.testing.assert_frame_equal(two.mean_by_n(), one.mean_by_n())
    pd.testing.assert_frame_equal(two.sink_effect(query_pos=23), one.sink_effect(query_pos=23))
    fig_two, fig_one = tlg.plot.separability_by_n(two, query_pos=23), tlg.plot.separability_by_n(one, query_pos=23)
    assert [list(t.y) for t in fig_two.data] == [list(t.y) for t in fig_one.data]
    pd.testing.assert_frame_equal(two.classify_heads(query_pos=23), one.classify_heads(query_pos=23))


def test_mean_by_ranking_shows_the_control(two):
    table = two.mean_by_ranking()
    assert table.rank_by.unique().tolist() == ["attention", "random", "contribution"]
    sep = two.separability
    want = sep[(sep.rank_by == "random") & (sep.n == 2)].f_at_rmax.mean()
    got = table[(table.rank_by == "random") & (table.n == 2)].f_at_rmax.item()
    assert got == pytest.approx(want, rel=1e-12)
    assert (table[table.n == 1].precision == 1.0).all()


def test_random_control_does_not_depend_on_batch_size_or_resume(model, corpus, tmp_path, monkeypatch):
    kwargs = dict(ns=[1, 2, 3, 5], query_positions="last", progress=False, rank_by=("random",), n_random=3)
    whole = tlg.analyze(model, corpus, batch_size=3, **kwargs).separability
    single = tlg.analyze(model, corpus, batch_size=1, **kwargs).separability
    pd.testing.assert_frame_equal(whole, single)
    import tl_geometry.pipeline.loop as analysis

    real, calls = analysis.run_streaming, {"n": 0}

    def interrupted(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(analysis, "run_streaming", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tlg.analyze(model, corpus, batch_size=1, out_dir=tmp_path / "run", **kwargs)
    monkeypatch.setattr(analysis, "run_streaming", real)
    resumed = tlg.analyze(model, corpus, batch_size=1, out_dir=tmp_path / "run", **kwargs).separability
    pd.testing.assert_frame_equal(resumed, whole)
    with pytest.raises(InputError, match="seed"):  # another seed is another run
        tlg.analyze(model, corpus, batch_size=1, out_dir=tmp_path / "run", seed=1, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rank_by="alpha"), "rank_by='alpha' is not a ranking"),
        (dict(rank_by=()), "non-empty"),
        (dict(distance="l1"), "distance='l1' is not a distance"),
        (dict(rank_by=("attention", "random"), n_random=0), "n_random must be an integer >= 1"),
        (dict(rank_by="random", bounds=True), "bounds=True needs rank_by to include 'attention'"),
    ],
)
def test_bad_rankings_are_refused_before_the_model_is_loaded(kwargs, match, monkeypatch):
    monkeypatch.setattr(
        tl_geometry.pipeline.plan, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded"))
    )
    with pytest.raises(InputError, match=match):
        tlg.analyze("smollm2-135m", TEXT, **kwargs)


@pytest.mark.parametrize(
    "option, match",
    [
        (["--rank-by", "attention,bogus"], "not a ranking"),
        (["--distance", "l2"], "not a distance"),
        (["--n-random", "0"], "n_random"),
    ],
)
def test_cli_refuses_bad_rankings_before_loading(option, match, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tlg, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    code = cli.main(
        ["run", "--out", str(tmp_path / "run"), "--n-seqs", "2", "--seq-len", "16", "--no-progress", *option]
    )
    err = capsys.readouterr().err
    assert code == 2 and match in err
    assert not (tmp_path / "run").exists()


def test_ranking_figure_draws_the_mean_per_ranking_and_n(two):
    fig = tlg.plot.separability_by_ranking(two, ["precision", "f_at_rmax"], query_pos=23)
    sep = two.separability[two.separability.query_pos == 23]
    assert [t.name for t in fig.data] == ["attention", "random", "contribution"] * 2
    for trace, (metric, name) in zip(
        fig.data, [(m, r) for m in ("precision", "f_at_rmax") for r in ("attention", "random", "contribution")]
    ):
        want = sep[sep.rank_by == name].groupby("n")[metric].mean()
        assert trace.x.tolist() == want.index.tolist()
        assert trace.y.tolist() == pytest.approx(want.tolist(), rel=1e-12, abs=0)  # summed in another order
    assert fig.layout.xaxis.type == "log"
    with pytest.raises(InputError, match="unknown metrics"):
        tlg.plot.separability_by_ranking(two, ["mass"])
