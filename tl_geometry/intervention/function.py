"""Geometry against function: rank correlations of separability with the intervention's loss (definitions §8).

Columns: docs/columns.md#geometry-against-function.

* with a :class:`SparsificationCurve`: for each (rank_by, renormalize) of the curve, Spearman's
  ``rho`` over the sizes ``N`` present in both tables between the mean ``f_at_rmax`` (and
  ``f_at_rmin``) of the separability table at ``N`` (mean over every row: windows, layers, heads,
  query positions) and ``delta_nll_rel(N)``;
* with a localised-loss table (:func:`localized_loss`): Spearman's ``rho`` across units between the
  unit's mean ``f_at_rmax`` / ``f_at_rmin`` (over its rows at the table's ``N`` when the
  separability has that size, else over every ``N``) and its ``delta_nll_rel``.

The separability rows used are those of the same ``rank_by`` when the table has a ``rank_by``
column, else the table is taken as attention-ranked (``rank_by="attention"`` only).
``scipy.stats.spearmanr`` gives ``rho`` and its two-sided p-value.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from scipy.stats import spearmanr

from tl_geometry.errors import InputError
from tl_geometry.intervention.curve import SparsificationCurve

GEOMETRY = ("f_at_rmax", "f_at_rmin")
FUNCTION_COLUMNS = ["comparison", "rank_by", "renormalize", "geometry", "n_points", "rho", "p_value"]


def _separability(result: Any) -> pd.DataFrame:
    table = getattr(result, "separability", result)
    if not isinstance(table, pd.DataFrame) or not set(GEOMETRY) <= set(table.columns):
        raise InputError(
            "geometry_vs_function needs an AnalysisResult (or its separability table) with f_at_rmax and f_at_rmin"
        )
    return table


def _of_ranking(table: pd.DataFrame, rank_by: str) -> pd.DataFrame:
    if "rank_by" in table.columns:
        return table[table["rank_by"] == rank_by]
    return table if rank_by == "attention" else table.iloc[:0]


def _rho(x: pd.Series, y: pd.Series) -> tuple[float, float]:
    if len(x) < 3 or x.nunique() < 2 or y.nunique() < 2:
        return float("nan"), float("nan")
    rho, p = spearmanr(x.to_numpy(float), y.to_numpy(float))
    return float(rho), float(p)


def geometry_vs_function(result: Any, curve_or_local: SparsificationCurve | pd.DataFrame) -> pd.DataFrame:
    """Spearman's ``rho`` of separability with loss, over ``N`` (a curve) or across units (localised loss).

    Returns
    -------
    DataFrame ``comparison ("over_n" or "across_<unit>s"), rank_by, renormalize, geometry, n_points,
    rho, p_value``; ``rho`` is NaN with fewer than 3 points or a constant side.
    """
    sep = _separability(result)
    rows = []
    if isinstance(curve_or_local, SparsificationCurve):
        for (rank_by, renorm), points in curve_or_local.table.groupby(["rank_by", "renormalize"], sort=False):
            means = _of_ranking(sep, rank_by).groupby("n")[list(GEOMETRY)].mean()
            loss = points.groupby("n").delta_nll_rel.mean()
            both = means.join(loss, how="inner")
            for geometry in GEOMETRY:
                rho, p = _rho(both[geometry], both["delta_nll_rel"])
                rows.append(["over_n", rank_by, bool(renorm), geometry, len(both), rho, p])
    elif isinstance(curve_or_local, pd.DataFrame) and {"layer", "delta_nll_rel", "n", "rank_by"} <= set(
        curve_or_local.columns
    ):
        local = curve_or_local
        if local.empty:
            raise InputError("the localised-loss table is empty")
        rank_by, n = str(local["rank_by"].iloc[0]), int(local["n"].iloc[0])
        by_head = local["head"].notna().all() if "head" in local.columns else False
        keys = ["layer", "head"] if by_head else ["layer"]
        rows_sep = _of_ranking(sep, rank_by)
        if (rows_sep["n"] == n).any():
            rows_sep = rows_sep[rows_sep["n"] == n]
        geo = rows_sep.groupby(keys)[list(GEOMETRY)].mean()
        loss = local.assign(head=local["head"].astype("int64")) if by_head else local
        both = geo.join(loss.set_index(keys)["delta_nll_rel"], how="inner")
        for geometry in GEOMETRY:
            rho, p = _rho(both[geometry], both["delta_nll_rel"])
            rows.append(
                [
                    f"across_{'head' if by_head else 'layer'}s",
                    rank_by,
                    bool(local["renormalize"].iloc[0]),
                    geometry,
                    len(both),
                    rho,
                    p,
                ]
            )
    else:
        raise InputError("curve_or_local must be a SparsificationCurve or the table of localized_loss")
    return pd.DataFrame(rows, columns=FUNCTION_COLUMNS)


__all__ = ["FUNCTION_COLUMNS", "geometry_vs_function"]
