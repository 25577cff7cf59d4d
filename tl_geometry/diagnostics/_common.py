"""Small helpers shared by the diagnostics accumulators (not public)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..errors import InputError

#: Every accumulator sums in this dtype, whatever the dtype of the activations.
ACC_DTYPE = torch.float64


def median_last(x: Tensor) -> Tensor:
    """The median along the last axis, the mean of the two middle values for an even count.

    ``torch.median`` returns the lower middle value for an even count; SPEC §3's median is the
    usual one.
    """
    n = x.shape[-1]
    s = x.sort(dim=-1).values
    mid = n // 2
    if n % 2:
        return s[..., mid]
    return 0.5 * (s[..., mid - 1] + s[..., mid])


def unit(x: Tensor) -> Tensor:
    """``x / ||x||`` along the last axis; a zero vector stays zero (so its cosines count as 0)."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x / norm.clamp_min(torch.finfo(x.dtype).tiny)


def check_same(name: str, mine: Any, theirs: Any, what: str) -> None:
    """Refuse to merge accumulators built with different geometry or settings."""
    if mine != theirs:
        raise InputError(
            f"cannot merge {name} accumulators with different {what} ({mine} vs {theirs}): "
            "merge only results of the same model, window length and settings"
        )


def as_state(obj: Any) -> Any:
    """Tensors are cloned so a saved state never aliases a live accumulator."""
    if isinstance(obj, Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: as_state(v) for k, v in obj.items()}
    return obj
