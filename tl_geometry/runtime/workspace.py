"""Reusable work tensors: one flat buffer per name, dtype and device, per thread.

A large tensor allocated afresh on every call faults its pages in again (the C allocator hands
big blocks back to the system when they are freed); the engines' temporaries of a few MB come
from here instead and keep their pages from call to call.

Example: ``WORKSPACE.get("upper", (9, 205, 1024), torch.float32, device)`` is valid until the next
``get("upper", ...)`` on the same thread.
"""

from __future__ import annotations

import math
import threading

import torch
from torch import Tensor


class Workspace(threading.local):
    """Reusable work tensors, one flat buffer per name and dtype, per thread."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, torch.dtype, torch.device], Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        """An uninitialised tensor of ``shape`` that stays valid until the next ``get(name, ...)``.

        Parameters
        ----------
        name : str
            The buffer's name (one buffer per name, dtype and device).
        shape : tuple of int
            The shape of the view returned.
        dtype : torch.dtype
        device : torch.device
        """
        numel = math.prod(shape)
        key = (name, dtype, torch.device(device))
        buffer = self.buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            with torch.inference_mode(False):  # a normal tensor, writable in and out of inference mode
                buffer = self.buffers[key] = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel].view(shape)


#: The work tensors of the per-row engine (:mod:`~tl_geometry.core.engine.screening`,
#: :mod:`~tl_geometry.core.separability`); each caller uses its own names.
WORKSPACE = Workspace()

__all__ = ["WORKSPACE", "Workspace"]
