"""AnalysisSettings (checks, JSON form, identity), the Observer protocol, the run store and write_atomic."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_llama_bridge
from hypothesis import given, settings
from hypothesis import strategies as st

import tl_geometry as tlg
from tl_geometry.capture.hooks import LayerBatch
from tl_geometry.capture.observers import Observer, RowObserver, SeparabilityObserver
from tl_geometry.io.files import write_atomic
from tl_geometry.io.store import RunStore, StoreError, model_fingerprint, tokens_sha256
from tl_geometry.models import ModelInfo
from tl_geometry.pipeline.settings import AnalysisSettings
from tl_geometry.theory import SimilarityModel

INFO = ModelInfo("toy", "TransformerBridge", 2, 4, 2, 3, 64, 0, True)

# ----------------------------------------------------------------------------- settings

sizes = st.lists(st.integers(1, 50), min_size=1, max_size=6)
positions = st.one_of(
    st.just("last"),
    st.integers(-10, 10),
    st.lists(st.integers(-10, 10), min_size=1, max_size=4),
    st.builds(range, st.integers(0, 5), st.integers(6, 12), st.integers(1, 3)),
)
any_settings = st.builds(
    AnalysisSettings,
    ns=st.one_of(st.none(), st.sampled_from(["all", "log"]), sizes),
    query_positions=positions,
    layers=st.one_of(st.none(), st.lists(st.integers(0, 5), min_size=1, max_size=4)),
    batch_size=st.integers(1, 9),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    diagnostics=st.booleans(),
    k_max=st.one_of(st.none(), st.integers(1, 99)),
    taxonomy=st.booleans(),
    bounds=st.booleans(),
    kappa=st.floats(1e-3, 1e3),
    rho=st.one_of(st.just("measured"), st.builds(SimilarityModel, st.floats(0, 5), st.floats(-1, 1))),
)


@settings(max_examples=60, deadline=None)
@given(any_settings)
def test_settings_survive_their_json_form(s: AnalysisSettings) -> None:
    back = AnalysisSettings.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s and back.to_dict() == s.to_dict() and back.differences(s) == []


@settings(max_examples=60, deadline=None)
@given(sizes)
def test_ns_lists_are_sorted_and_unique(ns: list[int]) -> None:
    assert AnalysisSettings(ns=ns).ns == tuple(sorted(set(ns)))
    assert AnalysisSettings(ns=np.array(ns)).ns == AnalysisSettings(ns=torch.tensor(ns)).ns


def test_settings_normalise_and_refuse() -> None:
    s = AnalysisSettings(ns=None, layers=np.int64(1), query_positions=np.int64(-1), batch_size=np.int32(3))
    assert (s.ns, s.layers, s.query_positions, s.batch_size) == ("all", (1,), (-1,), 3)
    assert type(s.batch_size) is int and type(s.layers[0]) is int
    assert AnalysisSettings(dtype="float32").dtype == torch.float32
    assert AnalysisSettings(rho=("model", 0.5, 0.1)).rho == SimilarityModel(0.5, 0.1)
    for kwargs, message in [
        (dict(ns=[0, 2]), "N >= 1"),
        (dict(ns="some"), "not understood"),
        (dict(ns=[]), "empty"),
        (dict(layers=[-1]), "numbered from 0"),
        (dict(layers=[]), "empty"),
        (dict(query_positions="first"), "'last'"),
        (dict(query_positions=range(3, 3)), "empty"),
        (dict(kappa=float("inf")), "finite"),
        (dict(kappa="1"), "positive number"),
        (dict(k_max=0), "k_max"),
        (dict(rho="cosine"), "rho="),
        (dict(taxonomy=1), "True or False"),
    ]:
        with pytest.raises(tlg.InputError, match=message):
            AnalysisSettings(**kwargs)
    with pytest.raises(tlg.InputError, match=r"unknown analysis settings \['speed'\]"):
        AnalysisSettings.from_dict({"speed": 3})


def test_identity_holds_only_what_changes_results() -> None:
    base = AnalysisSettings()
    assert "batch_size" not in base.identity()
    assert "kappa" not in base.identity() and "k_max" not in base.identity()  # bounds, diagnostics off
    assert base.differences(AnalysisSettings(batch_size=9, kappa=3.0, k_max=5)) == []
    with_bounds = AnalysisSettings(bounds=True)
    assert with_bounds.differences(AnalysisSettings(bounds=True, kappa=2)) == ["kappa (0.5 vs 2.0)"]
    assert base.differences(with_bounds) == ["bounds (False vs True)"]


def test_resolve_against_a_model_and_windows() -> None:
    layers, queries = AnalysisSettings(layers=[1], query_positions=[-1, 3, 3]).resolve(n_layers=2, seq_len=16)
    assert layers == [1] and queries == (3, 15)
    assert AnalysisSettings().resolve(n_layers=3, seq_len=8) == ([0, 1, 2], (7,))
    with pytest.raises(tlg.InputError, match=r"layers \[2\] do not exist"):
        AnalysisSettings(layers=[2]).resolve(2, 16)
    with pytest.raises(tlg.InputError, match="outside windows of 16"):
        AnalysisSettings(query_positions=[16]).resolve(2, 16)
    with pytest.raises(tlg.InputError, match="N out of range"):
        AnalysisSettings(ns=[1, 5], query_positions=[3]).resolve(2, 16)


# ----------------------------------------------------------------------------- observers


def _batch(seqs: list[int], seed: int) -> LayerBatch:
    g = torch.Generator().manual_seed(seed)
    b, length = len(seqs), 6
    weights = torch.softmax(torch.randn(b, INFO.n_heads, 2, length, generator=g, dtype=torch.float64), dim=-1)
    values = torch.randn(b, length, INFO.n_kv_heads, INFO.d_head, generator=g, dtype=torch.float64)
    return LayerBatch(0, torch.tensor(seqs), (3, 5), weights, values)


def test_every_observer_follows_the_protocol() -> None:
    row_observers = [SeparabilityObserver(INFO, "log"), tlg.theory.BoundsObserver(INFO, "log")]
    accumulators = [tlg.diagnostics.DiagnosticsObserver(INFO, k_max=3), tlg.taxonomy.TaxonomyObserver(INFO, "log")]
    for obs in row_observers:
        assert isinstance(obs, RowObserver)
    for obs in accumulators:
        assert isinstance(obs, Observer) and not isinstance(obs, RowObserver)


def test_row_observers_merge_and_restore_their_rows() -> None:
    one, a, b = (SeparabilityObserver(INFO, [1, 2, 4]) for _ in range(3))
    first, second = _batch([0, 1], seed=1), _batch([2], seed=2)
    one.observe(first)
    one.observe(second)
    a.observe(first)
    b.observe(second)
    restored = SeparabilityObserver(INFO, [1, 2, 4]).load_state_dict(a.merge(b).state_dict())
    pd.testing.assert_frame_equal(restored.take(), one.take())
    assert restored.take().empty and not b.chunks  # merge moved b's rows; take() forgot them
    with pytest.raises(tlg.InputError, match="other settings"):
        SeparabilityObserver(INFO, "log").load_state_dict(a.state_dict())
    with pytest.raises(tlg.InputError, match="different settings"):
        a.merge(SeparabilityObserver(INFO, [1, 2, 4], dtype=torch.float32))


# ----------------------------------------------------------------------------- store


def test_fingerprint_and_token_hash_tell_models_and_windows_apart() -> None:
    assert model_fingerprint(tiny_llama_bridge(seed=0)) == model_fingerprint(tiny_llama_bridge(seed=0))
    assert model_fingerprint(tiny_llama_bridge(seed=0)) != model_fingerprint(tiny_llama_bridge(seed=1))
    tokens = torch.arange(12).reshape(3, 4)
    assert tokens_sha256(tokens) == tokens_sha256(tokens.to(torch.int32)) != tokens_sha256(tokens.flip(0))


def test_store_writes_nothing_before_the_first_batch_and_resumes_after_it(tmp_path) -> None:
    identity = {"model": "toy", "ns": [1, 2]}
    store = RunStore(tmp_path / "run", identity)
    assert not (tmp_path / "run" / "progress.json").exists()
    store.discard_if_unused()
    assert not (tmp_path / "run").exists()
    store = RunStore(tmp_path / "run", identity)
    table = pd.DataFrame({"seq": [0, 1], "x": [0.5, 0.25]})
    store.write([0, 1], table, {"acc": {"sums": torch.ones(2)}})
    again = RunStore(tmp_path / "run", identity)
    assert again.done_seqs() == {0, 1} and torch.equal(again.states["acc"]["sums"], torch.ones(2))
    pd.testing.assert_frame_equal(again.read(table.iloc[:0]), table)
    with pytest.raises(StoreError, match=r"other settings: ns \(\[1, 3\] vs \[1, 2\]\)"):
        RunStore(tmp_path / "run", {"model": "toy", "ns": [1, 3]})
    with pytest.raises(tlg.InputError, match="resume=True"):
        RunStore(tmp_path / "run", identity, resume=False)


def test_store_of_another_version_is_named(tmp_path) -> None:
    (tmp_path / "progress.json").write_text(json.dumps({"config": {}, "done": [], "parts": [], "states": {}}))
    with pytest.raises(StoreError, match="progress.json was written by another version"):
        RunStore(tmp_path, {"model": "toy"})


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path) -> None:
    target = tmp_path / "table.txt"
    target.write_text("old")

    def fail(path):
        path.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, fail)
    assert target.read_text() == "old"
    write_atomic(target, lambda p: p.write_text("new"))
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["table.txt"]
