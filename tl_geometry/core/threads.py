"""Moved to :mod:`tl_geometry.runtime.threads` (the process's tuning left ``core/``); the same names.

>>> from tl_geometry.core.threads import analysis_threads
>>> from tl_geometry.runtime import threads
>>> analysis_threads is threads.analysis_threads
True
"""

from tl_geometry.runtime.threads import (
    FREE_SLACK,
    REUSE_SECONDS,
    SAMPLE_SECONDS,
    THREAD_VARIABLES,
    TORCH_DEFAULT_THREADS,
    analysis_threads,
    busy_cpus,
    free_threads,
    own_cpus,
    user_chose_threads,
)

__all__ = [
    "FREE_SLACK",
    "REUSE_SECONDS",
    "SAMPLE_SECONDS",
    "THREAD_VARIABLES",
    "TORCH_DEFAULT_THREADS",
    "analysis_threads",
    "busy_cpus",
    "free_threads",
    "own_cpus",
    "user_chose_threads",
]
