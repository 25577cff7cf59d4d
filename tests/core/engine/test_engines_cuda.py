"""The GPU paths of the engines: the query engine (float64 and float32 screening) and the exact
scaling on CUDA give the CPU's counts exactly and its distances to 1e-9. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from test_query_engine import COUNTED, MEASURED, keys_of, kv_heads, layer_rows

from tl_geometry.core.engine.batched import layer_metrics
from tl_geometry.core.engine.query_engine import separability_queries
from tl_geometry.core.numerics import times_pow2

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("screen", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", ["softmax", "ties", "sink", "duplicates"])
@pytest.mark.parametrize("rank_by", ["attention", "random"])
def test_query_engine_on_cuda_equals_the_cpu(kind, screen, rank_by):
    weights, values = layer_rows(kind, n_keys=24)
    positions = [0, 3, 11, 17, 23]
    weights = weights[:, :, positions]
    keys = keys_of(weights.shape[0], weights.shape[1], positions)
    kw = dict(rank_by=rank_by, row_keys=keys, n_random=2, screen=screen)
    cpu = separability_queries(weights, values, positions, kv_heads(4, 2), "log", **kw)
    gpu = separability_queries(
        weights.cuda(), values.cuda(), positions, kv_heads(4, 2).cuda(), "log", **{**kw, "row_keys": keys.cuda()}
    )
    for name in COUNTED:
        torch.testing.assert_close(getattr(gpu, name).cpu(), getattr(cpu, name), rtol=0, atol=0, equal_nan=True)
    for name in MEASURED:
        torch.testing.assert_close(getattr(gpu, name).cpu(), getattr(cpu, name), rtol=0, atol=1e-9, equal_nan=True)


def test_times_pow2_on_cuda_equals_the_cpu():
    x = torch.tensor([2.0**100, 3.0, -5.5, 2.0**-900], dtype=torch.float64)
    e = torch.tensor([-1100, 4, -2, -100])
    assert torch.equal(times_pow2(x.cuda(), e.cuda()).cpu(), times_pow2(x, e))


@pytest.mark.parametrize("rank_by", ["attention", "contribution", "random", "sink_window"])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("kind", ["softmax", "ties", "duplicates"])
def test_the_batched_route_on_cuda_equals_the_compiled_route_on_the_cpu(kind, distance, rank_by):
    """The route a GPU runs (every kernel) against the CPU's default: counts exactly, distances to 1e-9."""
    weights, values = layer_rows(kind, n_keys=24)
    positions = [0, 3, 11, 17, 23]
    weights = weights[:, :, positions]
    keys = keys_of(weights.shape[0], weights.shape[1], positions)
    kw = dict(rank_by=rank_by, distance=distance, row_keys=keys, n_random=2)
    cpu = separability_queries(weights, values, positions, kv_heads(4, 2), "log", **kw)
    gpu = separability_queries(
        weights.cuda(), values.cuda(), positions, kv_heads(4, 2).cuda(), "log", **{**kw, "row_keys": keys.cuda()}
    )
    for name in COUNTED:
        torch.testing.assert_close(getattr(gpu, name).cpu(), getattr(cpu, name), rtol=0, atol=0, equal_nan=True)
    for name in MEASURED:
        torch.testing.assert_close(getattr(gpu, name).cpu(), getattr(cpu, name), rtol=0, atol=1e-9, equal_nan=True)


@pytest.mark.parametrize("rank_by", ["attention", "contribution", "random", "sink_window"])
def test_a_layer_of_the_batched_route_never_synchronises(rank_by):
    """Under ``set_sync_debug_mode("error")`` any call that waits for the GPU raises."""
    weights, values = layer_rows("softmax", n_keys=24)
    positions = torch.tensor([0, 3, 11, 17, 23])
    ns = torch.tensor([[min(n, int(q) + 1) for n in (1, 2, 4, 8, 16)] for q in positions])
    inputs = [x.cuda() for x in (weights[:, :, positions], values, kv_heads(4, 2), positions + 1, ns)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = layer_metrics(*inputs, rank_by=rank_by, n_draws=2 if rank_by == "random" else 1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out["precision"].is_cuda and out["precision"].shape[-1] == 5
