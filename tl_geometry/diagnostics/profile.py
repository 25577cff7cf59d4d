"""The attention-weight profile of Assumption 3 (definitions §3, paper §3.3, Fig. 4).

Columns: docs/columns.md#attention_profile.

Per query head, the weights of one query row (keys ``0..q``) are **averaged over sequences**
(arithmetic mean of ``alpha_i``, kept as a sum and a count, so batches merge exactly) and the
piecewise law is fitted to the mean profile by :func:`.profile_fit.fit_profiles`.
"""

from __future__ import annotations

from dataclasses import dataclass

import einops
import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry.capture.tables import empty_frame
from tl_geometry.core.checks import typechecked
from tl_geometry.core.numerics import ACC_DTYPE
from tl_geometry.diagnostics.accumulators import as_state, check_same
from tl_geometry.diagnostics.profile_fit import ProfileFitTensors, fit_profiles
from tl_geometry.errors import InputError

#: Weights below this are raised to it before the log (a zero would give ``-inf``).
DEFAULT_FLOOR = 1e-12
#: ``fit_ok`` needs ``fit_error`` (mean absolute error of ``log alpha``) at most this: the
#: fitted law is within a factor ``e`` of the profile on average.
DEFAULT_MAX_LOG_ERROR = 1.0
#: Frequencies of the coarse ``omega`` grid (``pi j / n_omega``, ``j = 1..n_omega``).
DEFAULT_N_OMEGA = 256

PROFILE_COLUMNS = [
    "head",
    "n_seqs",
    "n_keys",
    "p_sink",
    "p_base",
    "eta_osc",
    "omega",
    "eta_exp",
    "T1",
    "T2",
    "fit_error",
    "fit_ok",
    "n_floored",
]
PROFILE_CURVE_COLUMNS = ["head", "position", "alpha", "fitted"]


@dataclass(frozen=True)
class AttentionProfileFit:
    """Fit of Assumption 3 per query head (definitions §3), as tidy DataFrames.

    Attributes
    ----------
    summary : DataFrame, one row per ``head``
        ``n_seqs`` (profiles averaged), ``n_keys`` (``K = q + 1``), ``p_sink``, ``p_base``,
        ``eta_osc``, ``omega`` (NaN when there is no oscillation phase, ``T1 = T2``),
        ``eta_exp`` (NaN when there is no recency phase, ``T2 = K - 1``), ``T1``, ``T2``,
        ``fit_error`` (mean absolute error of ``log alpha`` over keys ``1..K-1``), ``fit_ok``,
        ``n_floored`` (content keys raised to the floor: zero or non-finite mean weight).
    curve : DataFrame, one row per ``(head, position)``
        ``alpha`` (the mean profile) and ``fitted`` (the fitted law): Fig. 4.
    """

    summary: pd.DataFrame
    curve: pd.DataFrame


class ProfileAccumulator:
    """Mergeable sum of attention rows ``[head, key]`` and their count (one layer).

    ``update`` with weights ``[*batch, head, key]`` (one query row per batch entry), ``merge``,
    ``mean`` (``[head, key]``) and ``result`` (the fit).
    """

    def __init__(self) -> None:
        self.n_seqs = 0
        self.total: Tensor | None = None

    def update(self, weights: Tensor) -> "ProfileAccumulator":
        """Add the rows of ``weights`` ``[*batch, head, key]`` (detached: no gradient flows)."""
        if weights.shape[-1] == 0:
            raise InputError("attention rows must have at least one key (key >= 1), got 0 keys")
        rows = einops.rearrange(weights.detach().to(ACC_DTYPE), "... h k -> (...) h k")
        if rows.shape[0] == 0:
            return self
        if self.total is None:
            self.total = torch.zeros(rows.shape[1:], dtype=ACC_DTYPE)
        check_same("profile", tuple(self.total.shape), tuple(rows.shape[1:]), "(n_heads, n_keys)")
        self.total += rows.sum(0)
        self.n_seqs += rows.shape[0]
        return self

    def merge(self, other: "ProfileAccumulator") -> "ProfileAccumulator":
        """Add ``other``'s rows to this accumulator (in place; returns ``self``)."""
        if other.total is None:
            return self
        if self.total is None:
            self.total = torch.zeros_like(other.total)
        check_same("profile", tuple(self.total.shape), tuple(other.total.shape), "(n_heads, n_keys)")
        self.total += other.total
        self.n_seqs += other.n_seqs
        return self

    def mean(self) -> Tensor:
        """The mean profile ``[head, key]`` over the rows added."""
        if self.total is None:
            raise InputError("no attention rows were added to this profile accumulator")
        return self.total / self.n_seqs

    def result(
        self,
        floor: float = DEFAULT_FLOOR,
        max_log_error: float = DEFAULT_MAX_LOG_ERROR,
        n_omega: int = DEFAULT_N_OMEGA,
    ) -> AttentionProfileFit:
        """Fit the mean profile of every head (see :func:`fit_attention_profile`)."""
        if self.total is None:
            return AttentionProfileFit(empty_frame(PROFILE_COLUMNS), empty_frame(PROFILE_CURVE_COLUMNS))
        mean = self.mean()
        fit = fit_profiles(mean, floor=floor, n_omega=n_omega, max_log_error=max_log_error)
        return AttentionProfileFit(*profile_tables(fit, mean, self.n_seqs))

    def state_dict(self) -> dict:
        """A copy of the accumulator's state, e.g. for ``torch.save``."""
        return as_state({"n_seqs": self.n_seqs, "total": self.total})

    @classmethod
    def from_state_dict(cls, state: dict) -> "ProfileAccumulator":
        """Rebuild an accumulator saved with :meth:`state_dict`."""
        acc = cls()
        acc.n_seqs = int(state["n_seqs"])
        acc.total = as_state(state["total"])
        return acc


