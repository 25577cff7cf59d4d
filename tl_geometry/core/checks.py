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
from beartype import beartype
from jaxtyping import jaxtyped

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
