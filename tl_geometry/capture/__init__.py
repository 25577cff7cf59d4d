"""What a forward pass hands to the analyses: hooks, the observer protocol and the row tables.

* :mod:`~tl_geometry.capture.hooks` — :func:`run_streaming` feeds each layer's values and
  attention (a :class:`LayerBatch`) to observers, layer by layer, without keeping a cache;
* :mod:`~tl_geometry.capture.cached` — :func:`run_cached` feeds the same batches from an
  ``ActivationCache`` the user already has;
* :mod:`~tl_geometry.capture.observers` — the :class:`Observer` protocol and the separability
  observer;
* :mod:`~tl_geometry.capture.tables` — the key columns and helpers of the tidy row tables.
"""

from tl_geometry.capture.cached import run_cached
from tl_geometry.capture.hooks import LayerBatch, forward_with_hooks, model_device, run_streaming
from tl_geometry.capture.observers import Observer, RowObserver, SeparabilityObserver

__all__ = [
    "run_cached",
    "LayerBatch",
    "Observer",
    "RowObserver",
    "SeparabilityObserver",
    "forward_with_hooks",
    "model_device",
    "run_streaming",
]
