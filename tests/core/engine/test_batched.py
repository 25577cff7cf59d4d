"""The batched route (core/engine/batched.py) is shaped for a device: a fixed number of tensor operations
per layer, none of which reads a tensor's value on the host.

Run on the CPU under a ``TorchDispatchMode`` that records every aten operation: the count must
not grow with the heads (2 vs 8), the query rows (1 vs 64) or the windows (1 vs 3), and no
operation that synchronises a device with the host (``aten._local_scalar_dense`` behind
``.item()`` / ``bool()``, ``nonzero``, boolean-mask selection, ``unique``, a copy to the CPU) may
run. The same route on ``meta`` tensors (no values at all) must complete: a value read there fails.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_query_engine import assert_matches_reference, layer_rows
from torch.utils._python_dispatch import TorchDispatchMode

import tl_geometry as tlg
from tl_geometry.core.engine.batched import layer_metrics
from tl_geometry.core.engine.query_engine import separability_queries

#: aten operations that read a tensor's value on the host, or whose output shape depends on values.
HOST_READS = (
    "_local_scalar_dense",
    "item",
    "nonzero",
    "masked_select",
    "unique",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "equal",
    "is_nonzero",
    "argwhere",
)


class OpRecorder(TorchDispatchMode):
    """Counts every aten operation; notes those that read values on the host."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.host_reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        boolean_index = name in ("index", "index_put", "index_put_") and any(
            isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in _flat(args)
        )
        to_host = name in ("_to_copy", "to", "copy_") and str(kwargs.get("device", "")) == "cpu"
        if name in HOST_READS or boolean_index or to_host:
            self.host_reads.append(str(func))
        return func(*args, **(kwargs or {}))


def _flat(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _flat(a)
        else:
            yield a


def layer(n_batch: int, n_heads: int, queries: list[int], n_keys: int = 12, d: int = 4, device: str = "cpu"):
    """One layer's inputs: causal rows of ``queries``, GQA with two query heads per key/value head."""
    g = torch.Generator().manual_seed(n_heads * 1000 + len(queries))
    logits = torch.randn(n_batch, n_heads, len(queries), n_keys, generator=g, dtype=torch.float64)
    q = torch.tensor(queries)
    logits = logits.masked_fill(torch.arange(n_keys) > q[:, None], -torch.inf)
    weights = torch.softmax(logits, -1)
    values = torch.randn(n_batch, n_keys, max(1, n_heads // 2), d, generator=g, dtype=torch.float64)
    kv_head_of = torch.arange(n_heads) // 2 if n_heads > 1 else torch.zeros(1, dtype=torch.int64)
    grid = [[min(n, k + 1) for n in (1, 2, 3, 5)] for k in queries]
    ns = torch.tensor(grid, dtype=torch.int64)
    to = dict(device=device)
    return (weights.to(**to), values.to(**to), kv_head_of.to(**to), (q + 1).to(**to), ns.to(**to))


def recorded(inputs, **kw) -> OpRecorder:
    with OpRecorder() as rec:
        layer_metrics(*inputs, **kw)
    return rec


SETTINGS = [
    dict(rank_by="attention", distance="euclidean"),
    dict(rank_by="contribution", distance="cosine"),
    dict(rank_by="random", distance="euclidean", n_draws=3),
    dict(rank_by="sink_window", distance="euclidean"),
]


@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: kw["rank_by"])
def test_operations_do_not_grow_with_heads_rows_or_windows(kw) -> None:
    base = recorded(layer(1, 2, [11]), **kw)
    more_heads = recorded(layer(1, 8, [11]), **kw)
    more_rows = recorded(layer(1, 2, [i % 12 for i in range(64)]), **kw)
    more_windows = recorded(layer(3, 2, [11]), **kw)
    assert base.ops == more_heads.ops == more_rows.ops == more_windows.ops
    assert sum(base.ops.values()) < 400  # a few hundred operations (the random hash), not some per row


@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: kw["rank_by"])
def test_no_operation_reads_values_on_the_host(kw) -> None:
    rec = recorded(layer(2, 4, [3, 7, 11]), **kw)
    assert rec.host_reads == []
    out = layer_metrics(*layer(2, 4, [3, 7, 11], device="meta"), **kw)  # no values to read: a read fails
    assert out["precision"].shape == (2, 4, 3, kw.get("n_draws", 1), 4)


def test_the_recorder_sees_host_reads() -> None:
    """The recorder is not blind: an ``.item()``, a ``nonzero`` and a boolean mask are caught."""
    x = torch.arange(5.0)
    with OpRecorder() as rec:
        x.sum().item()
        x.nonzero()
        x[x > 2]
    assert len(rec.host_reads) >= 3


def test_the_query_engine_takes_the_batched_route_for_kernel_torch() -> None:
    """``kernel="torch"`` on the CPU runs :func:`layer_metrics`: the same numbers as calling it."""
    weights, values, kv_head_of, lengths, ns = layer(2, 4, [5, 7, 11])
    rows = separability_queries(weights, values, [5, 7, 11], kv_head_of, [1, 2, 3, 5], kernel="torch")
    direct = layer_metrics(weights, values, kv_head_of, lengths, ns)["r_max"][..., 0, :]
    valid = rows.valid.expand_as(rows.r_max)
    assert rows.ns.tolist() == ns.tolist() == [[1, 2, 3, 5]] * 3
    assert torch.equal(rows.r_max[valid], direct[valid])


@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: kw["rank_by"])
def test_chunks_do_not_change_anything(kw) -> None:
    """``max_cells`` (a memory hint) splits the rows into chunks: the same numbers bit for bit."""
    inputs = layer(2, 4, [3, 7, 11])
    whole = layer_metrics(*inputs, **kw)
    for max_cells in (1, 500):
        chunked = layer_metrics(*inputs, max_cells=max_cells, **kw)
        for name, x in whole.items():
            assert torch.equal(x.nan_to_num(-7.0), chunked[name].nan_to_num(-7.0)), (name, max_cells)


@pytest.mark.parametrize("rank_by", ["attention", "contribution", "sink_window", "random"])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("kind", ["random", "ties", "sink", "flat", "duplicates"])
def test_every_ranking_and_distance_equal_reference(kind, distance, rank_by) -> None:
    """Every query of a layer on the batched route against the loop reference (counts exactly,
    distances to 1e-9): exact ties, duplicated keys, a sink, the random control."""
    weights, values = layer_rows(kind, 9, n_heads=4, n_kv=2, seed=5)
    assert_matches_reference(
        weights, values, list(range(9)), ns="all", rank_by=rank_by, distance=distance, kernel="torch"
    )


def test_last_query_rows_equal_the_compiled_route_bit_for_bit() -> None:
    """``separability(kernel="torch")`` (the batched route) and the compiled route: every metric bit for bit."""
    weights, values = layer_rows("sink", 33, n_heads=4, n_kv=4, seed=8)
    rows_w, rows_v = weights[:, :, -1], values.permute(0, 2, 1, 3)
    for rank_by in ("attention", "random"):
        a = tlg.separability(rows_w, rows_v, "log", rank_by=rank_by, kernel="torch")
        b = tlg.separability(rows_w, rows_v, "log", rank_by=rank_by, kernel="numba")
        for name in ("precision", "recall", "r_min", "r_max", "retained_mass", "local_error_del", "local_error_ren"):
            assert torch.equal(getattr(a, name).nan_to_num(-7.0), getattr(b, name).nan_to_num(-7.0)), name
