"""``last_logits``: the last positions' logits equal the full pass's, on a bridge and a HookedTransformer."""

from __future__ import annotations

import pytest
import torch

from tl_geometry import testing
from tl_geometry.models import hook_pattern_name, last_logits


@pytest.mark.parametrize("make", [testing.tiny_llama_bridge, testing.tiny_gemma3_bridge])
def test_the_last_positions_equal_the_full_logits_on_a_bridge(make) -> None:
    model = make()
    tokens = torch.randint(1, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full = model(tokens)
        tail = last_logits(model, tokens, 5)
    assert tail.shape == (2, 5, full.shape[-1])
    torch.testing.assert_close(tail, full[:, -5:], rtol=1e-5, atol=1e-5)


def test_hooks_run_and_take_effect_with_the_last_positions() -> None:
    model = testing.tiny_llama_bridge()
    tokens = torch.randint(1, 50, (1, 10), generator=torch.Generator().manual_seed(1))

    def uniform(pattern, hook):
        mask = torch.ones_like(pattern).tril()
        return mask / mask.sum(-1, keepdim=True)

    hooks = [(hook_pattern_name(0), uniform)]
    with torch.inference_mode():
        edited = model.run_with_hooks(tokens, fwd_hooks=hooks)
        tail = last_logits(model, tokens, 3, hooks)
        plain = last_logits(model, tokens, 3)
    torch.testing.assert_close(tail, edited[:, -3:], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(tail, plain)
