"""Keep freed memory in the process, instead of handing it back to the OS and faulting it in again.

glibc's ``malloc`` serves every block above a threshold (128 KiB, raised up to 32 MiB as blocks are
freed) with a fresh ``mmap`` and unmaps it on ``free``, and gives the top of its heap back beyond
another threshold. A forward pass allocates and frees hundreds of MiB per layer in such blocks,
so every 4 KiB page of them is faulted in and zeroed by the kernel again, on every layer of every
window: SmolLM2's forward pass of 2 x 1024 tokens took 10.0 s, against 7.0 s with freed blocks
kept (docs/performance.md, "Freed memory"). :func:`keep_freed_memory` sets both thresholds to
:data:`KEEP_BYTES`::

    mallopt(M_MMAP_THRESHOLD, KEEP_BYTES); mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)

so freed blocks below 1 GiB are reused. The live memory is the same, but the heap keeps what a peak
freed, and fragments: peak RSS is a few tens of MiB higher. ``tl-geometry`` calls it at start (it
owns its process); in a notebook, call it yourself. A user's choice wins: with a ``MALLOC_*_``
variable or ``GLIBC_TUNABLES`` naming ``glibc.malloc`` in the environment, nothing is changed.
Without glibc (macOS, Windows, musl) it does nothing.

Example::

    from tl_geometry.runtime.allocator import keep_freed_memory
    keep_freed_memory()  # True where glibc's thresholds were set
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

#: Blocks up to this size are served from the heap and kept when freed (glibc's ``mallopt`` takes an ``int``).
KEEP_BYTES = 1 << 30

#: ``mallopt`` parameters of glibc's ``malloc.h``.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: The environment variables with which a user tunes glibc's ``malloc`` (then it is never changed).
MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def has_glibc() -> bool:
    """Whether this process runs on Linux with glibc, whose ``malloc`` :func:`keep_freed_memory` tunes."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def user_tuned_malloc(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment tunes glibc's ``malloc``: a :data:`MALLOC_VARIABLES` variable, or
    ``GLIBC_TUNABLES`` naming a ``glibc.malloc`` tunable.

    >>> user_tuned_malloc({}), user_tuned_malloc({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"})
    (False, True)
    """
    environ = os.environ if environ is None else environ
    return any(environ.get(v) for v in MALLOC_VARIABLES) or "glibc.malloc." in environ.get("GLIBC_TUNABLES", "")


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds to :data:`KEEP_BYTES`; returns whether they were set.

    False, and nothing changed, without glibc or where the user tuned ``malloc``
    (:func:`user_tuned_malloc`).
    """
    if not has_glibc() or user_tuned_malloc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))


__all__ = ["KEEP_BYTES", "MALLOC_VARIABLES", "has_glibc", "keep_freed_memory", "user_tuned_malloc"]
