"""analyze() on tiny random models against the engine run by hand on run_with_cache tensors."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from conftest import build, model_kinds

import tl_geometry as tlg
import tl_geometry.capture.observers
import tl_geometry.models
from tl_geometry.capture.hooks import values_per_head
from tl_geometry.models import hook_pattern_name, hook_v_name

TEXT = ["The quick brown fox jumps over the lazy dog. " * 12, "Attention is a weighting of values. " * 10]


def by_hand(model, tokens: torch.Tensor, queries: list[int], ns) -> pd.DataFrame:
    """The same table, from a full run_with_cache and the public engine, with repeat_interleave for GQA."""
    info = tlg.describe_model(model)
    _, cache = model.run_with_cache(tokens)
    rows = []
    for layer in range(info.n_layers):
        v = cache[hook_v_name(layer)]  # [b, pos, kv_head, d]
        pattern = cache[hook_pattern_name(layer)]  # [b, head, q, k]
        v_heads = v.repeat_interleave(info.n_heads // v.shape[2], dim=2)  # transformers' repeat_kv
        for q in queries:
            res = tlg.separability(pattern[:, :, q, : q + 1], v_heads[:, : q + 1].permute(0, 2, 1, 3), ns)
            for b in range(tokens.shape[0]):
                for h in range(info.n_heads):
                    for gi, n in enumerate(res.ns.tolist()):
                        rows.append(dict(seq=b, layer=layer, head=h, query_pos=q, n=n,
                                         **{f: float(getattr(res, f)[b, h, gi]) for f in
                                            ("precision", "recall", "r_min", "r_max")}))  # fmt: skip
    return pd.DataFrame(rows)


@pytest.mark.parametrize("kind", model_kinds())
def test_analyze_matches_engine_on_run_with_cache(kind: str) -> None:
    model = build(kind)
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=3, seq_len=24)
    result = tlg.analyze(model, corpus, ns=None, query_positions=[5, -1], batch_size=2, progress=False)
    expected = by_hand(model, result.tokens, [5, 23], None)
    got = result.separability
    assert len(got) == len(expected) == 3 * 2 * 4 * (6 + 24)
    merged = got.merge(expected, on=["seq", "layer", "head", "query_pos", "n"], suffixes=("", "_ref"))
    assert len(merged) == len(got)
    assert (merged.precision == merged.precision_ref).all()
    assert (merged.recall == merged.recall_ref).all()
    for radius in ("r_min", "r_max"):
        finite = merged[radius + "_ref"] != float("inf")
        assert (merged.loc[~finite, radius] == float("inf")).all()
        diff = (merged.loc[finite, radius] - merged.loc[finite, radius + "_ref"]).abs()
        assert diff.max() < 1e-9
    assert set(got.kv_head[got["head"] == 3]) == {tlg.describe_model(model).kv_head_of()[3].item()}


def test_an_explicit_grid_is_clipped_per_query(llama_bridge) -> None:
    """``ns=[1, 4, 16]`` with a query of 6 keys: that query's rows use N = 1, 4 and 6 (16 clipped to
    its K, once), the last query's 1, 4, 16; each against the engine run by hand on its own sizes.
    A size above every query's row is still refused."""
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=24)
    result = tlg.analyze(
        llama_bridge, corpus, ns=[1, 4, 16], query_positions=[5, -1], taxonomy=False, batch_size=2, progress=False
    )
    got = result.separability
    assert sorted(got[got.query_pos == 5].n.unique()) == [1, 4, 6]
    assert sorted(got[got.query_pos == 23].n.unique()) == [1, 4, 16]
    expected = pd.concat(
        [by_hand(llama_bridge, result.tokens, [5], [1, 4, 6]), by_hand(llama_bridge, result.tokens, [23], [1, 4, 16])]
    )
    merged = got.merge(expected, on=["seq", "layer", "head", "query_pos", "n"], suffixes=("", "_ref"))
    assert len(merged) == len(got) == len(expected) == 2 * 2 * 4 * 2 * 3
    assert (merged.precision == merged.precision_ref).all() and (merged.recall == merged.recall_ref).all()
    with pytest.raises(tlg.InputError, match=r"N out of range: \[30\].*K=24"):
        tlg.analyze(llama_bridge, corpus, ns=[1, 30], query_positions=[5, -1], progress=False)


