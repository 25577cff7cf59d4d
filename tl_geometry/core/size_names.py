"""The default grid of selection sizes, by name: importable without torch (for the command line's help).

>>> DEFAULT_NS
'log'
"""

#: The selection sizes every function that takes ``ns`` uses by default, ``analyze`` included: the
#: log-spaced grid of :func:`tl_geometry.core.sizes.log_spaced_ns` (every ``N <= 8``, then 4 per
#: doubling, and ``N = K``). One default, so that a table made by hand and one made by ``analyze``
#: hold the same sizes.
DEFAULT_NS = "log"

__all__ = ["DEFAULT_NS"]
