"""The memory budget: a size a user gives is checked against what it will allocate, before allocating.

One computation (a call of :func:`~tl_geometry.core.separability.separability`, one forward batch
of the analysis or of the intervention) may hold at most :func:`memory_budget` bytes: half the
machine's memory, or what the environment variable ``TL_GEOMETRY_MEMORY_BUDGET`` says (bytes, or a
number with a unit: ``500MB``, ``16GiB``). Beyond it, :func:`check_memory` raises one
:class:`~tl_geometry.errors.InputError` that names the size to lower, instead of an allocation
the kernel's out-of-memory killer ends.

>>> check_memory(10**18, "the random draws of 4 rows", "lower n_random")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
tl_geometry.errors.InputError: the random draws of 4 rows would take about 909494.7 TiB, more than the memory budget of ...
"""

from __future__ import annotations

import os
import re

from tl_geometry.errors import InputError

#: The environment variable that sets the budget (bytes, or a number and a unit such as ``16GiB``).
BUDGET_VARIABLE = "TL_GEOMETRY_MEMORY_BUDGET"
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS.update({"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40})


def parse_bytes(text: str) -> int:
    """``"16GiB"``, ``"500 MB"``, ``"1e9"`` as a number of bytes (``>= 1``)."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    try:
        value = float(match.group(1)) * _UNITS[unit] if match else float("nan")
    except (KeyError, ValueError):
        value = float("nan")
    if not 1 <= value < 2**63:  # NaN and infinity (1e400) too
        raise InputError(
            f"{BUDGET_VARIABLE}={text!r} is not a size: give bytes or a number and a unit, e.g. 16GiB or 500MB"
        )
    return int(value)


def memory_budget() -> int:
    """The budget in bytes: ``TL_GEOMETRY_MEMORY_BUDGET`` if set, else half the machine's memory."""
    given = os.environ.get(BUDGET_VARIABLE)
    if given:
        return parse_bytes(given)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not a POSIX system
        return 8 << 30


def format_bytes(n_bytes: float) -> str:
    """``1536`` → ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n_bytes) < 1024:
            return f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024
    return f"{n_bytes:.1f} TiB"


def check_memory(n_bytes: float, what: str, fix: str) -> None:
    """Raise :class:`InputError` if ``what`` (needing ``n_bytes``) exceeds :func:`memory_budget`.

    Parameters
    ----------
    n_bytes : float
        What the computation will hold at once (an estimate from the sizes given).
    what : str
        The computation, as the user knows it ("the random draws of 12 rows").
    fix : str
        How to split the work ("lower n_random, or pass fewer rows per call").
    """
    budget = memory_budget()
    if n_bytes > budget:
        raise InputError(
            f"{what} would take about {format_bytes(n_bytes)}, more than the memory budget of {format_bytes(budget)}: "
            f"{fix} (or raise the budget with the environment variable {BUDGET_VARIABLE}, e.g. 32GiB)"
        )


__all__ = ["BUDGET_VARIABLE", "check_memory", "format_bytes", "memory_budget", "parse_bytes"]