def test_gqa_mapping_equals_repeat_interleave(llama_bridge) -> None:
    info = tlg.describe_model(llama_bridge)
    assert (info.n_heads, info.n_kv_heads) == (4, 2)
    assert info.kv_head_of().tolist() == [0, 0, 1, 1]
    v = torch.randn(2, 7, 2, 8)
    expected = v.repeat_interleave(2, dim=2).permute(0, 2, 1, 3)
    assert torch.equal(values_per_head(v, info.kv_head_of()), expected)
    # a 3:1 grouping as in SmolLM2 (9 query heads, 3 key/value heads)
    assert tl_geometry.models.kv_head_index(9, 3).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_results_do_not_depend_on_batch_size(llama_bridge) -> None:
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=5, seq_len=16)
    one = tlg.analyze(llama_bridge, corpus, batch_size=1, progress=False).separability
    three = tlg.analyze(llama_bridge, corpus, batch_size=3, progress=False).separability
    pd.testing.assert_frame_equal(one, three, check_exact=False, rtol=0, atol=1e-12)
    assert (one.precision == three.precision).all() and (one.recall == three.recall).all()


def test_layer_subset_equals_rows_of_the_full_run(llama_bridge) -> None:
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=16)
    full = tlg.analyze(llama_bridge, corpus, progress=False).separability
    first = tlg.analyze(llama_bridge, corpus, layers=[0], progress=False).separability
    pd.testing.assert_frame_equal(first, full[full.layer == 0].reset_index(drop=True))


def test_query_positions_stride_and_default_grid(llama_bridge) -> None:
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=1, seq_len=40)
    res = tlg.analyze(llama_bridge, corpus, query_positions=range(8, 40, 8), progress=False)
    table = res.separability
    assert sorted(table.query_pos.unique()) == [8, 16, 24, 32]
    for q, group in table.groupby("query_pos"):
        assert sorted(group.n.unique()) == tlg.log_spaced_ns(q + 1)


