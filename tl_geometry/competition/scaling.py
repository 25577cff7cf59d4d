"""Context scaling's ``N*`` with paired-document bootstrap intervals and the log-log slope (definitions §9).

From each document's float64 NLL sum over its targets at every ``(L, ranking, flag, N)`` (the
``windows`` table of ``context_scaling(..., per_document=True)``),
resample the documents with replacement, ``n_boot`` times, the same draw at every ``L`` (paired);
in each draw ``N*`` is the smallest size measured whose loss passes the tolerance::

    relative:  (S_N - S_full) / S_full <= tau          (S = the drawn documents' summed NLL)
    absolute:  (S_N - S_full) / (D T)  <= tau  nats    (D documents, T targets each)

The interval is the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of the draws
(``inverted_cdf``: a size measured; ``inf`` when the draws are censored there). The slope is the
least-squares slope of ``log N*`` against ``log L`` over the contexts, per draw (a draw with a
censored context has none and is counted). Draw ``b`` uses ``rng.integers(0, D, D)``, the
``b``-th call on ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from tl_geometry.competition.support import censored_n_star
from tl_geometry.errors import InputError
from tl_geometry.intervention.curve import check_tolerance

N_STAR_COLUMNS = [
    "context",
    "rank_by",
    "renormalize",
    "tolerance",
    "tolerance_kind",
    "n_star",
    "censored",
    "n_max",
    "n_star_text",
    "n_star_low",
    "n_star_high",
    "n_star_over_context",
    "n_docs",
    "n_boot",
]
SLOPE_COLUMNS = ["rank_by", "renormalize", "tolerance_kind", "slope", "slope_low", "slope_high", "n_boot_censored"]


def draw_n_star(
    sizes: np.ndarray, totals: np.ndarray, full: np.ndarray, idx: np.ndarray, tau: float, scale: float | None
) -> float:
    """``N*`` of one draw: ``totals [n_sizes, n_docs]``, ``full [n_docs]``, documents ``idx``; ``scale``
    None for the relative tolerance, else the number of targets counted (absolute). ``inf``: none passes."""
    drawn, drawn_full = totals[:, idx].sum(axis=1), full[idx].sum()
    loss = (drawn - drawn_full) / (drawn_full if scale is None else scale)
    passing = sizes[loss <= tau]
    return float(passing.min()) if len(passing) else math.inf


def log_log_slope(contexts: np.ndarray, stars: np.ndarray) -> float:
    """Least-squares slope of ``log N*`` on ``log L``; NaN with a censored (``inf``) context or fewer than two."""
    if len(contexts) < 2 or not np.isfinite(stars).all():
        return math.nan
    return float(np.polyfit(np.log(contexts), np.log(stars), 1)[0])


def context_bootstrap(
    windows: pd.DataFrame,
    tolerance: float = 0.05,
    *,
    absolute: bool = False,
    n_boot: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``N*`` per (context, ranking, flag) with paired-document bootstrap intervals, and the log-log slopes.

    Parameters
    ----------
    windows : tidy ``context, rank_by, renormalize, n, window, total, targets`` (one row per document
        and point; the full model as ``rank_by="full"``), as ``context_scaling(..., per_document=True)`` returns.
    tolerance : ``tau`` (relative, or nats per target with ``absolute``).
    n_boot : draws (0: no intervals).
    confidence : the interval's coverage.
    seed : seed of the draws.

    Returns
    -------
    ``(n_star, slopes)``: :data:`N_STAR_COLUMNS` and :data:`SLOPE_COLUMNS` tables.
    """
    tau = check_tolerance(tolerance)
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 0:
        raise InputError(f"n_boot must be an integer >= 0, got {n_boot!r}")
    if not 0 < confidence < 1:
        raise InputError(f"confidence must be in (0, 1), got {confidence!r}")
    needed = {"context", "rank_by", "renormalize", "n", "window", "total", "targets"}
    if not isinstance(windows, pd.DataFrame) or not needed <= set(windows.columns) or windows.empty:
        raise InputError(
            "context_bootstrap needs the per-document table of context_scaling(..., per_document=True); "
            "a curve saved by an older version has none: measure it again"
        )
    contexts = sorted(set(windows.context))
    n_docs = {int(L): int(windows[windows.context == L].window.nunique()) for L in contexts}
    if len(set(n_docs.values())) != 1:
        raise InputError(f"every context needs the same documents for a paired bootstrap, got {n_docs}")
    D = next(iter(n_docs.values()))
    rng = np.random.default_rng(seed)
    draws = [np.arange(D)] + [rng.integers(0, D, D) for _ in range(n_boot)]  # draw 0: the sample itself
    kind = "absolute" if absolute else "relative"
    groups = windows[windows.rank_by != "full"][["rank_by", "renormalize"]].drop_duplicates()
    star_rows, slope_rows = [], []
    for rank_by, renorm in groups.itertuples(index=False):
        per_context = {}
        for L in contexts:
            here = windows[windows.context == L]
            full = here[here.rank_by == "full"].sort_values("window").total.to_numpy(np.float64)
            points = here[(here.rank_by == rank_by) & (here.renormalize == renorm)]
            pivot = points.pivot_table(index="n", columns="window", values="total", aggfunc="first").sort_index()
            sizes, totals = pivot.index.to_numpy(np.int64), pivot.to_numpy(np.float64)
            scale = None if not absolute else float(D * int(here.targets.iloc[0]))
            stars = np.array([draw_n_star(sizes, totals, full, idx, tau, scale) for idx in draws])
            per_context[L] = stars
            drawn_full = full.sum()
            passes = (totals.sum(axis=1) - drawn_full) / (drawn_full if scale is None else scale) <= tau
            point = censored_n_star(sizes.tolist(), passes.tolist())
            low = high = math.nan
            if n_boot:
                low, high = (
                    float(q)
                    for q in np.quantile(stars[1:], [(1 - confidence) / 2, (1 + confidence) / 2], method="inverted_cdf")
                )
            star_rows.append(
                {
                    "context": int(L),
                    "rank_by": rank_by,
                    "renormalize": bool(renorm),
                    "tolerance": tau,
                    "tolerance_kind": kind,
                    **point,
                    "n_star_low": low,
                    "n_star_high": high,
                    "n_star_over_context": math.nan if point["censored"] else point["n_star"] / L,
                    "n_docs": D,
                    "n_boot": n_boot,
                }
            )
        Ls = np.array(contexts, dtype=np.float64)
        slopes = np.array(
            [log_log_slope(Ls, np.array([per_context[L][b] for L in contexts])) for b in range(len(draws))]
        )
        finite = slopes[1:][np.isfinite(slopes[1:])]
        low = high = math.nan
        if len(finite):
            low, high = (float(q) for q in np.quantile(finite, [(1 - confidence) / 2, (1 + confidence) / 2]))
        slope_rows.append(
            {
                "rank_by": rank_by,
                "renormalize": bool(renorm),
                "tolerance_kind": kind,
                "slope": slopes[0],
                "slope_low": low,
                "slope_high": high,
                "n_boot_censored": int(n_boot - len(finite)),
            }
        )
    stars_table = pd.DataFrame(star_rows, columns=N_STAR_COLUMNS)
    stars_table["n_star"] = stars_table["n_star"].astype("Int64")
    return stars_table, pd.DataFrame(slope_rows, columns=SLOPE_COLUMNS)


__all__ = ["N_STAR_COLUMNS", "SLOPE_COLUMNS", "context_bootstrap", "draw_n_star", "log_log_slope"]
