"""The versions of the packages a result depends on (recorded by ``tl-geometry run``, shown by reports)."""

from __future__ import annotations

import platform
from importlib import metadata

#: Packages whose versions are recorded and shown.
VERSION_PACKAGES = ("tl-geometry", "transformer-lens", "torch", "transformers", "pandas", "plotly", "circuitsvis")


def installed_versions() -> dict[str, str | None]:
    """Versions of :data:`VERSION_PACKAGES` installed now (None when missing), and Python's.

    Examples
    --------
    >>> versions = installed_versions()
    >>> sorted(versions) == sorted(VERSION_PACKAGES + ("python",))
    True
    """
    out: dict[str, str | None] = {}
    for name in VERSION_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    out["python"] = platform.python_version()
    return out