def test_interrupted_run_resumes_without_loss(llama_bridge, tmp_path, monkeypatch) -> None:
    import tl_geometry.pipeline.loop as analysis

    corpus = tlg.corpus.from_texts(TEXT, n_seqs=5, seq_len=16)
    full = tlg.analyze(llama_bridge, corpus, batch_size=2, diagnostics=True, k_max=4, progress=False)
    reference = full.separability
    real = analysis.run_streaming
    calls = {"n": 0}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(analysis, "run_streaming", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tlg.analyze(llama_bridge, corpus, batch_size=2, diagnostics=True, k_max=4, out_dir=tmp_path, progress=False)
    monkeypatch.setattr(analysis, "run_streaming", real)
    assert len(list((tmp_path / "separability").glob("*.parquet"))) == 1
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["diagnostics-000002.pt", "taxonomy-000002.pt"]
    resumed = tlg.analyze(
        llama_bridge, corpus, batch_size=2, diagnostics=True, k_max=4, out_dir=tmp_path, progress=False
    )
    pd.testing.assert_frame_equal(resumed.separability, reference)
    for name in ("value_norms", "similarity", "attention_profile", "similarity_curve", "regime_features"):
        pd.testing.assert_frame_equal(getattr(resumed, name), getattr(full, name), rtol=1e-12)
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["diagnostics-000005.pt", "taxonomy-000005.pt"]
    with pytest.raises(tlg.InputError, match="resume=True"):
        tlg.analyze(llama_bridge, corpus, batch_size=2, out_dir=tmp_path, resume=False, progress=False)
    with pytest.raises(tlg.InputError, match="other settings"):
        tlg.analyze(llama_bridge, corpus, ns=[1, 2], batch_size=2, out_dir=tmp_path, progress=False)


def test_diagnostics_tables_match_the_observer_run_by_hand(llama_bridge) -> None:
    from tl_geometry.capture.hooks import run_streaming

    corpus = tlg.corpus.from_texts(TEXT, n_seqs=3, seq_len=24)
    result = tlg.analyze(llama_bridge, corpus, diagnostics=True, k_max=5, progress=False)
    info = tlg.describe_model(llama_bridge)
    by_hand = tlg.diagnostics.DiagnosticsObserver(info, k_max=5)
    run_streaming(llama_bridge, info, result.tokens, torch.arange(3), [0, 1], (23,), [by_hand])
    tables = by_hand.tables()
    assert sorted(result.value_norms.layer.unique()) == [0, 1]
    assert len(result.attention_profile) == info.n_layers * info.n_heads
    for name in ("value_norms", "similarity", "attention_profile"):
        pd.testing.assert_frame_equal(getattr(result, name), getattr(tables, name), rtol=1e-12)
    # the tables built after the last window (the profile fits above) are timed apart from the windows
    parts = {"separability_s", "diagnostics_s", "taxonomy_s"}  # the regimes' features are on by default
    assert set(result.timings) == {"total_s", "analysis_s", "forward_s", "tables_s", *parts}
    assert result.timings["tables_s"] > 0


@pytest.mark.parametrize("parts", [("bounds", "diagnostics", "taxonomy"), ()], ids=["every part", "separability"])
def test_timings_split_the_analysis_into_its_parts(llama_bridge, parts) -> None:
    """``timings`` has one ``<part>_s`` per part the run computed, each within ``analysis_s``."""
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=16)
    flags = {name: name in parts for name in ("bounds", "diagnostics", "taxonomy")}
    timings = tlg.analyze(llama_bridge, corpus, k_max=4, progress=False, **flags).timings
    names = [f"{part}_s" for part in ("separability", *parts)]
    assert [k for k in timings if k not in ("total_s", "forward_s", "analysis_s", "tables_s")] == names
    assert all(timings[name] > 0 for name in names)
    # each part is timed inside its layer's interval, so together they are less than the analysis
    assert sum(timings[name] for name in names) < timings["analysis_s"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_bounds_columns_match_the_raw_function(llama_bridge, dtype) -> None:
    """analyze(bounds=True) adds, row by row, what tlg.theory.bounds gives on the same tensors
    (float32: --analysis-dtype float32)."""
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=20)
    result = tlg.analyze(llama_bridge, corpus, ns=[1, 2, 5, 20], bounds=True, kappa=2.0, progress=False, dtype=dtype)
    table = result.separability
    info = tlg.describe_model(llama_bridge)
    _, cache = llama_bridge.run_with_cache(result.tokens)
    v = values_per_head(cache[hook_v_name(1)], info.kv_head_of())
    w = cache[hook_pattern_name(1)][:, :, -1, :]
    expected = tlg.theory.bounds(w, v, ns=[1, 2, 5, 20], kappa=2.0, dtype=dtype)
    got = table[table.layer == 1].sort_values(["seq", "head", "n"])
    for column in ("precision_lower", "recall_upper", "delta", "scale"):
        torch.testing.assert_close(
            torch.tensor(got[column].to_numpy()).double(),
            getattr(expected, column).reshape(-1).double(),
            rtol=1e-12,
            atol=1e-12,
        )
    env = result.envelopes()
    assert env.n.tolist() == [1, 2, 5, 20] and env.attrs["kappa"] == 2.0
    assert (env.loc[env.n == 1, "precision_inside"] == 1).all()
    with pytest.raises(tlg.InputError, match="bounds=True"):
        tlg.analyze(llama_bridge, corpus, ns=[1, 2], progress=False).envelopes()


def test_save_and_load_round_trip(llama_bridge, tmp_path) -> None:
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=16)
    result = tlg.analyze(llama_bridge, corpus, diagnostics=True, k_max=3, bounds=True, progress=False)
    back = tlg.load_result(result.save(tmp_path / "saved"))
    assert set(back.tables()) == set(result.tables()) and "attention_profile" in back.tables()
    for name, table in result.tables().items():
        pd.testing.assert_frame_equal(back.tables()[name], table)
    assert torch.equal(back.tokens, result.tokens) and back.model == result.model
    assert back.config == result.config
    with pytest.raises(tlg.InputError, match="no saved result"):
        tlg.load_result(tmp_path / "nothing")


