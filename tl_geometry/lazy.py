"""A package's names that load their module on first use (PEP 562 ``__getattr__``).

``import tl_geometry`` and ``tl-geometry --help`` then import neither torch nor pandas: a package
lists where each public name lives, and the module is imported when the name is first read.

Examples
--------
>>> namespace = {"__name__": "example"}
>>> getattr_ = lazy_names(namespace, {"sqrt": "math"})
>>> getattr_("sqrt")(9.0), "sqrt" in namespace   # imported on first use, then kept
(3.0, True)
"""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable, Mapping, MutableMapping


def lazy_names(namespace: MutableMapping[str, Any], homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of a package whose names load on first use.

    Parameters
    ----------
    namespace : the package's ``globals()``
        Where a loaded name is stored, so later lookups do not come back here.
    homes : mapping of str to str
        Each public name and the module that holds it.
    """

    def __getattr__(name: str) -> Any:
        if name in homes:
            value = getattr(import_module(homes[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")

    return __getattr__


__all__ = ["lazy_names"]
