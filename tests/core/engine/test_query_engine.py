"""The query engine (every query row of a layer at once) against the loop reference and the per-row engine.

Rows of one layer: query ``q`` of head ``h`` sees the keys ``0..q`` of its key/value head, so one
call holds rows of every length; the engine pads them in blocks. Everything here checks that the
padding and the sharing change nothing: counts exactly, distances to 1e-9 against the loop
reference (definitions §2, §7), and the per-row engine's numbers for every ranking and distance.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import row_metrics

import tl_geometry as tlg
from tl_geometry.capture import observers
from tl_geometry.core.engine import dispatch
from tl_geometry.core.engine.query_engine import SCREEN_DTYPE, separability_queries
from tl_geometry.core.rankings import row_keys
from tl_geometry.core.sizes import resolve_ns
from tl_geometry.errors import InputError

COUNTED = ["precision", "recall", "f_at_rmax", "f_at_rmin"]
MEASURED = ["r_max", "r_min", "retained_mass", "local_error_del", "local_error_ren"]


def layer_rows(kind: str, n_keys: int, n_heads: int = 4, n_kv: int = 2, d: int = 5, seed: int = 0, batch: int = 2):
    """Causal attention rows of every query of one layer: weights [b, h, q, k] (zero after q), values [b, k, g, d]."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(batch, n_keys, n_kv, d, generator=g, dtype=torch.float64)
    logits = torch.randn(batch, n_heads, n_keys, n_keys, generator=g, dtype=torch.float64) * 2
    causal = torch.ones(n_keys, n_keys, dtype=torch.bool).tril()
    if kind == "ties":  # three weight levels: many exact ties, broken by key index
        levels = torch.randint(1, 4, logits.shape, generator=g).double() * causal
        weights = levels / levels.sum(-1, keepdim=True)
    elif kind == "sink":  # a dominant sink with a compressed value, as in the paper
        logits[..., 0] += 8
        values[:, 0] *= 0.1
        weights = torch.softmax(logits.masked_fill(~causal, -torch.inf), -1)
    elif kind == "flat":
        weights = causal / causal.sum(-1, keepdim=True).double()
        weights = weights.expand(batch, n_heads, n_keys, n_keys).clone()
    elif kind == "duplicates":  # key 3 repeats key 1: same weight, same value, same distances
        weights = torch.softmax(logits.masked_fill(~causal, -torch.inf), -1)
        if n_keys >= 4:
            values[:, 3] = values[:, 1]
            weights[..., 3] = weights[..., 1]
            weights = weights * causal
    else:
        weights = torch.softmax(logits.masked_fill(~causal, -torch.inf), -1)
    return weights, values


def kv_heads(n_heads: int, n_kv: int) -> torch.Tensor:
    return torch.arange(n_heads) // (n_heads // n_kv)


def keys_of(batch: int, n_heads: int, positions: list[int]) -> torch.Tensor:
    return row_keys(
        seq=torch.arange(batch)[:, None, None],
        layer=0,
        head=torch.arange(n_heads)[None, :, None],
        query_pos=torch.tensor(positions)[None, None, :],
    )


def assert_matches_reference(weights, values, positions, ns="all", rank_by="attention", distance="euclidean", **kw):
    n_batch, n_heads = weights.shape[:2]
    kv = kv_heads(n_heads, values.shape[2])
    keys = keys_of(n_batch, n_heads, positions)
    res = separability_queries(
        weights, values, positions, kv, ns, rank_by=rank_by, distance=distance, row_keys=keys, n_random=3, **kw
    )
    for j, q in enumerate(positions):
        grid = res.ns[j][res.valid[j]].tolist()
        assert grid == resolve_ns(ns, q + 1).tolist()
        assert bool(torch.isnan(res.precision[:, :, j][:, :, ~res.valid[j]]).all())
        for b in range(n_batch):
            for h in range(n_heads):
                w, v = weights[b, h, j, : q + 1], values[b, : q + 1, int(kv[h])]
                for gi, n in enumerate(grid):
                    ref = row_metrics(w, v, n, rank_by, distance, seed=0, row_key=int(keys[b, h, j]), n_random=3)
                    where = (b, h, q, n)
                    for name in COUNTED:  # ratios of integers (a random row: their mean over draws)
                        assert float(getattr(res, name)[b, h, j, gi]) == pytest.approx(ref[name], abs=1e-15), where
                    if rank_by != "random":
                        assert float(res.precision[b, h, j, gi]) == ref["precision"], where
                        assert float(res.recall[b, h, j, gi]) == ref["recall"], where
                    for name in MEASURED:
                        got, want = float(getattr(res, name)[b, h, j, gi]), ref[name]
                        if math.isinf(want) or math.isnan(want):
                            assert got == want or (math.isnan(got) and math.isnan(want)), (name, where)
                        else:
                            assert got == pytest.approx(want, abs=1e-9, rel=1e-9), (name, where)


