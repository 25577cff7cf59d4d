"""The engine's one door for a layer (``core/engine/layer.py``) and its plan (``core/engine/dispatch.py``).

``separability_of_layer`` takes every chosen query row of a layer, global or cut by a sliding window,
and gives each row the metrics of that row alone: counts exactly, distances to 1e-9 against the loop
reference (definitions §2, §7), whichever pipeline the plan sends it to.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from reference import row_metrics
from test_query_engine import COUNTED, MEASURED, keys_of, kv_heads, layer_rows

from tl_geometry.core.engine import dispatch
from tl_geometry.core.engine.dispatch import LayerPlan, plan_layer
from tl_geometry.core.engine.layer import separability_of_layer
from tl_geometry.core.sizes import clip_ns, resolve_ns
from tl_geometry.errors import InputError

RANKINGS = ("attention", "random", "contribution")


def windowed(weights: torch.Tensor, window: int) -> tuple[torch.Tensor, list[int]]:
    """``weights [b, h, q, k]`` of every query as a sliding-window layer of ``window`` keys sees them:
    zero before the first visible key, each row renormalised; and those first keys."""
    n_keys = weights.shape[-1]
    firsts = [max(0, q - window + 1) for q in range(n_keys)]
    seen = torch.arange(n_keys)[None, :] >= torch.tensor(firsts)[:, None]
    cut = weights * seen
    return cut / cut.sum(-1, keepdim=True), firsts


def frame(rows: dict) -> pd.DataFrame:
    """Every valid cell of ``{ranking: QueryRows}`` as one table, for comparisons."""
    out = []
    for name, res in rows.items():
        b, h, q, n = res.precision.shape
        keep = res.valid[None, None].expand(b, h, q, n)
        cols = {m: getattr(res, m)[keep].numpy() for m in [*COUNTED, *MEASURED]}
        out.append(pd.DataFrame({"rank_by": name, "n": res.ns[None, None].expand(b, h, q, n)[keep].numpy(), **cols}))
    return pd.concat(out, ignore_index=True)


@pytest.mark.parametrize(
    ("firsts", "plan"),
    [
        ([0], LayerPlan(blocks=(), rows=(0,))),
        ([0, 0], LayerPlan(blocks=(0, 1), rows=())),
        ([0, 3], LayerPlan(blocks=(), rows=(0, 1))),
        ([0, 0, 1, 2], LayerPlan(blocks=(0, 1), rows=(2, 3))),
        ([1, 2], LayerPlan(blocks=(), rows=(0, 1))),
    ],
)
def test_plan_sends_whole_queries_together_and_cut_rows_alone(firsts: list[int], plan: LayerPlan) -> None:
    assert plan_layer(firsts) == plan


@pytest.mark.parametrize("kernel", ["auto", "torch"])
@pytest.mark.parametrize(("window", "positions"), [(4, list(range(9))), (3, [8]), (9, [2, 8]), (2, [0, 5, 7])])
def test_every_row_equals_reference_global_or_cut(kernel: str, window: int, positions: list[int]) -> None:
    weights, values = layer_rows("random", 9, seed=window)
    weights, firsts = windowed(weights, window)
    firsts = [firsts[q] for q in positions]
    weights = weights[:, :, positions]
    n_batch, n_heads = weights.shape[:2]
    kv, keys = kv_heads(n_heads, values.shape[2]), keys_of(n_batch, n_heads, positions)
    rows = separability_of_layer(
        weights, values, positions, kv, firsts, "all", RANKINGS, n_random=3, row_keys=keys, kernel=kernel
    )
    assert list(rows) == list(RANKINGS)
    for name, res in rows.items():
        assert res.query_positions == tuple(positions) and res.rank_by == name
        for j, (q, first) in enumerate(zip(positions, firsts)):
            grid = res.ns[j][res.valid[j]].tolist()
            assert grid == resolve_ns(clip_ns("all", q + 1), q + 1 - first).tolist()
            for b in range(n_batch):
                for h in range(n_heads):
                    w, v = weights[b, h, j, first : q + 1], values[b, first : q + 1, int(kv[h])]
                    for gi, n in enumerate(grid):
                        ref = row_metrics(w, v, n, name, seed=0, row_key=int(keys[b, h, j]), n_random=3)
                        where = (name, b, h, q, n)
                        for metric in COUNTED:
                            got = float(getattr(res, metric)[b, h, j, gi])
                            assert got == pytest.approx(ref[metric], abs=1e-15), where
                        for metric in MEASURED:
                            got, want = float(getattr(res, metric)[b, h, j, gi]), ref[metric]
                            if math.isinf(want) or math.isnan(want):
                                assert got == want or (math.isnan(got) and math.isnan(want)), (metric, where)
                            else:
                                assert got == pytest.approx(want, abs=1e-9, rel=1e-9), (metric, where)


def test_blocks_and_rows_give_the_same_rows() -> None:
    """The plan changes the route, not the rows: every query of a sliding-window layer together and
    cut (the default plan) equals every query one at a time."""
    weights, values = layer_rows("ties", 10, seed=5)
    weights, firsts = windowed(weights, 6)
    positions = list(range(10))
    kv, keys = kv_heads(4, 2), keys_of(2, 4, positions)
    kw = dict(ns="log", rank_by=RANKINGS, n_random=2, row_keys=keys)
    planned = separability_of_layer(weights, values, positions, kv, firsts, **kw)
    minimum, dispatch.MIN_QUERIES_FOR_BLOCKS = dispatch.MIN_QUERIES_FOR_BLOCKS, 1 << 62
    try:
        assert plan_layer(firsts).blocks == ()
        alone = separability_of_layer(weights, values, positions, kv, firsts, **kw)
    finally:
        dispatch.MIN_QUERIES_FOR_BLOCKS = minimum
    assert plan_layer(firsts).blocks == tuple(range(6))
    for name in RANKINGS:
        assert torch.equal(planned[name].ns, alone[name].ns) and torch.equal(planned[name].valid, alone[name].valid)
    exact = [*COUNTED, "rank_by", "n"]
    pd.testing.assert_frame_equal(frame(planned)[exact], frame(alone)[exact], check_exact=True)
    pd.testing.assert_frame_equal(frame(planned), frame(alone), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("firsts", [[0], [0, 0, 0], [2, 0], [-1, 0]])
def test_first_keys_are_checked(firsts: list[int]) -> None:
    weights, values = layer_rows("random", 4)
    with pytest.raises(InputError, match="first_keys"):
        separability_of_layer(weights[:, :, [1, 3]], values, [1, 3], kv_heads(4, 2), firsts)
