"""Phases of the selection size N under the piecewise attention profile (paper Table 2).

Given the profile of Assumption 3 (definitions §3), every key falls in a segment (``sink``,
``plateau``, ``peak``, ``valley``, ``tail``); with ``rank(i)`` its place in the stable top-N order,
three boundaries ``m1 <= m2 <= m3`` (the first ``N`` holding a peak, the ``p_base`` level, and
everything at or above ``p_base``) cut ``N`` into the phases::

    I: N = 1    II: 1 < N < m1    III: m1 <= N < m2    IV: m2 <= N < m3    V: N >= m3

("regime" is kept for the head taxonomy). A phase can be empty. Definitions of the segments and
boundaries: docs/theory.md §5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry.core.rankings import selection_order
from tl_geometry.core.sizes import DEFAULT_NS, NsLike, resolve_ns
from tl_geometry.errors import InputError

#: Segments of the profile a key can fall in.
SEGMENTS = ("sink", "plateau", "peak", "valley", "tail")
#: Phases of ``N`` (Table 2), in order of increasing ``N``.
PHASES = ("I", "II", "III", "IV", "V")


@dataclass(frozen=True)
class PiecewiseProfile:
    """Parameters of the piecewise attention profile (Assumption 3) for a row of ``n_keys`` keys.

    Attributes
    ----------
    p_sink, p_base : float
        Weight of the sink and of the plateau.
    eta_osc, omega : float
        Amplitude and angular frequency of the oscillation on ``T1 < i <= T2``.
    eta_exp : float
        Growth rate of the tail ``i > T2``.
    t1, t2 : int
        End of the plateau and start of the tail, ``0 <= t1 <= t2 <= n_keys - 1``.
    n_keys : int
        ``K``.
    """

    p_sink: float
    p_base: float
    eta_osc: float
    omega: float
    eta_exp: float
    t1: int
    t2: int
    n_keys: int

    def __post_init__(self) -> None:
        if self.n_keys < 1:
            raise InputError(f"n_keys must be >= 1, got {self.n_keys}")
        if not 0 <= self.t1 <= self.t2 <= self.n_keys - 1:
            raise InputError(f"need 0 <= t1 <= t2 <= n_keys - 1, got t1={self.t1}, t2={self.t2}, n_keys={self.n_keys}")
        if not (self.p_base > 0 and self.p_sink >= 0):
            raise InputError(f"need p_base > 0 and p_sink >= 0, got p_base={self.p_base}, p_sink={self.p_sink}")
        for name in ("p_sink", "p_base", "eta_osc", "omega", "eta_exp"):
            if not math.isfinite(getattr(self, name)):
                raise InputError(f"{name} must be finite, got {getattr(self, name)!r}")

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | Any, n_keys: int | None = None) -> "PiecewiseProfile":
        """Build from a fit result: a mapping, an object with attributes, or a DataFrame row.

        Reads ``p_sink``, ``p_base``, ``omega``, ``t1``/``T1``, ``t2``/``T2``, ``eta_osc`` and
        ``eta_exp`` (either may be replaced by a single tied ``eta``, the paper's form), and
        ``n_keys`` when not given. A NaN ``eta_osc``/``omega`` (no oscillation, ``T1 = T2``) or
        ``eta_exp`` (no recency segment, ``T2 = K - 1``) is read as 0, which is exact since that
        segment holds no key (the row summaries of :mod:`tl_geometry.diagnostics` use NaN so).
        """

        def get(*names: str) -> Any:
            for name in names:
                if isinstance(params, Mapping) and name in params:
                    return params[name]
                if not isinstance(params, Mapping) and hasattr(params, name):
                    return getattr(params, name)
            raise InputError(f"profile parameters lack {' / '.join(names)}")

        def finite_or_zero(value: Any) -> float:
            value = float(value)
            return 0.0 if math.isnan(value) else value

        k_keys = int(get("n_keys")) if n_keys is None else int(n_keys)
        t1, t2 = int(get("t1", "T1")), int(get("t2", "T2"))
        eta_osc, omega, eta_exp = float(get("eta_osc", "eta")), float(get("omega")), float(get("eta_exp", "eta"))
        if t1 == t2:
            eta_osc, omega = finite_or_zero(eta_osc), finite_or_zero(omega)
        if t2 >= k_keys - 1:
            eta_exp = finite_or_zero(eta_exp)
        return cls(
            p_sink=float(get("p_sink")),
            p_base=float(get("p_base")),
            eta_osc=eta_osc,
            omega=omega,
            eta_exp=eta_exp,
            t1=t1,
            t2=t2,
            n_keys=k_keys,
        )

    def weights(self, dtype: torch.dtype = torch.float64) -> Float[Tensor, " k"]:
        """``alpha_i`` for ``i = 0..K-1`` (not normalised)."""
        i = torch.arange(self.n_keys, dtype=dtype)
        out = torch.full_like(i, self.p_base)
        osc = (i > self.t1) & (i <= self.t2)
        out = torch.where(osc, self.p_base * (1 + self.eta_osc * torch.cos(self.omega * i)), out)
        out = torch.where(i > self.t2, self.p_base * torch.exp(self.eta_exp * (i - self.t2)), out)
        out[0] = self.p_sink
        return out

    def normalised(self) -> "PiecewiseProfile":
        """The same shape with ``p_sink`` and ``p_base`` scaled so the weights sum to 1."""
        total = float(self.weights().sum())
        return replace(self, p_sink=self.p_sink / total, p_base=self.p_base / total)

    def segments(self) -> np.ndarray:
        """Segment name of every key (``sink, plateau, peak, valley, tail``), shape [K]."""
        i = np.arange(self.n_keys)
        alpha = self.weights().numpy()
        out = np.full(self.n_keys, "plateau", dtype=object)
        osc = (i > self.t1) & (i <= self.t2)
        out[osc & (alpha > self.p_base)] = "peak"
        out[osc & (alpha <= self.p_base)] = "valley"
        out[i > self.t2] = "tail"
        out[0] = "sink"
        return out


def _ranks(profile: PiecewiseProfile) -> np.ndarray:
    order = selection_order(profile.weights()).numpy()
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return rank


def phase_boundaries(profile: PiecewiseProfile) -> tuple[int, int, int]:
    """``(m1, m2, m3)`` of Table 2 as defined in the module docstring."""
    k_keys = profile.n_keys
    rank = _ranks(profile)
    alpha = profile.weights().numpy()
    segment = profile.segments()
    content = np.arange(k_keys) >= 1
    never = k_keys + 1
    at_or_below = content & (alpha <= profile.p_base)
    m2 = int(rank[at_or_below].min()) + 1 if at_or_below.any() else never
    peaks = segment == "peak"
    m1 = min(int(rank[peaks].min()) + 1, m2) if peaks.any() else m2
    at_or_above = content & (alpha >= profile.p_base)
    m3 = max(m2, int(rank[at_or_above].max()) + 1) if at_or_above.any() else m2
    m3 = min(m3, never)
    return m1, m2, m3


def size_phases(profile: PiecewiseProfile, ns: NsLike = DEFAULT_NS) -> pd.DataFrame:
    """Label every ``N`` with its phase (Table 2) and count the segments ``I_N`` draws from.

    Parameters
    ----------
    profile : PiecewiseProfile
        The fitted profile (use :meth:`PiecewiseProfile.from_params` on a fit result).
    ns : selection sizes (see :func:`tl_geometry.core.sizes.resolve_ns`), default ``"log"``.

    Returns
    -------
    DataFrame
        One row per ``N``: ``n``, ``phase`` (``I``..``V``), ``alpha_n`` (the ``N``-th largest
        weight), ``n_sink, n_plateau, n_peak, n_valley, n_tail`` (how many keys of each segment
        ``I_N`` holds). ``attrs["m1"], attrs["m2"], attrs["m3"]`` hold the boundaries.
    """
    ns_t = resolve_ns(ns, profile.n_keys).numpy()
    m1, m2, m3 = phase_boundaries(profile)
    rank = _ranks(profile)
    segment = profile.segments()
    sorted_alpha = np.sort(profile.weights().numpy())[::-1]
    phase = np.select([ns_t == 1, ns_t < m1, ns_t < m2, ns_t < m3], ["I", "II", "III", "IV"], default="V")
    cols: dict[str, Any] = {"n": ns_t, "phase": phase, "alpha_n": sorted_alpha[ns_t - 1]}
    for name in SEGMENTS:
        ranks_of_segment = np.sort(rank[segment == name])
        cols[f"n_{name}"] = np.searchsorted(ranks_of_segment, ns_t, side="left")  # #{rank < N}
    out = pd.DataFrame(cols)
    out.attrs.update({"m1": m1, "m2": m2, "m3": m3})
    return out