@pytest.mark.parametrize("kind", ["random", "ties", "sink", "flat", "duplicates"])
@pytest.mark.parametrize("n_keys", [1, 2, 3, 13])
@pytest.mark.parametrize("products", ["values", "gram"])
def test_every_query_equals_reference(kind: str, n_keys: int, products: str) -> None:
    weights, values = layer_rows(kind, n_keys, seed=n_keys)
    assert_matches_reference(weights, values, list(range(n_keys)), products=products)


@pytest.mark.parametrize("kind", ["random", "sink", "duplicates"])
@pytest.mark.parametrize("ns", ["log", [1, 6, 9]])
def test_the_gram_routes_running_sums_over_wide_gaps_equal_reference(kind: str, ns) -> None:
    """Sizes far apart: the Gram route adds many terms between two sizes (four per pass)."""
    weights, values = layer_rows(kind, 31, n_heads=2, n_kv=1, seed=6, batch=1)
    positions = [8, 17, 29, 30]
    assert_matches_reference(weights[:, :, positions], values, positions, ns=ns, products="gram")


@pytest.mark.parametrize("rank_by", ["contribution", "sink_window", "random"])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_rankings_and_distances_equal_reference(rank_by: str, distance: str) -> None:
    weights, values = layer_rows("sink", 9, n_heads=2, n_kv=1, seed=4, batch=1)
    positions = [0, 3, 8, 5]
    assert_matches_reference(weights[:, :, positions], values, positions, rank_by=rank_by, distance=distance)


@pytest.mark.parametrize("screen", [torch.float32, torch.float64])
def test_either_screen_counts_exactly(screen: torch.dtype) -> None:
    """float32 (the default) or float64 screens, float64 decides: the counts and radii of the
    float64 computation."""
    weights, values = layer_rows("ties", 11, seed=9)
    assert_matches_reference(weights, values, list(range(11)), screen=screen)
    weights, values = layer_rows("sink", 11, seed=10)
    assert_matches_reference(weights, values, list(range(11)), screen=screen)


def test_the_default_screen_is_float32_and_gives_float64s_numbers() -> None:
    """No ``screen``: float32, as the per-row engine; every metric equals the float64 screen's, bit for bit."""
    assert SCREEN_DTYPE == torch.float32  # the default the docs and the benchmarks name
    weights, values = layer_rows("random", 24, seed=8)
    positions = list(range(24))
    default = separability_queries(weights, values, positions, kv_heads(4, 2), "log")
    wide = separability_queries(weights, values, positions, kv_heads(4, 2), "log", screen=torch.float64)
    for name in (*COUNTED, *MEASURED):
        assert torch.equal(getattr(default, name).nan_to_num(-1.0), getattr(wide, name).nan_to_num(-1.0)), name


def test_a_screen_of_another_dtype_is_refused() -> None:
    weights, values = layer_rows("random", 4, seed=0)
    with pytest.raises(InputError, match="screen must be"):
        separability_queries(weights, values, [0, 1, 2, 3], kv_heads(4, 2), "log", screen=torch.bfloat16)


def per_row(weights, values, positions, ns, **kw):
    """The per-row engine, one query position at a time, as the observer used to call it."""
    n_heads = weights.shape[1]
    kv = kv_heads(n_heads, values.shape[2])
    out = []
    for j, q in enumerate(positions):
        row_values = values[:, : q + 1][:, :, kv].transpose(1, 2)  # [b, h, K, d]
        keys = keys_of(weights.shape[0], n_heads, positions)[:, :, j]
        out.append(tlg.separability(weights[:, :, j, : q + 1], row_values, ns, row_keys=keys, **kw))
    return out


