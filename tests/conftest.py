"""Shared fixtures: tiny random TransformerLens models built from a config (no download)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tl_geometry.testing import (  # noqa: E402 - the offline switches come first
    byte_tokenizer,
    tiny_gpt2_bridge,
    tiny_hooked_transformer,
    tiny_llama_bridge,
)

__all__ = ["byte_tokenizer", "tiny_gpt2_bridge", "tiny_hooked_transformer", "tiny_llama_bridge"]


def has_hooked_transformer() -> bool:
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:  # TransformerLens 4 raises ImportError on the removed name
        return False
    return True


def model_kinds() -> list[str]:
    """The model kinds this TransformerLens offers: the bridge always, HookedTransformer on 3.x."""
    kinds = ["llama_bridge", "gpt2_bridge"]
    if has_hooked_transformer():
        kinds.append("hooked")
    return kinds


def build(kind: str):
    return {"llama_bridge": tiny_llama_bridge, "gpt2_bridge": tiny_gpt2_bridge, "hooked": tiny_hooked_transformer}[
        kind
    ]()


@pytest.fixture(scope="session")
def llama_bridge():
    return tiny_llama_bridge()


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of many small tensors (faster, and kind to a shared machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
