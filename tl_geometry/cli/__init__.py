"""The ``tl-geometry`` command line: ``run``, ``sparsify`` and ``report`` (``tl-geometry --help``)."""

from tl_geometry.cli.app import main

__all__ = ["main"]
