"""TransformerLens' layouts in the tensor functions, and no future key ever measured (issue 20)."""

from __future__ import annotations

import pytest
import torch

import tl_geometry as tlg
from tl_geometry.core.engine.rows import separability_of_rows
from tl_geometry.core.separability import radius_rows
from tl_geometry.errors import InputError

METRICS = ["precision", "recall", "r_max", "r_min", "retained_mass", "local_error_del", "local_error_ren"]


@pytest.fixture(scope="module")
def cached(llama_bridge):
    """pattern [1, 4, 12, 12] and hook_v [1, 12, 2, 8] of layer 1 of the tiny grouped-query bridge."""
    torch.manual_seed(0)
    _, cache = llama_bridge.run_with_cache(torch.randint(3, 200, (2, 12)))
    return cache["pattern", 1].double(), cache["v", 1].double()


def per_head(hook_v: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[batch, head, pos, d] by hand: TransformerLens repeats each key/value head over its group."""
    group = n_heads // hook_v.shape[2]
    return hook_v.repeat_interleave(group, dim=2).transpose(1, 2)


def test_full_row_of_an_earlier_query_is_refused(cached):
    pattern, hook_v = cached
    values = per_head(hook_v, 4)
    with pytest.raises(InputError, match="weight exactly 0.*query_positions=q"):
        tlg.separability(pattern[:, :, 5], values)
    with pytest.raises(InputError, match="weight exactly 0"):
        tlg.precision_recall_at_radius(pattern[:, :, 5], values, torch.tensor([0.1, 1.0]))


def test_full_row_with_its_position_is_cut_to_its_keys(cached):
    pattern, hook_v = cached
    values = per_head(hook_v, 4)
    full = tlg.separability(pattern[:, :, 5], values, "all", query_positions=5)
    cut = separability_of_rows(pattern[:, :, 5, :6], values[:, :, :6], "all")
    future = separability_of_rows(pattern[:, :, 5], values, list(range(1, 7)))  # what main measured
    assert full.ns.tolist() == [1, 2, 3, 4, 5, 6]
    for name in METRICS:
        assert torch.equal(getattr(full, name), getattr(cut, name)), name
    assert not torch.equal(future.precision, cut.precision)  # the future keys do change precision
    radii = torch.tensor([0.01, 0.1, 1.0], dtype=torch.float64)
    pr = tlg.precision_recall_at_radius(pattern[:, :, 5], values, radii, "all", query_positions=-7)
    ref = radius_rows(pattern[:, :, 5, :6], values[:, :, :6], radii, "all")
    assert torch.equal(pr.precision.nan_to_num(-1), ref.precision.nan_to_num(-1))
    assert torch.equal(pr.recall, ref.recall)


def test_a_whole_pattern_as_rows_is_refused(cached):
    pattern, hook_v = cached
    values = per_head(hook_v, 4)[:, :, None].expand(-1, -1, 12, -1, -1)  # [b, h, q, K, d]
    with pytest.raises(InputError, match="of 96 attention rows end in keys of weight exactly 0"):
        tlg.separability(pattern, values)


def test_genuine_trailing_zero_weights_are_measured_when_said_so():
    weights = torch.tensor([[0.7, 0.3, 0.0]], dtype=torch.float64)
    values = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]], dtype=torch.float64)
    res = tlg.separability(weights, values, "all", query_positions=-1)
    assert res.ns.tolist() == [1, 2, 3]
    assert torch.equal(res.precision, separability_of_rows(weights, values, "all").precision)


@pytest.mark.parametrize("queries", [[0, 3, 7, 11], "all"])
def test_tl_layout_equals_each_row_cut_and_mapped_by_hand(cached, queries):
    pattern, hook_v = cached
    values = per_head(hook_v, 4)
    rows = tlg.separability(pattern, hook_v, "log", layout="tl", query_positions=queries)
    positions = list(range(12)) if queries == "all" else queries
    assert rows.query_positions == tuple(positions)
    assert rows.precision.shape[:3] == (2, 4, len(positions))
    for j, q in enumerate(positions):
        ref = separability_of_rows(pattern[:, :, q, : q + 1], values[:, :, : q + 1], "log")
        g = ref.ns.shape[0]
        assert rows.ns[j, :g].tolist() == ref.ns.tolist() and not rows.valid[j, g:].any()
        for name in ("precision", "recall"):  # counts: exact
            assert torch.equal(getattr(rows, name)[:, :, j, :g], getattr(ref, name)), (q, name)
        for name in ("r_max", "r_min", "retained_mass", "local_error_ren"):
            assert torch.allclose(getattr(rows, name)[:, :, j, :g], getattr(ref, name), rtol=1e-9, atol=1e-12)


def test_tl_layout_takes_some_rows_with_their_positions(cached):
    pattern, hook_v = cached
    whole = tlg.separability(pattern, hook_v, layout="tl", query_positions=[4, 9])
    some = tlg.separability(pattern[:, :, [4, 9]], hook_v, layout="tl", query_positions=[4, 9])
    assert torch.equal(whole.precision.nan_to_num(-1), some.precision.nan_to_num(-1))
    radii = torch.tensor([0.05, 0.5], dtype=torch.float64)
    pr = tlg.precision_recall_at_radius(pattern[:, :, [9]], hook_v, radii, "all", layout="tl", query_positions=[9])
    ref = radius_rows(pattern[:, :, 9, :10], per_head(hook_v, 4)[:, :, :10], radii, "all")
    assert pr.precision.shape == (2, 4, 1, 10, 2)
    assert torch.equal(pr.recall[:, :, 0], ref.recall)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda p, v: tlg.separability(p, v, layout="tl"), "needs query_positions"),
        (lambda p, v: tlg.separability(p[:, :, 5], v, layout="tl", query_positions=5), "keep the query axis"),
        (lambda p, v: tlg.separability(p[:, :, [4, 9]], v, layout="tl", query_positions=[4]), "position of each row"),
        (lambda p, v: tlg.separability(p, v.reshape(2, 12, 16), layout="tl", query_positions=1), "hook_v must be"),
        (lambda p, v: tlg.separability(p, v[:, :8], layout="tl", query_positions=1), "does not match"),
        (lambda p, v: tlg.separability(p[:, :3], v, layout="tl", query_positions=1), "multiple of kv_head"),
        (lambda p, v: tlg.separability(p, v, layout="hooked"), "layout='hooked'"),
        (lambda p, v: tlg.separability(p[:, :, 5], v, query_positions=[5, 6]), "one position of every row"),
    ],
)
def test_layout_errors_name_the_fix(cached, call, match):
    pattern, hook_v = cached
    with pytest.raises(InputError, match=match):
        call(pattern, hook_v)