@pytest.mark.parametrize("busy, expected", [(float("inf"), 1), (0.0, None)])
def test_each_batch_runs_on_the_free_cpus(monkeypatch, llama_bridge, busy, expected) -> None:
    import tl_geometry.pipeline.loop as loop
    from tl_geometry.runtime import threads

    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "busy_cpus", lambda cpus=None, seconds=0.0: busy)
    monkeypatch.setattr(threads, "REUSE_SECONDS", 0.0)
    seen: list[int] = []
    original = loop.run_streaming

    def recording(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(*args, **kwargs)

    monkeypatch.setattr(loop, "run_streaming", recording)
    outer = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "TORCH_DEFAULT_THREADS", 2)  # torch's count as the user left it
    try:
        tlg.analyze(llama_bridge, torch.randint(3, 200, (3, 10)), batch_size=2, progress=False)
        assert torch.get_num_threads() == 2  # restored after every batch
    finally:
        torch.set_num_threads(outer)
    free = min(2, len(threads.own_cpus())) if expected is None else expected
    assert seen == [free, free]  # two batches, each on the free CPUs


def test_the_tables_are_built_on_the_free_cpus(monkeypatch, llama_bridge) -> None:
    """The accumulators' tables (float64 element-wise operations, which on a busy machine waited
    for a descheduled thread at torch's default count) run on the count the policy picks."""
    from tl_geometry.runtime import threads
    from tl_geometry.taxonomy.accumulate import FeatureAccumulator

    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "REUSE_SECONDS", 0.0)
    outer = torch.get_num_threads()
    monkeypatch.setattr(threads, "TORCH_DEFAULT_THREADS", outer)
    monkeypatch.setattr(threads, "free_threads", lambda cpus=None, busy=None: outer + 2)
    seen: list[int] = []
    original = FeatureAccumulator.table

    def recording(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FeatureAccumulator, "table", recording)
    try:
        result = tlg.analyze(llama_bridge, torch.randint(3, 200, (2, 10)), progress=False)
    finally:
        torch.set_num_threads(outer)
    assert len(result.regime_features) and seen == [outer + 2]


def test_save_closes_the_tokens_file(llama_bridge, tmp_path) -> None:
    import gc
    import warnings

    result = tlg.analyze(llama_bridge, torch.randint(3, 200, (2, 8)), ns=[1], taxonomy=False, progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        result.save(tmp_path / "saved")
        gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not [m for m in unclosed if "tokens.npy" in m], unclosed
    assert torch.equal(tlg.load_result(tmp_path / "saved").tokens, result.tokens)


class RecordingBar:
    """A stand-in for tqdm that records its total and every update."""

    made: list[RecordingBar] = []

    def __init__(self, total=None, initial=0, disable=False, **kwargs) -> None:
        self.total, self.initial, self.disable, self.updates = total, initial, disable, []
        self.initial_at_start = self.n = initial
        RecordingBar.made.append(self)

    def update(self, n=1) -> None:
        self.updates.append(n)
        self.n += n

    def refresh(self) -> None:
        pass

    def _time(self) -> float:
        return 0.0

    def close(self) -> None:
        pass


def test_progress_moves_within_a_batch(llama_bridge, monkeypatch, tmp_path) -> None:
    import tl_geometry.pipeline.loop as loop
    from tl_geometry.pipeline.plan import plan_analysis

    monkeypatch.setattr(loop, "tqdm", RecordingBar)
    RecordingBar.made.clear()
    n_layers = tlg.describe_model(llama_bridge).n_layers
    settings = tlg.AnalysisSettings(ns=[1], taxonomy=False, batch_size=4)
    plan = plan_analysis(llama_bridge, torch.randint(3, 200, (3, 8)), settings)
    loop.run_analysis(plan, tmp_path, windows=[0])  # saved, then "interrupted"
    loop.run_analysis(plan, tmp_path)
    bar = RecordingBar.made[-1]  # the resumed run: one window saved, two to go in one batch
    assert n_layers > 1 and bar.total == 3 * n_layers and bar.initial_at_start == n_layers
    positive = [n for n in bar.updates if n]
    # one move per layer of the one batch, not one per batch; the first layer counted as warm-up
    assert len(positive) == n_layers - 1 and bar.initial == n_layers + 2
    assert bar.n == bar.total


def test_under_torchrun_only_rank_0_draws_the_bar(llama_bridge, monkeypatch, tmp_path) -> None:
    import tl_geometry.pipeline.loop as loop
    from tl_geometry.pipeline.plan import plan_analysis
    from tl_geometry.pipeline.torchrun import World, run_sharded

    class InOneProcess(World):
        """Two ranks run one after the other in this process: no process group to talk through."""

        def all_gather(self, payload):
            return [payload] * self.size

        def finish(self) -> None:
            pass

    monkeypatch.setattr(loop, "tqdm", RecordingBar)
    RecordingBar.made.clear()
    plan = plan_analysis(llama_bridge, torch.randint(3, 200, (3, 8)), tlg.AnalysisSettings(ns=[1], taxonomy=False))
    assert run_sharded(plan, tmp_path, InOneProcess(1, 2, 1)) is None
    merged = run_sharded(plan, tmp_path, InOneProcess(0, 2, 0))
    assert [bar.disable for bar in RecordingBar.made] == [True, False]
    assert sorted(merged.separability.seq.unique()) == [0, 1, 2]


def test_the_kernel_setting_changes_nothing_but_the_path(llama_bridge, monkeypatch) -> None:
    """kernel="torch" and "numba" give the same table, and each reaches the query engine as given."""
    from tl_geometry.core.engine import layer, query_engine

    seen = []
    engine = query_engine.separability_queries

    def spy(*args, **kwargs):
        seen.append(kwargs["kernel"])
        return engine(*args, **kwargs)

    monkeypatch.setattr(layer, "separability_queries", spy)
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=20)
    kw = dict(query_positions="all", rank_by=("attention", "random"), n_random=3, progress=False)
    tables = {k: tlg.analyze(llama_bridge, corpus, kernel=k, **kw).separability for k in ("torch", "numba")}
    assert set(seen) == {"torch", "numba"}
    pd.testing.assert_frame_equal(tables["torch"], tables["numba"], check_exact=True)
    with pytest.raises(tlg.InputError, match="kernel='fast' is not supported"):
        tlg.analyze(llama_bridge, corpus, kernel="fast", **kw)


