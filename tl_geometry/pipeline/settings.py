"""``AnalysisSettings``: every setting of :func:`tl_geometry.analyze`, checked once, before any work.

One frozen dataclass holds what ``analyze`` measures and how: the selection sizes, the query
positions, the layers, the precision, and which of the optional analyses run. Building it checks
and normalises every field (numpy integers become ints, lists become sorted tuples without
duplicates, ``None`` for ``ns`` becomes ``"all"``) and raises one :class:`~tl_geometry.errors.InputError`
naming the setting and the fix, before a model is loaded or run. The command line builds it from
its options, ``analyze`` from its keywords; the run store compares it to resume, and ``run.json``
records it (:meth:`AnalysisSettings.to_dict` / :meth:`AnalysisSettings.from_dict`).

What depends on the model or the corpus (layers that exist, positions inside the window, ``N``
at most ``K``) is checked by :meth:`AnalysisSettings.resolve` once those are known, still before
the first forward pass.

Adding a setting takes one field with a default and ``metadata=setting(check, ...)``: ``check``
turns any accepted input (the Python value or its JSON form from :meth:`to_dict`) into the
normalised value or raises :class:`InputError`; ``encode`` (default: the value itself) gives
the JSON form; ``identity=False`` marks a setting that does not change the results (it is not
compared when resuming); ``needs="bounds"`` marks one that matters only when that switch is on.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from tl_geometry.capture.hooks import resolve_query_positions
from tl_geometry.core.rankings import DEFAULT_N_RANDOM, check_distance, check_n_random, check_rankings, check_seed
from tl_geometry.core.sizes import resolve_ns
from tl_geometry.errors import InputError
from tl_geometry.io.store import describe_differences
from tl_geometry.theory.bounds import SimilarityModel, resolve_rho

#: Precisions the separability computation runs in (the model itself may run in any dtype).
DTYPES = {"torch.float64": torch.float64, "torch.float32": torch.float32}


def setting(
    check: Callable[[Any], Any],
    encode: Callable[[Any], Any] | None = None,
    *,
    identity: bool = True,
    needs: str | None = None,
) -> dict[str, Any]:
    """Field metadata of an :class:`AnalysisSettings` field (see the module docstring).

    Parameters
    ----------
    check : callable
        Input value -> normalised value; raises :class:`InputError` on a bad value.
    encode : callable, optional
        Normalised value -> its JSON form (default: unchanged). ``check`` must accept that form.
    identity : bool, default True
        Whether the setting changes the results (compared when a saved run is resumed).
    needs : str, optional
        Name of a boolean setting without which this one has no effect (not compared then).
    """
    return {"check": check, "encode": encode or (lambda v: v), "identity": identity, "needs": needs}


# ----------------------------------------------------------------------------- scalar checks


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


def _positive_int(what: str) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        out = as_int(value, what)
        if out < 1:
            raise InputError(f"{what} must be a positive integer, got {value!r}")
        return out

    return check


def _flag(what: str) -> Callable[[Any], bool]:
    return lambda value: as_bool(value, what)


def _ints(values: Any, what: str) -> tuple[int, ...]:
    """A sequence (list, tuple, 1-D array or tensor) of integers as a tuple of ints, in order."""
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    elif isinstance(values, np.ndarray):
        values = values.tolist() if values.dtype != np.bool_ else list(values)
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InputError(f"{what} must be a list of integers, got {values!r}")
    if len(values) == 0:
        raise InputError(f"{what} is empty: give at least one value")
    return tuple(as_int(v, f"every entry of {what}") for v in values)


# ----------------------------------------------------------------------------- field checks


def _check_ns(value: Any) -> str | tuple[int, ...]:
    if value is None:
        return "all"
    if isinstance(value, str):
        if value not in ("all", "log"):
            raise InputError(f"ns={value!r} is not understood: use None/'all' (every N), 'log', or a list of ints")
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        value = [value]
    sizes = _ints(value, "ns")
    bad = [n for n in sizes if n < 1]
    if bad:
        raise InputError(f"ns must hold sizes N >= 1, got {bad[:5]}")
    return tuple(sorted(set(sizes)))


def _check_query_positions(value: Any) -> str | range | slice | tuple[int, ...]:
    if isinstance(value, str):
        if value not in AnalysisSettings.QUERY_WORDS:
            words = " or ".join(repr(w) for w in AnalysisSettings.QUERY_WORDS)
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
        return range(*_ints(value["range"], "query_positions range"))
    if isinstance(value, Mapping) and set(value) == {"slice"}:
        return slice(*value["slice"])
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return (int(value),)
    return tuple(sorted(set(_ints(value, "query_positions"))))


def _encode_query_positions(value: Any) -> Any:
    if isinstance(value, range):
        return {"range": [value.start, value.stop, value.step]}
    if isinstance(value, slice):
        return {"slice": [value.start, value.stop, value.step]}
    return value if isinstance(value, str) else list(value)


def _check_layers(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        value = [value]
    layers = tuple(sorted(set(_ints(value, "layers"))))
    bad = [layer for layer in layers if layer < 0]
    if bad:
        raise InputError(f"layers {bad} do not exist: layers are numbered from 0")
    return layers


def _check_dtype(value: Any) -> torch.dtype:
    name = str(value)
    if not name.startswith("torch."):
        name = "torch." + name
    if name not in DTYPES:
        raise InputError(
            f"dtype={value!r} is not supported: use torch.float64 (default) or torch.float32 (the precision of the "
            "computation; the model itself may run in any dtype)"
        )
    return DTYPES[name]


def _check_k_max(value: Any) -> int | None:
    return None if value is None else _positive_int("k_max")(value)


def _check_kappa(value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise InputError(f"kappa must be a positive number, got {value!r}")
    out = float(value)
    if not (math.isfinite(out) and out > 0):
        raise InputError(f"kappa must be a positive finite number, got {value!r}")
    return out


def _check_rho(value: Any) -> str | SimilarityModel:
    if isinstance(value, list):  # the JSON form of ("model", beta, rho_0)
        value = tuple(value)
    model = resolve_rho(value)
    return "measured" if model is None else model


def _encode_rho(value: Any) -> Any:
    return value if isinstance(value, str) else ["model", value.beta, value.rho_0]


def _encode_ints(value: Any) -> Any:
    return value if value is None or isinstance(value, str) else list(value)


# ----------------------------------------------------------------------------- the settings


@dataclass(frozen=True)
class AnalysisSettings:
    """Every setting of :func:`tl_geometry.analyze`, checked and normalised at construction.

    Parameters
    ----------
    ns : None, "all", "log" or list of int, default "log"
        Selection sizes ``N``; a list is sorted and de-duplicated, None becomes ``"all"``.
    query_positions : "last", int, list of int, range or slice, default "last"
        Query rows to analyse (negative positions count from the end of the window).
    layers : list of int or int, optional
        Layers to analyse (default all); sorted and de-duplicated.
    batch_size : int, default 4
        Windows per forward pass (does not change the results).
    dtype : torch.float64 or torch.float32, default torch.float64
        Precision of the computation.
    diagnostics : bool, default False
        Also accumulate the assumption diagnostics.
    k_max : int or None, default 64
        Largest lag of ``c(k)`` (with ``diagnostics``).
    taxonomy : bool, default True
        Also accumulate the regime features of every head.
    bounds : bool, default False
        Also compute the envelopes of Theorems 1-2.
    kappa : float, default 0.5
        The bounds' concentration constant (positive, finite; with ``bounds``).
    rho : "measured", SimilarityModel or ("model", beta, rho_0), default "measured"
        Source of the cosines in the bounds (with ``bounds``).
    rank_by : str or list of str, default ("attention",)
        The rankings of the separability table (definitions §7): ``"attention"``,
        ``"contribution"``, ``"random"`` (the control), ``"sink_window"``; duplicates dropped, order kept.
    distance : "euclidean" or "cosine", default "euclidean"
        The distance of the separability table (definitions §7).
    n_random : int, default 16
        Random draws per row (with ``"random"`` in ``rank_by``).
    seed : int, default 0
        Seed of the random draws (with ``"random"`` in ``rank_by``).

    Examples
    --------
    >>> s = AnalysisSettings(ns=[4, 1, 2, 2], layers=1, kappa=2)
    >>> s.ns, s.layers, s.kappa
    ((1, 2, 4), (1,), 2.0)
    >>> AnalysisSettings.from_dict(s.to_dict()) == s
    True
    >>> s.differences(AnalysisSettings(ns=[1, 2, 4], layers=[1], batch_size=8))
    []
    >>> s.differences(AnalysisSettings(ns="log", layers=[1]))
    ['ns ([1, 2, 4] vs log)']
    """

    #: The words ``query_positions`` accepts besides positions.
    QUERY_WORDS = ("last", "all")

    ns: Any = field(default="log", metadata=setting(_check_ns, _encode_ints))
    query_positions: Any = field(default="last", metadata=setting(_check_query_positions, _encode_query_positions))
    layers: Any = field(default=None, metadata=setting(_check_layers, _encode_ints))
    batch_size: int = field(default=4, metadata=setting(_positive_int("batch_size"), identity=False))
    dtype: torch.dtype = field(default=torch.float64, metadata=setting(_check_dtype, str))
    diagnostics: bool = field(default=False, metadata=setting(_flag("diagnostics")))
    k_max: int | None = field(default=64, metadata=setting(_check_k_max, needs="diagnostics"))
    taxonomy: bool = field(default=True, metadata=setting(_flag("taxonomy")))
    bounds: bool = field(default=False, metadata=setting(_flag("bounds")))
    kappa: float = field(default=0.5, metadata=setting(_check_kappa, needs="bounds"))
    rho: Any = field(default="measured", metadata=setting(_check_rho, _encode_rho, needs="bounds"))
    rank_by: Any = field(default=("attention",), metadata=setting(check_rankings, list))
    distance: str = field(default="euclidean", metadata=setting(check_distance))
    n_random: int = field(default=DEFAULT_N_RANDOM, metadata=setting(check_n_random, needs="random_control"))
    seed: int = field(default=0, metadata=setting(check_seed, needs="random_control"))

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, f.metadata["check"](getattr(self, f.name)))
        if self.bounds and "attention" not in self.rank_by:
            raise InputError(
                f"bounds=True needs rank_by to include 'attention' (the bounds are for attention selection), "
                f"got rank_by={list(self.rank_by)}"
            )

    @property
    def random_control(self) -> bool:
        """Whether ``rank_by`` holds the random control (then ``n_random`` and ``seed`` matter)."""
        return "random" in self.rank_by

    # ------------------------------------------------------------------ JSON form
    def to_dict(self) -> dict[str, Any]:
        """Every setting in its JSON form (``json.dumps``-able); :meth:`from_dict` reads it back."""
        return {f.name: f.metadata["encode"](getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AnalysisSettings":
        """Settings from :meth:`to_dict` (missing keys take their defaults; unknown keys are an error)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"unknown analysis settings {unknown}; known: {sorted(known)}")
        return cls(**dict(data))

    # ------------------------------------------------------------------ comparing runs
    def identity(self) -> dict[str, Any]:
        """The JSON form of the settings that change the results (what a resumed run must share)."""
        out = {}
        for f in fields(self):
            needs = f.metadata["needs"]
            if f.metadata["identity"] and (needs is None or getattr(self, needs)):
                out[f.name] = f.metadata["encode"](getattr(self, f.name))
        return out

    def differences(self, other: "AnalysisSettings | Mapping[str, Any]") -> list[str]:
        """``"name (mine vs theirs)"`` for every result-changing setting that differs from ``other``."""
        theirs = other.identity() if isinstance(other, AnalysisSettings) else dict(other)
        return describe_differences(self.identity(), theirs)

    # ------------------------------------------------------------------ against a model and corpus
    def resolve(self, n_layers: int, seq_len: int) -> tuple[list[int], tuple[int, ...]]:
        """The layers and query positions for a model of ``n_layers`` layers and windows of ``seq_len``.

        Checks that the layers exist, the positions lie inside the window and every ``N`` fits the
        rows of every position (``N <= q + 1``); raises :class:`InputError` otherwise.
        """
        layers = list(range(n_layers)) if self.layers is None else list(self.layers)
        bad = [layer for layer in layers if layer >= n_layers]
        if bad:
            raise InputError(f"layers {bad} do not exist: the model has layers 0..{n_layers - 1}")
        queries = resolve_query_positions(self.query_positions, seq_len)
        for q in queries:
            resolve_ns(self.ns, q + 1)
        return layers, queries


__all__ = ["AnalysisSettings", "DTYPES", "as_bool", "as_int", "setting"]
