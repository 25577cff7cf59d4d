"""Whether numba's compiled passes can run here, and whether a helper takes its compiled pass.

Many helpers of the package (the random control's hash, the stable sort's tie pass, the running
sums, the bounds' searches) have a compiled numba pass and a torch reference that gives the same
numbers. :data:`AVAILABLE` says once whether numba imports; :func:`use_compiled` decides per call.
The separability route is decided elsewhere, in :mod:`tl_geometry.core.engine.dispatch`.

>>> import torch
>>> use_compiled(False, torch.zeros(1)), use_compiled(None, torch.zeros(1, dtype=torch.float32), float64=True)
(False, False)
"""

from __future__ import annotations

import torch
from torch import Tensor

from tl_geometry.errors import InputError

try:  # numba is a dependency; a broken install falls back to the torch passes
    import numba
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None  # type: ignore[assignment]

#: Whether the compiled kernels can run here (numba importable).
AVAILABLE = numba is not None


def use_compiled(compiled: bool | None, x: Tensor, *, float64: bool = False, reference: str = "torch") -> bool:
    """Whether a helper with a compiled (numba) pass and a torch one takes the compiled pass for ``x``.

    ``compiled`` None: where numba imports and ``x`` is a CPU tensor (of float64 where ``float64``).
    True where that cannot run raises :class:`InputError` naming the ``reference`` to use instead.
    """
    runs_here = AVAILABLE and x.device.type == "cpu" and (x.dtype == torch.float64 or not float64)
    if compiled is None:
        return runs_here
    if compiled and not runs_here:
        tensors = "float64 CPU tensors" if float64 else "a CPU tensor"
        raise InputError(f"compiled=True needs numba and {tensors}; use compiled=False ({reference})")
    return compiled


__all__ = ["AVAILABLE", "use_compiled"]
