"""The ``tl-geometry`` command line: ``run``, ``sparsify`` and ``report`` (``tl-geometry --help``).

``main`` loads :mod:`tl_geometry.cli.app` on first use, so ``python -m tl_geometry.cli.app`` runs
it once, as ``__main__``.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tl_geometry.cli.app import main


def __getattr__(name: str) -> Any:
    if name == "main":
        return import_module("tl_geometry.cli.app").main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["main"]