@pytest.mark.parametrize("rank_by", ["attention", "contribution", "sink_window", "random"])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("screen", [torch.float64, torch.float32])
def test_equals_the_per_row_engine(rank_by: str, distance: str, screen: torch.dtype) -> None:
    weights, values = layer_rows("random", 30, seed=2)
    positions = list(range(30))
    kw = dict(rank_by=rank_by, distance=distance, n_random=3)
    keys = keys_of(2, 4, positions)
    res = separability_queries(
        weights, values, positions, kv_heads(4, 2), "log", row_keys=keys, block_cells=4000, screen=screen, **kw
    )
    for j, one in enumerate(per_row(weights, values, positions, "log", **kw)):
        width = one.ns.shape[0]
        assert res.ns[j, :width].tolist() == one.ns.tolist()
        for name in COUNTED:
            assert torch.equal(getattr(res, name)[:, :, j, :width], getattr(one, name)), (name, j)
        for name in MEASURED:
            torch.testing.assert_close(
                getattr(res, name)[:, :, j, :width], getattr(one, name), rtol=1e-12, atol=1e-15, equal_nan=True
            )


def test_blocks_do_not_change_anything() -> None:
    """One query per block or all in one: the padding of a row by the others' keys changes nothing."""
    weights, values = layer_rows("sink", 20, seed=5)
    positions = [19, 0, 7, 3, 12]  # any order
    weights = weights[:, :, positions]
    one = separability_queries(weights, values, positions, kv_heads(4, 2), "all", block_cells=1)
    big = separability_queries(weights, values, positions, kv_heads(4, 2), "all", block_cells=1 << 30)
    for name in [*COUNTED, *MEASURED]:
        torch.testing.assert_close(getattr(one, name), getattr(big, name), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("inference", [False, True])
def test_blocks_on_several_threads(inference: bool) -> None:
    """Whole blocks on two threads (inside a forward pass's inference mode too) give the same rows."""
    weights, values = layer_rows("sink", 16, seed=8)
    positions = list(range(16))
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.inference_mode(inference):
                results.append(separability_queries(weights, values, positions, kv_heads(4, 2), "log", block_cells=500))
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    for name in [*COUNTED, *MEASURED]:
        torch.testing.assert_close(getattr(results[0], name), getattr(results[1], name), rtol=0, atol=0, equal_nan=True)


def test_weights_after_the_query_are_ignored() -> None:
    """Keys after q are not the row's: whatever the pattern holds there (even NaN) changes nothing."""
    weights, values = layer_rows("random", 8, seed=6)
    dirty = weights + torch.ones(8, 8).triu(1) * 0.5
    dirty[..., 0, 7] = torch.nan
    a = separability_queries(weights, values, list(range(8)), kv_heads(4, 2), "all")
    b = separability_queries(dirty, values, list(range(8)), kv_heads(4, 2), "all")
    for name in [*COUNTED, *MEASURED]:
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0, equal_nan=True)


def test_values_of_very_different_scales_in_one_window() -> None:
    """Early keys 1e-200, later keys 1e+200: each row keeps its own scale (rows far below their block's
    scale are decided by direct distances), so the counts are those of each row alone."""
    weights, values = layer_rows("random", 10, seed=7)
    values[:, :5] *= 1e-200
    values[:, 5:] *= 1e200
    positions = list(range(10))
    res = separability_queries(weights, values, positions, kv_heads(4, 2), "all")
    for j, one in enumerate(per_row(weights, values, positions, "all")):
        width = one.ns.shape[0]
        for name in COUNTED:
            assert torch.equal(getattr(res, name)[:, :, j, :width], getattr(one, name)), (name, j)
        for name in ("r_max", "r_min"):
            torch.testing.assert_close(getattr(res, name)[:, :, j, :width], getattr(one, name), rtol=1e-12, atol=0)


def test_bad_input_is_refused() -> None:
    weights, values = layer_rows("random", 6, seed=1)
    kv = kv_heads(4, 2)
    with pytest.raises(InputError, match="one position per row"):
        separability_queries(weights, values, [0, 1], kv)
    with pytest.raises(InputError, match="query positions must lie"):
        separability_queries(weights, values, [0, 1, 2, 3, 4, 6], kv)
    bad = weights.clone()
    bad[0, 0, 3, 1] = torch.nan
    with pytest.raises(InputError, match="NaN or inf"):
        separability_queries(bad, values, list(range(6)), kv)
    with pytest.raises(InputError, match="rank_by"):
        separability_queries(weights, values, list(range(6)), kv, rank_by="loudest")
    with pytest.raises(InputError, match="products must be one of"):
        separability_queries(weights, values, list(range(6)), kv, products="gramian")


