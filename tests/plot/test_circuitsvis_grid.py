"""The head grid's cap warning."""

from __future__ import annotations

import warnings

import pytest

from tl_geometry.plot.circuitsvis_grid import DEFAULT_MAX_HEADS, head_grid
from tl_geometry.testing import tiny_llama_bridge

TEXT = "def f(x):\n    return x  # </script> <!-- tag"


@pytest.fixture(scope="module")
def many_heads():
    """36 heads: more than the default cap of 32."""
    model = tiny_llama_bridge(n_heads=4, n_kv_heads=2, n_layers=9)
    assert model.cfg.n_layers * model.cfg.n_heads > DEFAULT_MAX_HEADS
    return model


def test_default_cap_warns_that_heads_were_left_out(many_heads) -> None:
    with pytest.warns(UserWarning, match="36 heads chosen; the head grid shows 32 of them by default"):
        grid = head_grid(many_heads, TEXT)
    assert len(grid.heads) == 32


@pytest.mark.parametrize("cap", [12, 32])
def test_a_cap_the_user_chose_does_not_warn(many_heads, cap: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grid = head_grid(many_heads, TEXT, max_heads=cap)
    assert len(grid.heads) == cap