def profile_tables(fit: ProfileFitTensors, mean: Tensor, n_seqs: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``summary`` and ``curve`` tables of fitted profiles ``mean`` ``[rows, key]``."""
    rows, n_keys = mean.shape
    summary = pd.DataFrame(
        {
            "head": np.arange(rows, dtype=np.int64),
            "n_seqs": np.full(rows, n_seqs, dtype=np.int64),
            "n_keys": np.full(rows, n_keys, dtype=np.int64),
            "p_sink": fit.p_sink.numpy(),
            "p_base": fit.p_base.numpy(),
            "eta_osc": fit.eta_osc.numpy(),
            "omega": fit.omega.numpy(),
            "eta_exp": fit.eta_exp.numpy(),
            "T1": fit.t1.numpy(),
            "T2": fit.t2.numpy(),
            "fit_error": fit.fit_error.numpy(),
            "fit_ok": fit.fit_ok.numpy(),
            "n_floored": fit.n_floored.numpy(),
        }
    )
    curve = pd.DataFrame(
        {
            "head": np.repeat(np.arange(rows, dtype=np.int64), n_keys),
            "position": np.tile(np.arange(n_keys, dtype=np.int64), rows),
            "alpha": mean.reshape(-1).numpy(),
            "fitted": fit.fitted.reshape(-1).numpy(),
        }
    )
    return summary, curve


@typechecked
def fit_attention_profile(
    weights: Float[Tensor, "*batch head key"],
    *,
    floor: float = DEFAULT_FLOOR,
    max_log_error: float = DEFAULT_MAX_LOG_ERROR,
    n_omega: int = DEFAULT_N_OMEGA,
) -> AttentionProfileFit:
    """Fit the piecewise attention law of Assumption 3 per head (definitions §3; paper §3.3, Fig. 4).

    Parameters
    ----------
    weights : Tensor [*batch, head, key]
        One attention row per head and batch entry: ``weights[..., h, i]`` is the weight of the
        query on key ``i`` (keys ``0..q``, so ``key = q + 1``; definitions §3 uses the last query of
        each sequence). The rows are **averaged over every batch dimension** (arithmetic mean
        of the weights) before the fit; pass ``[head, key]`` for a profile already averaged.
    floor : float, default 1e-12
        Weights below ``floor`` (zeros) and non-finite ones are replaced by ``floor`` before the
        log; their number is reported as ``n_floored`` and any makes ``fit_ok`` False.
    max_log_error : float, default 1.0
        ``fit_ok`` is False when ``fit_error`` exceeds it.
    n_omega : int, default 256
        Size of the coarse frequency grid ``omega = pi j / n_omega`` (then refined locally).

    Returns
    -------
    AttentionProfileFit
        ``summary`` (one row per head) and ``curve`` (mean and fitted profile per position).

    Notes
    -----
    The law (definitions §3), for keys ``i = 0..K-1``::

        alpha_0 = p_sink
        alpha_i = p_base                                  1 <= i <= T1
        alpha_i = p_base (1 + eta_osc cos(omega i))       T1 < i <= T2
        alpha_i = p_base exp(eta_exp (i - T2))            T2 < i <= K - 1

    ``p_sink`` is the mean ``alpha_0``. The other parameters minimise the squared error of
    ``log alpha_i``, ``i >= 1`` (the paper ties ``eta`` across phases; definitions §3 fits
    ``eta_osc`` and ``eta_exp`` separately): every ``T2`` is tried exactly, ``T1`` and ``omega``
    by a coarse search refined locally, ``eta_osc`` in ``(-1, 1)`` (a negative value is an
    oscillation in phase opposition). A phase is kept only when it lowers the error by more than
    a noise search would (a likelihood-ratio threshold); otherwise ``T1 = T2`` (no oscillation,
    ``eta_osc = omega = NaN``) or ``T2 = K - 1`` (no recency, ``eta_exp = NaN``).
    ``fit_error = mean_{i=1}^{K-1} |log alpha_i - log alpha_hat_i|`` (position 0 is fitted
    exactly and left out). ``fit_ok`` is False when the input has a non-finite entry, a key
    after the sink was floored (a zero mean weight: the log error would depend on ``floor``),
    or ``fit_error > max_log_error``. Nothing raises on a flat,
    zero or otherwise degenerate profile.

    Examples
    --------
    >>> import torch, tl_geometry as tlg
    >>> _ = torch.manual_seed(0)
    >>> w = torch.softmax(torch.randn(8, 9, 512), dim=-1)      # 8 sequences, 9 heads, no structure
    >>> fit = tlg.diagnostics.fit_attention_profile(w)
    >>> fit.summary[["T1", "T2", "fit_ok"]].drop_duplicates()  # one plateau over every key, in every head
        T1   T2  fit_ok
    0  511  511    True
    """
    if floor <= 0:
        raise InputError(f"floor must be positive (it replaces zeros before the log), got {floor}")
    if n_omega < 1:
        raise InputError(f"n_omega must be a positive integer, got {n_omega}")
    return ProfileAccumulator().update(weights).result(floor=floor, max_log_error=max_log_error, n_omega=n_omega)
