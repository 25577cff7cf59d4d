"""Every table is the same, to 1e-12 relative, for any batch size and any resume (one process).

The standard deviations come from merged (count, mean, M2) states (tl_geometry.core.moments); from
sums of squares they differed by up to 1e-6 relative between batchings. torchrun x2 against one
process: tests/pipeline/test_distributed.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import tl_geometry as tlg
from tl_geometry.io.store import StoreError
from tl_geometry.pipeline.loop import run_analysis
from tl_geometry.pipeline.plan import plan_analysis

TEXT = ["The quick brown fox jumps over the lazy dog. " * 12, "Attention is a weighting of values. " * 10]
SETTINGS = dict(diagnostics=True, k_max=6, query_positions=[7, -1], progress=False)
MERGED_TABLES = (
    "value_norms",
    "value_norm_curve",
    "similarity",
    "similarity_curve",
    "attention_profile",
    "attention_profile_curve",
    "regime_features",
)


def assert_tables_equal(a: tlg.AnalysisResult, b: tlg.AnalysisResult, rtol: float = 1e-12) -> None:
    """The rows bit for bit; every merged table's numbers to ``rtol`` relative (no absolute slack)."""
    pd.testing.assert_frame_equal(a.separability, b.separability, check_exact=True)
    for name in MERGED_TABLES:
        x, y = getattr(a, name), getattr(b, name)
        assert list(x.columns) == list(y.columns) and len(x) == len(y) > 0, name
        for column in x.columns:
            if pd.api.types.is_float_dtype(x[column]):
                np.testing.assert_allclose(x[column], y[column], rtol=rtol, atol=0, equal_nan=True, err_msg=name)
            else:
                assert x[column].tolist() == y[column].tolist(), (name, column)


@pytest.fixture(scope="module")
def corpus():
    return tlg.corpus.from_texts(TEXT, n_seqs=7, seq_len=24)


@pytest.fixture(scope="module")
def in_one_batch(llama_bridge, corpus):
    return tlg.analyze(llama_bridge, corpus, batch_size=7, **SETTINGS)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_every_table_is_the_same_for_any_batch_size(llama_bridge, corpus, in_one_batch, batch_size) -> None:
    assert_tables_equal(tlg.analyze(llama_bridge, corpus, batch_size=batch_size, **SETTINGS), in_one_batch)


def test_every_table_is_the_same_after_a_resume(llama_bridge, corpus, in_one_batch, tmp_path) -> None:
    settings = {k: v for k, v in SETTINGS.items() if k != "progress"}
    plan = plan_analysis(llama_bridge, corpus, tlg.AnalysisSettings(batch_size=2, **settings))
    run_analysis(plan, tmp_path, progress=False, windows=[5, 1, 2])  # saved, then "interrupted"
    resumed = tlg.analyze(llama_bridge, corpus, batch_size=2, out_dir=tmp_path, **SETTINGS)
    assert_tables_equal(resumed, in_one_batch)


def test_a_state_of_sums_of_squares_is_refused_on_resume(llama_bridge, corpus, tmp_path) -> None:
    """A store written by 0.2 (state version 1, sums of squares) cannot give exact spreads: refused,
    with what to do, before any window is analysed."""
    plan = plan_analysis(llama_bridge, corpus, tlg.AnalysisSettings(batch_size=7, diagnostics=True, k_max=6))
    run_analysis(plan, tmp_path, progress=False, windows=[0, 1])
    for file in (tmp_path / "state").glob("*.pt"):
        state = torch.load(file)
        state["version"] = 1
        torch.save(state, file)
    with pytest.raises(StoreError, match=r"saved by tl_geometry 0\.2 \(sums of squares.*another output directory"):
        tlg.analyze(llama_bridge, corpus, batch_size=7, diagnostics=True, k_max=6, out_dir=tmp_path, progress=False)