@st.composite
def layers(draw):
    n_keys = draw(st.integers(1, 9))
    n_kv = draw(st.sampled_from([1, 2]))
    kind = draw(st.sampled_from(["random", "ties", "sink", "flat", "duplicates"]))
    positions = draw(st.lists(st.integers(0, n_keys - 1), min_size=1, max_size=n_keys, unique=True))
    return kind, n_keys, n_kv, positions, draw(st.integers(0, 10_000)), draw(st.sampled_from(["all", "log", [1]]))


@settings(max_examples=30, deadline=None)
@given(layers(), st.sampled_from([torch.float64, torch.float32]))
def test_property_any_layer_equals_reference(layer, screen) -> None:
    kind, n_keys, n_kv, positions, seed, ns = layer
    weights, values = layer_rows(kind, n_keys, n_heads=2 * n_kv, n_kv=n_kv, d=3, seed=seed, batch=1)
    assert_matches_reference(weights[:, :, positions], values, positions, ns=ns, screen=screen)


@pytest.fixture(scope="module")
def per_row_and_blocks(llama_bridge):
    """analyze(query_positions="all") through the query engine and one position at a time."""
    corpus = tlg.corpus.from_texts(["every query position of a tiny model, twice. " * 4], seq_len=20)
    kw = dict(query_positions="all", rank_by=("attention", "random", "contribution"), n_random=2, batch_size=2,
              taxonomy=False, progress=False)  # fmt: skip
    blocks = tlg.analyze(llama_bridge, corpus, **kw).separability
    minimum = dispatch.MIN_QUERIES_FOR_BLOCKS
    dispatch.MIN_QUERIES_FOR_BLOCKS = 1 << 62
    try:
        rows = tlg.analyze(llama_bridge, corpus, **kw).separability
    finally:
        dispatch.MIN_QUERIES_FOR_BLOCKS = minimum
    return blocks, rows


def test_analyze_all_queries_equals_one_position_at_a_time(per_row_and_blocks) -> None:
    blocks, rows = per_row_and_blocks
    assert len(blocks) == len(rows) > 0
    assert sorted(blocks.query_pos.unique().tolist()) == list(range(20))
    exact = [c for c in blocks.columns if c not in ("local_error_del", "local_error_ren")]
    pd.testing.assert_frame_equal(blocks[exact], rows[exact], check_exact=True)
    pd.testing.assert_frame_equal(blocks, rows, rtol=1e-12, atol=1e-15)


def test_query_rows_table_owns_its_columns() -> None:
    """The table takes its columns without copying them: each must be a fresh array, so that the
    engine's tensors changing afterwards (every size valid: nothing cut) leave the table alone."""
    from tl_geometry.capture.tables import query_rows_table

    metrics = {"recall": torch.arange(8.0, dtype=torch.float64).reshape(1, 2, 2, 2), "rank_by": "attention"}
    ns, valid = torch.tensor([[1, 2], [1, 2]]), torch.ones(2, 2, dtype=torch.bool)
    table = query_rows_table(torch.tensor([7]), 3, [0, 1], ns, valid, torch.tensor([0, 0]), metrics)
    metrics["recall"].add_(100.0)
    assert table.recall.tolist() == [float(x) for x in range(8)]
    assert table.rank_by.tolist() == ["attention"] * 8


