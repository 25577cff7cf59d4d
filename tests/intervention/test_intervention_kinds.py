"""top_n_attention on every model kind of this TransformerLens (the bridge; HookedTransformer on 3.x):
against a reference that edits hook_pattern by the obvious stable sort, restored on exit."""

from __future__ import annotations

import pytest
import torch
from conftest import build, model_kinds
from intervention_reference import restrict_rows_by_sorting

import tl_geometry as tlg
from tl_geometry.intervention.loss import corpus_nll
from tl_geometry.models import describe_model


@pytest.fixture(scope="module", params=model_kinds())
def model(request):
    return build(request.param)


def reference_nll(model, tokens, n, rank_by, renormalize):
    info = describe_model(model)
    group = info.n_heads // info.n_kv_heads
    values = {}

    def keep_v(v, hook):
        v = v if v.ndim == 4 else v.reshape(*v.shape[:2], -1, info.d_head)
        values[hook.layer()] = v.repeat_interleave(group, dim=2) if v.shape[2] != info.n_heads else v

    def restrict(pattern, hook):
        scores = pattern.double()
        if rank_by == "contribution":
            scores = scores * values[hook.layer()].double().norm(dim=-1).transpose(1, 2)[:, :, None, :]
        return restrict_rows_by_sorting(pattern, scores, n, renormalize)

    hooks = []
    for layer in range(info.n_layers):
        hooks += [(f"blocks.{layer}.attn.hook_v", keep_v), (f"blocks.{layer}.attn.hook_pattern", restrict)]
    with torch.inference_mode():
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
    return float(torch.nn.functional.cross_entropy(logits[:, :-1].double().flatten(0, 1), tokens[:, 1:].flatten()))


@pytest.mark.parametrize("rank_by", ["attention", "contribution"])
@pytest.mark.parametrize("renormalize", [False, True])
def test_matches_the_sorting_reference(model, rank_by, renormalize) -> None:
    torch.manual_seed(3)
    tokens = torch.randint(3, 259, (2, 14))
    with tlg.top_n_attention(model, n=3, rank_by=rank_by, renormalize=renormalize):
        got = corpus_nll(model, tokens, progress=False).nll
    full = corpus_nll(model, tokens, progress=False).nll
    expected = reference_nll(model, tokens, 3, rank_by, renormalize)
    assert got != full
    assert got == pytest.approx(expected, abs=1e-6)


def test_restored_on_exit(model) -> None:
    tokens = torch.randint(3, 259, (1, 10))
    with torch.inference_mode():
        before = model(tokens)
        with pytest.raises(ValueError):
            with tlg.top_n_attention(model, n=1, rank_by="sink_window", renormalize=True):
                raise ValueError
        assert torch.equal(model(tokens), before)
    assert all(len(point.fwd_hooks) == 0 for point in model.hook_dict.values())
