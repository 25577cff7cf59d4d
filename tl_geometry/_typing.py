"""Run-time shape checking for the public tensor functions (SPEC §6).

Every public function that takes or returns tensors is wrapped with :func:`typechecked`, which
checks the jaxtyping annotations (dtype and named dimensions, consistent across arguments) with
beartype on every call. A wrong shape raises ``jaxtyping.TypeCheckError`` whose message names the
argument, the expected shape and the shape received.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch
from beartype import beartype
from jaxtyping import jaxtyped

F = TypeVar("F", bound=Callable)

#: Every accumulator of the package (diagnostics, taxonomy) sums in this dtype, whatever the
#: dtype of the activations.
ACC_DTYPE = torch.float64


def typechecked(fn: F) -> F:
    """Check ``fn``'s jaxtyping annotations at run time (jaxtyping + beartype)."""
    return jaxtyped(typechecker=beartype)(fn)
