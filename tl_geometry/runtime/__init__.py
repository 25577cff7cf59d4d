"""The process's tuning, apart from the maths: torch's CPU threads, glibc's allocator, reusable
work tensors and the memory budget.

Below ``core/`` (which may use them) and above the base modules; nothing here knows a model or a
metric.

* :mod:`~tl_geometry.runtime.threads` — torch's CPU threads during an analysis: the CPUs free now;
* :mod:`~tl_geometry.runtime.allocator` — glibc keeps freed memory (no page faults per layer);
* :mod:`~tl_geometry.runtime.workspace` — reusable per-thread work tensors (no fresh pages per call);
* :mod:`~tl_geometry.runtime.budget` — the memory budget a user's sizes are checked against.
"""
