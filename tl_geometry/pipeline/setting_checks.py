"""How each analysis setting's value is checked and written as JSON, before any work.

A check turns any accepted input (the Python value, or the JSON form an ``encode`` wrote) into the
normalised value, or raises one :class:`~tl_geometry.errors.InputError` naming the setting and the
fix. :class:`~tl_geometry.pipeline.settings.AnalysisSettings` attaches one check (and encoding) to
each of its fields.

Examples
--------
>>> check_ns([4, 1, 2, 2]), check_ns(None), check_layers(3)
((1, 2, 4), 'all', (3,))
>>> check_kappa(float("nan"))
Traceback (most recent call last):
...
tl_geometry.errors.InputError: kappa must be a positive finite number, got nan
"""

from __future__ import annotations

import importlib.util
import math
import numbers
import sys
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from tl_geometry.errors import InputError

if TYPE_CHECKING:  # torch and the bounds load with the first settings built, not with this module
    import torch

    from tl_geometry.theory.bounds import SimilarityModel

#: Precisions the separability computation runs in (the model itself may run in any dtype).
DTYPES = ("torch.float64", "torch.float32")
#: The words ``query_positions`` accepts besides positions.
QUERY_WORDS = ("last", "all")
#: How the separability screen may run: the compiled numba pass where numba imports ("auto"), or one
#: of the two by name.
KERNELS = ("auto", "numba", "torch")


def as_int(value: Any, what: str) -> int:
    """``value`` as a Python int: ints and numpy integers, not bools, floats or strings."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise InputError(f"{what} must be an integer, got {value!r} ({type(value).__name__})")
    return int(value)


def as_bool(value: Any, what: str) -> bool:
    """``value`` as a Python bool: True/False (or numpy bools) only."""
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{what} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def positive_int(what: str) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        out = as_int(value, what)
        if out < 1:
            raise InputError(f"{what} must be a positive integer, got {value!r}")
        return out

    return check


def flag(what: str) -> Callable[[Any], bool]:
    return lambda value: as_bool(value, what)


def ints(values: Any, what: str) -> tuple[int, ...]:
    """A sequence (list, tuple, 1-D array or tensor) of integers as a tuple of ints, in order."""
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
    if torch is not None and isinstance(values, torch.Tensor):
        values = values.tolist()
    elif isinstance(values, np.ndarray):
        values = values.tolist() if values.dtype != np.bool_ else list(values)
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InputError(f"{what} must be a list of integers, got {values!r}")
    if len(values) == 0:
        raise InputError(f"{what} is empty: give at least one value")
    return tuple(as_int(v, f"every entry of {what}") for v in values)


def check_ns(value: Any) -> str | tuple[int, ...]:
    if value is None:
        return "all"
    if isinstance(value, str):
        if value not in ("all", "log"):
            raise InputError(f"ns={value!r} is not understood: use None/'all' (every N), 'log', or a list of ints")
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        value = [value]
    sizes = ints(value, "ns")
    bad = [n for n in sizes if n < 1]
    if bad:
        raise InputError(f"ns must hold sizes N >= 1, got {bad[:5]}")
    return tuple(sorted(set(sizes)))


def check_query_positions(value: Any) -> str | range | slice | tuple[int, ...]:
    if isinstance(value, str):
        if value not in QUERY_WORDS:
            words = " or ".join(repr(w) for w in QUERY_WORDS)
            raise InputError(f"query_positions={value!r} is not understood: use {words}, an int, a list or a range")
        return value
    if isinstance(value, range):
        if len(value) == 0:
            raise InputError(f"query_positions={value!r} is empty: give at least one position")
        return value
    if isinstance(value, slice):
        for part in (value.start, value.stop, value.step):
            if part is not None:
                as_int(part, "every part of the query_positions slice")
        return value
    if isinstance(value, Mapping) and set(value) == {"range"}:  # the JSON form of a range
        return range(*ints(value["range"], "query_positions range"))
    if isinstance(value, Mapping) and set(value) == {"slice"}:
        return slice(*value["slice"])
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return (int(value),)
    return tuple(sorted(set(ints(value, "query_positions"))))


def encode_query_positions(value: Any) -> Any:
    if isinstance(value, range):
        return {"range": [value.start, value.stop, value.step]}
    if isinstance(value, slice):
        return {"slice": [value.start, value.stop, value.step]}
    return value if isinstance(value, str) else list(value)


def check_layers(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        value = [value]
    layers = tuple(sorted(set(ints(value, "layers"))))
    bad = [layer for layer in layers if layer < 0]
    if bad:
        raise InputError(f"layers {bad} do not exist: layers are numbered from 0")
    return layers


def check_dtype(value: Any) -> torch.dtype:
    import torch

    name = str(value)
    if not name.startswith("torch."):
        name = "torch." + name
    if name not in DTYPES:
        raise InputError(
            f"dtype={value!r} is not supported: use torch.float64 (default) or torch.float32 (the precision of the "
            "computation; the model itself may run in any dtype)"
        )
    return getattr(torch, name.removeprefix("torch."))


def check_kernel(value: Any) -> str:
    if value not in KERNELS:
        raise InputError(
            f"kernel={value!r} is not supported: use 'auto' (default: numba where it is installed), "
            "'numba' (the compiled screen) or 'torch' (the batched tensor route)"
        )
    if value == "numba" and importlib.util.find_spec("numba") is None:
        raise InputError("kernel='numba' needs numba, which is not installed: pip install numba, or use kernel='torch'")
    return str(value)


def check_k_max(value: Any) -> int | None:
    return None if value is None else positive_int("k_max")(value)


def check_kappa(value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise InputError(f"kappa must be a positive number, got {value!r}")
    out = float(value)
    if not (math.isfinite(out) and out > 0):
        raise InputError(f"kappa must be a positive finite number, got {value!r}")
    return out


def check_rho(value: Any) -> str | SimilarityModel:
    if isinstance(value, str) and value == "measured":
        return value
    from tl_geometry.theory.bounds import resolve_rho

    if isinstance(value, list):  # the JSON form of ("model", beta, rho_0)
        value = tuple(value)
    model = resolve_rho(value)
    return "measured" if model is None else model


def encode_rho(value: Any) -> Any:
    return value if isinstance(value, str) else ["model", value.beta, value.rho_0]


def encode_ints(value: Any) -> Any:
    return value if value is None or isinstance(value, str) else list(value)


__all__ = [
    "DTYPES",
    "QUERY_WORDS",
    "as_bool",
    "as_int",
    "check_dtype",
    "check_k_max",
    "check_kappa",
    "check_layers",
    "check_ns",
    "check_query_positions",
    "check_rho",
    "encode_ints",
    "encode_query_positions",
    "encode_rho",
    "flag",
    "ints",
    "positive_int",
]