def test_the_kernel_setting_reaches_the_per_row_engine(llama_bridge, monkeypatch) -> None:
    """One query position goes through the per-row engine: kernel="torch" and "numba" reach it as
    given and give the same table."""
    from tl_geometry.core.engine import layer

    seen = []
    engine = layer.separability_rankings

    def spy(*args, **kwargs):
        seen.append(kwargs["kernel"])
        return engine(*args, **kwargs)

    monkeypatch.setattr(layer, "separability_rankings", spy)
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=20)
    kw = dict(query_positions="last", ns="all", rank_by=("attention", "random"), n_random=3, progress=False)
    tables = {k: tlg.analyze(llama_bridge, corpus, kernel=k, **kw).separability for k in ("torch", "numba")}
    assert set(seen) == {"torch", "numba"}
    pd.testing.assert_frame_equal(tables["torch"], tables["numba"], check_exact=True)


def test_the_first_estimate_leaves_out_the_warm_up(monkeypatch, capsys) -> None:
    """A first layer of 60 s (loading the kernels), then 1 s per layer: the first time left the bar
    shows is that of 1 s per layer (within a factor of two), not 60 s per layer (29 minutes)."""
    import re

    import tqdm.std

    import tl_geometry.pipeline.loop as loop

    clock = {"now": 1000.0}
    monkeypatch.setattr(tqdm.std, "time", lambda: clock["now"])
    bar = loop.progress_bar(n_windows=1, done=0, n_layers=30, show=True)
    bar.mininterval = bar.miniters = 0
    clock["now"] += 60.0
    loop.count_without_rate(bar, 1)  # the process's first layer
    for _ in range(29):
        clock["now"] += 1.0
        bar.update(1)
    bar.close()
    shown = re.findall(r"\d+/30 \[[0-9:]+<(\d+):(\d+),", capsys.readouterr().err)
    first_left = int(shown[0][0]) * 60 + int(shown[0][1])  # after the second layer: 28 s left
    assert 28 / 2 <= first_left <= 28 * 2
