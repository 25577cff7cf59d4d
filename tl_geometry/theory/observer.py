"""Envelopes of Theorems 1-2 inside the streaming analysis: an observer and the comparison table.

Columns: docs/columns.md#bounds.

* :class:`BoundsObserver` computes :func:`tl_geometry.theory.bounds.bounds` for every head and chosen
  query row of a layer (a :class:`~tl_geometry.capture.observers.RowObserver`), in the same row order as
  :class:`~tl_geometry.capture.observers.SeparabilityObserver`, so the two tables join on
  ``seq, layer, head, kv_head, query_pos, n``.
* :func:`join_bounds` adds the bound columns to a separability table.
* :func:`envelopes` compares, per ``N``, the measured precision / recall with the envelopes.
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import torch

from tl_geometry.capture.observers import RowMetricsObserver
from tl_geometry.capture.tables import KEY_COLUMNS, REFERENCE_RANKING, attention_rows
from tl_geometry.core.sizes import NsLike, clip_ns
from tl_geometry.errors import InputError
from tl_geometry.io.row_sums import ROWS_COLUMN, group_sums, is_sums_table, means_of_sums
from tl_geometry.models import ModelInfo
from tl_geometry.theory.bounds import BOUND_FIELDS, F_BOUND_FIELDS, RhoLike, bounds, resolve_rho

BOUND_COLUMNS = [
    "precision_lower",
    "precision_upper",
    "recall_lower",
    "recall_upper",
    "f_at_rmax_lower",
    "f_at_rmax_upper",
    "f_at_rmin_lower",
    "f_at_rmin_upper",
    "delta",
    "delta0",
    "scale",
]
BOUNDS_COLUMNS = KEY_COLUMNS + BOUND_COLUMNS


class BoundsObserver(RowMetricsObserver):
    """Computes the definitions §4 envelopes for every head and chosen query row of a layer.

    Parameters
    ----------
    info : ModelInfo
        The model's geometry; ``d = info.d_head`` (the values' last dimension).
    ns : selection sizes, as for :func:`tl_geometry.analyze` (e.g. ``"log"``).
    kappa : float, default 0.5
        The concentration constant (stored in ``attrs["kappa"]`` of every table it returns).
    dtype : torch.dtype, default torch.float64
    rho : "measured" (default), SimilarityModel or ("model", beta, rho_0)
        Source of the cosines (see :func:`tl_geometry.theory.bounds.bounds`).

    Use it as one of the observers of :func:`tl_geometry.capture.hooks.run_streaming`, then
    :meth:`take` the table (columns :data:`BOUNDS_COLUMNS`, one row per
    ``(seq, head, query_pos, n)`` of each observed layer).
    """

    columns = BOUND_COLUMNS

    def __init__(
        self,
        info: ModelInfo,
        ns: NsLike,
        kappa: float = 0.5,
        dtype: torch.dtype = torch.float64,
        rho: RhoLike = "measured",
    ) -> None:
        resolve_rho(rho)  # fail early on a bad spec
        super().__init__(info, ns)
        self.kappa = kappa
        self.dtype = dtype
        self.rho = rho

    def settings(self) -> dict:
        return {**super().settings(), "kappa": float(self.kappa), "rho": str(self.rho), "dtype": str(self.dtype)}

    def metrics(self, weights: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ns = clip_ns(self.ns, weights.shape[-1])  # a shorter query's rows: min(N, K)
        res = bounds(weights, values, ns, self.kappa, rho=self.rho, dtype=self.dtype, query_positions=-1)
        return res.ns, {name: getattr(res, name) for name in BOUND_COLUMNS}

    def take(self) -> pd.DataFrame:
        """The rows gathered since the last call, as one DataFrame (and forget them)."""
        out = super().take()
        out.attrs = {"kappa": self.kappa, "rho": str(self.rho)}
        return out


def join_bounds(separability: pd.DataFrame, bounds_table: pd.DataFrame) -> pd.DataFrame:
    """Add the bound columns of ``bounds_table`` to ``separability`` (left join on the keys).

    Both tables must come from the same sequences, layers, query positions and ``ns`` (one row
    per key in each); ``attrs["kappa"]`` of ``bounds_table`` is kept.
    """
    missing = [c for c in KEY_COLUMNS if c not in separability or c not in bounds_table]
    if missing:
        raise InputError(f"both tables need the key columns {KEY_COLUMNS}; missing {missing}")
    right = bounds_table[KEY_COLUMNS + [c for c in BOUND_COLUMNS if c in bounds_table]]
    keys = KEY_COLUMNS
    if "rank_by" in separability:  # the bounds are those of attention selection (definitions §4)
        right, keys = right.assign(rank_by=REFERENCE_RANKING), [*KEY_COLUMNS, "rank_by"]
    out = separability.merge(right, on=keys, how="left", validate="one_to_one")
    if len(separability) and out["precision_lower"].isna().all():
        raise InputError(
            "no row of the bounds table matches the separability table: were they measured on the same run?"
        )
    out.attrs = dict(bounds_table.attrs)
    return out


#: The columns :func:`envelopes` reads.
ENVELOPE_INPUTS = ["precision", "recall", "precision_lower", "precision_upper", "recall_lower", "recall_upper"]


def envelope_indicators(rows: pd.DataFrame, tolerance: float = 1e-12) -> pd.DataFrame:
    """``rows`` with, for ``m`` in ``precision, recall``, the per-row indicators (1.0 or 0.0)
    ``m_below`` (``m < m_lower - tolerance``), ``m_above`` (``m > m_upper + tolerance``) and
    ``m_inside`` (neither): what :func:`envelopes` averages."""
    out = rows.copy()
    for m in ("precision", "recall"):
        value, low, up = rows[m], rows[f"{m}_lower"], rows[f"{m}_upper"]
        out[f"{m}_below"] = (value < low - tolerance).astype(float)
        out[f"{m}_above"] = (value > up + tolerance).astype(float)
        out[f"{m}_inside"] = 1.0 - out[f"{m}_below"] - out[f"{m}_above"]
    return out


def envelopes(
    separability_with_bounds: pd.DataFrame, by: Sequence[str] = ("n",), tolerance: float = 1e-12
) -> pd.DataFrame:
    """Per ``N`` (or per ``by``), measured means against the mean envelopes, and shares inside.

    Aggregates over every other row of the table (sequences, layers, heads, query positions).

    Parameters
    ----------
    separability_with_bounds : DataFrame
        A separability table with the bound columns (see :func:`join_bounds`), or its sums table
        (:func:`tl_geometry.io.row_sums.group_sums` with ``prepare=envelope_indicators``, as
        :meth:`~tl_geometry.pipeline.result.AnalysisResult.separability_sums` holds it; then
        ``by`` must be among its groups and ``tolerance`` is the one of the indicators).
    by : columns to group by, default ``("n",)``.
    tolerance : float, default 1e-12
        Slack of the comparisons ``lower <= value <= upper`` (rounding only).

    Returns
    -------
    DataFrame
        One row per group: ``rows``; for ``m`` in ``precision, recall``: ``m`` (mean),
        ``m_lower``, ``m_upper`` (mean envelopes), ``m_inside`` (share of rows with
        ``lower <= m <= upper``), ``m_below`` (share under the lower bound), ``m_above`` (share
        over the upper bound) and ``m_mean_inside`` (whether the mean lies between the mean
        envelopes, the form in which the theorems bound ``E m``). ``attrs["kappa"]`` is kept.
    """
    df = attention_rows(separability_with_bounds)
    need = [*ENVELOPE_INPUTS, *by]
    missing = [c for c in need if c not in df]
    if missing:
        raise InputError(f"envelopes() needs the columns {need}; missing {missing} (use join_bounds first)")
    if is_sums_table(df):
        if "precision_inside" not in df:
            raise InputError(
                "envelopes() of a sums table needs its indicators: group_sums(..., prepare=envelope_indicators)"
            )
        sums = df
    else:
        sums = group_sums(envelope_indicators(df[need], tolerance), list(by))
    out = means_of_sums(sums, list(by)).set_index(list(by)).rename(columns={ROWS_COLUMN: "rows"})
    for m in ("precision", "recall"):
        out[f"{m}_mean_inside"] = (out[m] >= out[f"{m}_lower"] - tolerance) & (out[m] <= out[f"{m}_upper"] + tolerance)
    order = ["rows"] + [
        f"{m}{s}"
        for m in ("precision", "recall")
        for s in ("", "_lower", "_upper", "_inside", "_below", "_above", "_mean_inside")
    ]
    out = out[order].reset_index()
    out.attrs = {k: v for k, v in df.attrs.items() if k != "n_seqs"}
    return out


__all__ = [
    "BOUNDS_COLUMNS",
    "BoundsObserver",
    "ENVELOPE_INPUTS",
    "envelope_indicators",
    "envelopes",
    "join_bounds",
    "BOUND_FIELDS",
    "F_BOUND_FIELDS",
]
