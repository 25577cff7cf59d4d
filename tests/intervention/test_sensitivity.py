"""The gradient-sensitivity predictor S(N) against a loop over layers, heads, queries and left-out keys."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tl_geometry.capture.hooks import as_kv_values
from tl_geometry.intervention.sensitivity import gradient_sensitivity
from tl_geometry.models import describe_model
from tl_geometry.testing import tiny_llama_bridge


def loop_sensitivity(model, tokens, sizes):
    info = describe_model(model)
    saved = {}

    def keep(name):
        def hook(act, hook):
            if name.endswith("hook_z"):  # written out as a leaf added to z
                saved[name] = torch.zeros_like(act, requires_grad=True)
                return act + saved[name]
            saved[name] = act
            return None

        return hook

    names = [f"blocks.{layer}.attn.{h}" for layer in range(info.n_layers) for h in ("hook_pattern", "hook_v", "hook_z")]
    with torch.enable_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=[(name, keep(name)) for name in names])
        loss = sum(
            -F.log_softmax(logits[b, p - 1].double(), -1)[tokens[b, p]]
            for b in range(tokens.shape[0])
            for p in range(1, tokens.shape[1])
        )
        loss.backward()
    out = []
    for n in sizes:
        total = 0.0
        for layer in range(info.n_layers):
            pattern = saved[f"blocks.{layer}.attn.hook_pattern"].detach().double()
            values = as_kv_values(saved[f"blocks.{layer}.attn.hook_v"].detach(), info).double()
            grad = saved[f"blocks.{layer}.attn.hook_z"].grad.double()
            for b in range(tokens.shape[0]):
                for h in range(info.n_heads):
                    for q in range(tokens.shape[1]):
                        w = pattern[b, h, q, : q + 1].tolist()
                        order = sorted(range(q + 1), key=lambda k: (-w[k], k))
                        error = sum(
                            (w[k] * values[b, k, h // 2] for k in order[n:]),
                            torch.zeros(values.shape[-1], dtype=torch.float64),
                        )
                        total += abs(float(grad[b, q, h] @ error))
        out.append(total)
    model.zero_grad(set_to_none=True)
    return out, float(loss.detach())


def test_sensitivity_equals_the_loop_and_vanishes_at_the_window_length() -> None:
    model = tiny_llama_bridge(n_heads=4, n_kv_heads=2)
    tokens = torch.randint(3, 259, (2, 10), generator=torch.Generator().manual_seed(0))
    table = gradient_sensitivity(model, tokens, ns=[1, 3, 10], batch_size=2, progress=False)
    expected, loss = loop_sensitivity(model, tokens, [1, 3, 10])
    assert table.sensitivity.tolist() == pytest.approx(expected, rel=1e-9)
    assert table.sensitivity.iloc[-1] == 0.0 and table.sensitivity.iloc[0] > table.sensitivity.iloc[1] > 0
    assert table.n_tokens.iloc[0] == 2 * 9 and table.nll_full.iloc[0] == pytest.approx(loss / 18, rel=1e-9)
    assert table.sensitivity_rel.tolist() == pytest.approx([s / loss for s in expected], rel=1e-9)
