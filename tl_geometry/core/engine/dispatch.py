"""Which separability route runs: the one place that decides, from the device and the kernel asked for,
and which query rows of a layer go to the block pipeline together (:func:`plan_layer`).

Two routes compute the same metrics (docs/engine.md, "Which route runs where"):

* ``"numba"``: the compiled screen on the CPU (:mod:`tl_geometry.core.engine.fused`,
  :mod:`tl_geometry.core.engine.fused_rows`): a float32 screen, its unsure keys re-checked in float64
  on the host;
* ``"torch"``: the batched device route (:mod:`tl_geometry.core.engine.batched`): a fixed number of tensor
  operations per layer over every head, row and size, float64 direct distances, no host reads.

``kernel="auto"`` (or None) takes the compiled screen for CPU tensors where numba imports, the
batched route elsewhere (a GPU, or no numba). Callers pass the user's ``kernel`` through unchanged;
nothing above ``core/`` chooses a route.

>>> import torch
>>> route(torch.device("cpu"), "torch"), route(torch.device("cuda"), "auto")
('torch', 'torch')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tl_geometry.core.compiled import AVAILABLE
from tl_geometry.errors import InputError

#: The kernels a caller may ask for (``tlg.separability(kernel=)``, ``tl-geometry run --kernel``).
KERNELS = ("auto", "numba", "torch")

#: The routes :func:`route` returns: the compiled CPU screen, the batched tensor route.
ROUTES = ("numba", "torch")


def check_kernel(kernel: str | None) -> str:
    """``kernel`` checked (None means ``"auto"``): one of :data:`KERNELS` that can run here.

    >>> check_kernel(None), check_kernel("torch")
    ('auto', 'torch')
    """
    kernel = "auto" if kernel is None else kernel
    if kernel not in KERNELS:
        raise InputError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "numba" and not AVAILABLE:
        raise InputError("kernel='numba' needs numba (pip install numba); use kernel='torch'")
    return kernel


def route(device: torch.device, kernel: str | None) -> str:
    """The route of a separability computation on tensors of ``device``: ``"numba"`` or ``"torch"``.

    ``"auto"``: the compiled screen on the CPU where numba imports, else the batched route.
    ``"numba"`` on a GPU runs the batched route too (the compiled pass is a CPU kernel; copying a
    layer to the host would cost more than the route itself).
    """
    kernel = check_kernel(kernel)
    on_cpu = torch.device(device).type == "cpu"
    if kernel == "torch" or not on_cpu or not AVAILABLE:
        return "torch"
    return "numba"


#: From this many query positions of a layer on, those whose query sees every earlier key are
#: computed together (:func:`tl_geometry.core.engine.query_engine.separability_queries`: same rows, faster);
#: fewer one position at a time (:func:`tl_geometry.core.engine.rows.separability_rankings`).
MIN_QUERIES_FOR_BLOCKS = 2


def blocks_of_queries(n_queries: int) -> bool:
    """Whether ``n_queries`` query positions of a layer go to the query engine together.

    >>> blocks_of_queries(1), blocks_of_queries(512)
    (False, True)
    """
    return n_queries >= MIN_QUERIES_FOR_BLOCKS


@dataclass(frozen=True)
class LayerPlan:
    """How :func:`tl_geometry.core.engine.layer.separability_of_layer` computes the query rows of a layer.

    Attributes
    ----------
    blocks : the indices of the query positions computed together by the block pipeline
        (:func:`tl_geometry.core.engine.query_engine.separability_queries`), in order.
    rows : the indices of those computed one position at a time, each row cut to the keys its query
        sees (:func:`tl_geometry.core.engine.rows.separability_rankings`), in order.
    """

    blocks: tuple[int, ...]
    rows: tuple[int, ...]


def plan_layer(first_keys: Sequence[int]) -> LayerPlan:
    """The plan of a layer whose query ``j`` sees the keys from ``first_keys[j]`` on (0: every key
    up to the query; more on a sliding-window layer whose window cuts keys off).

    The queries that see every earlier key go to the block pipeline together when there are at least
    :data:`MIN_QUERIES_FOR_BLOCKS` of them; the others, and all of them when fewer, one at a time.

    >>> plan_layer([0]), plan_layer([0, 0, 0, 2])
    (LayerPlan(blocks=(), rows=(0,)), LayerPlan(blocks=(0, 1, 2), rows=(3,)))
    """
    whole = tuple(j for j, first in enumerate(first_keys) if first == 0)
    if blocks_of_queries(len(whole)):
        return LayerPlan(blocks=whole, rows=tuple(j for j, first in enumerate(first_keys) if first != 0))
    return LayerPlan(blocks=(), rows=tuple(range(len(first_keys))))


__all__ = [
    "KERNELS",
    "LayerPlan",
    "MIN_QUERIES_FOR_BLOCKS",
    "ROUTES",
    "blocks_of_queries",
    "check_kernel",
    "plan_layer",
    "route",
]