def test_observer_rows_in_key_order_whichever_engine() -> None:
    """Taken straight from the observer (no sorting by analyze), both engines: the same rows in the
    results' key order, per sequence, head and query position the rankings in turn, then ``N``."""
    from tl_geometry.capture.hooks import LayerBatch
    from tl_geometry.models import ModelInfo

    info = ModelInfo("toy", "TransformerBridge", 1, 4, 2, 5, 16, 0, True)
    weights, values = layer_rows("random", 6, seed=3)
    batch = LayerBatch(0, torch.tensor([4, 9]), tuple(range(6)), weights.float(), values.float())
    tables = []
    for minimum in (2, 1 << 62):
        dispatch.MIN_QUERIES_FOR_BLOCKS, before = minimum, dispatch.MIN_QUERIES_FOR_BLOCKS
        try:
            obs = observers.SeparabilityObserver(info, "all", rank_by=("random", "attention"), n_random=2)
            obs.observe(batch)
            tables.append(obs.take())
        finally:
            dispatch.MIN_QUERIES_FOR_BLOCKS = before
    pd.testing.assert_frame_equal(tables[0], tables[1], rtol=1e-12, atol=1e-15)
    rank = {"random": 0, "attention": 1}
    keys = [
        (seq, head, q, rank[r], n)
        for seq, head, q, r, n in tables[0][["seq", "head", "query_pos", "rank_by", "n"]].itertuples(index=False)
    ]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    # sequence 4, head 0: query 0 has one N per ranking, query 1 two
    assert tables[0].rank_by.tolist()[:6] == ["random", "attention", "random", "random", "attention", "attention"]


@st.composite
def tiny_weight_layers(draw, distance: str):
    """Rows that stress the screen's per-key band: a few loud keys and many of tiny weight (down to
    ``e^-80``), near-ties among the tiny ones (a copy of a key's weight and value, moved by
    ``2^-20 .. 2^-40``: within float32's rounding, not float64's), exact ties, a key ``2^40`` louder
    than the rest, early keys ``2^-80`` smaller than later ones, grouped-query heads.

    For the cosine only exact ties: a value moved along itself keeps its cosine distance, and the
    reference's cosine rounds differently from the engine's direct one (a tie within float64 rounding).
    """
    n_keys = draw(st.integers(2, 10))
    n_kv, per_kv = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    shape = (1, n_kv * per_kv, n_keys, n_keys)
    values = torch.randn(1, n_keys, n_kv, 3, generator=g, dtype=torch.float64)
    tiny = -draw(st.sampled_from([8.0, 20.0, 40.0, 80.0])) * torch.rand(shape, generator=g, dtype=torch.float64)
    loud = torch.rand(shape, generator=g) < draw(st.sampled_from([0.1, 0.3]))
    logits = torch.where(loud, 2 * torch.randn(shape, generator=g, dtype=torch.float64), tiny - 10)
    causal = torch.ones(n_keys, n_keys, dtype=torch.bool).tril()
    weights = torch.softmax(logits.masked_fill(~causal, -torch.inf), -1)
    for _ in range(draw(st.integers(0, 3))):  # near-ties (or exact ones) of two keys
        a, b = draw(st.integers(0, n_keys - 1)), draw(st.integers(0, n_keys - 1))
        move = draw(st.sampled_from([0.0, 2.0**-20, 2.0**-30, 2.0**-40] if distance == "euclidean" else [0.0]))
        values[:, b] = values[:, a] * (1 + move)
        weights[..., b] = weights[..., a] * causal[:, b]
    if draw(st.booleans()):
        values[:, n_keys // 2] *= 2.0**40
    if draw(st.booleans()):
        values[:, : n_keys // 2] *= 2.0**-80
    return weights, values


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["euclidean", "cosine"]).flatmap(lambda d: st.tuples(st.just(d), tiny_weight_layers(d))),
    st.sampled_from([torch.float32, torch.float64]),
    st.sampled_from([("numba", "values"), ("numba", "gram"), ("torch", "values")]),
)
def test_property_tiny_weights_and_near_ties_equal_reference(layer, screen, kernel_products) -> None:
    """The band of each key scales with its own contribution: the counts stay exact where most keys
    carry almost nothing and their screening values sit within float32 rounding of each other
    (the Gram route's float64 running sums, whose band also grows with ``N``, included)."""
    distance, (weights, values) = layer
    kernel, products = kernel_products
    positions = list(range(weights.shape[-1]))
    kw = dict(distance=distance, screen=screen, kernel=kernel, products=products)
    assert_matches_reference(weights, values, positions, **kw)


def test_sizes_in_any_order_equal_reference() -> None:
    """The engine sorts each grid for the screen and puts the results back in the given order."""
    weights, values = layer_rows("sink", 7, seed=11)
    positions = [3, 6, 4]
    assert_matches_reference(weights[:, :, positions], values, positions, ns=[4, 1, 3, 3, 2])
