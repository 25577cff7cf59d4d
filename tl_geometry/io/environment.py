"""The versions of the packages a result depends on (recorded by ``tl-geometry run``, shown by reports)."""

from __future__ import annotations

import platform
from importlib import metadata

#: Packages whose versions are recorded and shown.
VERSION_PACKAGES = ("tl-geometry", "transformer-lens", "torch", "transformers", "pandas", "plotly", "circuitsvis")


def package_version() -> str:
    """tl_geometry's version (``tl_geometry.__version__``), as the files a run writes record it.

    Examples
    --------
    >>> import tl_geometry
    >>> package_version() == tl_geometry.__version__
    True
    """
    try:  # the version lives in pyproject.toml only; an installed package (editable too) carries it
        return metadata.version("tl-geometry")
    except metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
        return "0+unknown"


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
