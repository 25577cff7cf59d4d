"""Value-state norms and the sink (definitions §3, paper §3.1, Assumption 1, Figure 2).

Columns: docs/columns.md#value_norms.

For one sequence and one key/value head with values ``v_0 .. v_{L-1}`` (``L`` keys):

* ``sink_ratio = ||v_0|| / median_{i>0} ||v_i||`` (the paper's ``lambda``);
* ``norm_cv = std_{i>0} ||v_i|| / mean_{i>0} ||v_i||`` (population std, ``ddof = 0``).

A median cannot be merged across batches, so both statistics are computed **per sequence**
(exactly as definitions §3 defines them) and then **averaged over sequences**; the accumulator keeps
their sums and the number of sequences. Beside them it keeps, per position, the mergeable moments
(count, mean, ``M2``) of ``||v_i||`` over sequences, which give the per-position mean norm ``m_i`` (the curve
of Fig. 2, left) and two curve statistics: ``sink_ratio_of_mean = m_0 / median_{i>0} m_i`` and
``norm_cv_of_mean = std_{i>0} m_i / mean_{i>0} m_i``. Everything is a sum or a
:class:`~tl_geometry.core.moments.Moments`, so any split of the corpus into batches, merged in any
order, gives the same numbers to float64 rounding (``~1e-15`` relative, the spreads included).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry.capture.tables import empty_frame
from tl_geometry.core.checks import typechecked
from tl_geometry.core.moments import Moments
from tl_geometry.core.numerics import ACC_DTYPE
from tl_geometry.diagnostics.accumulators import KeyedSums, check_same, median_last

NORM_COLUMNS = [
    "kv_head",
    "n_seqs",
    "n_keys",
    "sink_norm",
    "median_norm",
    "mean_norm",
    "sink_ratio",
    "norm_cv",
    "sink_ratio_of_mean",
    "norm_cv_of_mean",
]
NORM_CURVE_COLUMNS = ["kv_head", "position", "mean_norm", "std_norm", "n_seqs"]

_SUMS = ("sink", "median", "mean", "ratio", "cv")


@dataclass(frozen=True)
class ValueNormStats:
    """Norm diagnostics of one layer's values (definitions §3), as tidy DataFrames.

    Attributes
    ----------
    summary : DataFrame, one row per ``kv_head``
        ``n_seqs``, ``n_keys`` (``L``); per-sequence statistics averaged over the ``n_seqs``
        sequences: ``sink_norm`` (``||v_0||``), ``median_norm`` (``median_{i>0} ||v_i||``),
        ``mean_norm`` (``mean_{i>0} ||v_i||``), ``sink_ratio`` (``lambda``), ``norm_cv``;
        statistics of the per-position mean-norm curve ``m_i``: ``sink_ratio_of_mean``,
        ``norm_cv_of_mean``.
    by_position : DataFrame, one row per ``(kv_head, position)``
        ``mean_norm`` (``m_i``, the mean over sequences of ``||v_i||``), ``std_norm`` (their
        population std over sequences) and ``n_seqs``: Fig. 2 (left).
    """

    summary: pd.DataFrame
    by_position: pd.DataFrame


class NormAccumulator(KeyedSums):
    """Mergeable sums behind :func:`value_norm_stats` (one layer, every key/value head).

    ``update`` with value tensors ``[batch, key, kv_head, d_head]``, ``merge`` another
    accumulator of the same geometry, ``result`` for the tables. ``state_dict`` /
    ``from_state_dict`` save and restore it (for resuming an interrupted run).
    """

    name = "norm"

    def update(self, values: Tensor) -> "NormAccumulator":
        """Add the sequences of ``values`` ``[batch, key, kv_head, d_head]`` (detached: no gradient flows)."""
        values = values.detach()
        if not self._start(values, 2, "norm statistics need at least 2 positions (the sink and one more)"):
            return self
        b = values.shape[0]
        norms = torch.linalg.vector_norm(values.to(ACC_DTYPE), dim=-1)  # [b, L, g]
        sink = norms[:, 0]  # [b, g]
        rest = norms[:, 1:].transpose(1, 2)  # [b, g, L-1]
        median = median_last(rest)
        mean = rest.mean(-1)
        std = rest.std(-1, correction=0)
        add = {
            "sink": sink.sum(0),
            "median": median.sum(0),
            "mean": mean.sum(0),
            "ratio": (sink / median).sum(0),
            "cv": (std / mean).sum(0),
            "pos": Moments.of(norms.transpose(1, 2), dim=0),  # [g, L] over sequences
        }
        self._add(add, b)
        return self

    def result(self) -> ValueNormStats:
        """The summary and per-position tables of everything added so far."""
        if self.n_seqs == 0:
            return ValueNormStats(empty_frame(NORM_COLUMNS), empty_frame(NORM_CURVE_COLUMNS))
        n, s = self.n_seqs, self.sums
        pos = self.moments["pos"]
        g, n_keys = pos.mean.shape
        m = pos.mean  # [g, L] per-position mean norm
        std_pos = pos.std()
        m_rest = m[:, 1:]
        summary = pd.DataFrame(
            {
                "kv_head": np.arange(g, dtype=np.int64),
                "n_seqs": np.full(g, n, dtype=np.int64),
                "n_keys": np.full(g, n_keys, dtype=np.int64),
                "sink_norm": (s["sink"] / n).numpy(),
                "median_norm": (s["median"] / n).numpy(),
                "mean_norm": (s["mean"] / n).numpy(),
                "sink_ratio": (s["ratio"] / n).numpy(),
                "norm_cv": (s["cv"] / n).numpy(),
                "sink_ratio_of_mean": (m[:, 0] / median_last(m_rest)).numpy(),
                "norm_cv_of_mean": (m_rest.std(-1, correction=0) / m_rest.mean(-1)).numpy(),
            }
        )
        curve = pd.DataFrame(
            {
                "kv_head": np.repeat(np.arange(g, dtype=np.int64), n_keys),
                "position": np.tile(np.arange(n_keys, dtype=np.int64), g),
                "mean_norm": m.reshape(-1).numpy(),
                "std_norm": std_pos.reshape(-1).numpy(),
                "n_seqs": np.full(g * n_keys, n, dtype=np.int64),
            }
        )
        return ValueNormStats(summary, curve)

    @classmethod
    def from_state_dict(cls, state: dict) -> "NormAccumulator":
        """Rebuild an accumulator saved with :meth:`state_dict`."""
        return cls()._load_state(state)

    def _init(self, n_keys: int, n_kv: int) -> None:
        if self.n_keys is None:
            self.n_keys, self.n_kv_heads = n_keys, n_kv
            self.sums = {k: torch.zeros(n_kv, dtype=ACC_DTYPE) for k in _SUMS}
            self.moments = {"pos": Moments.zeros((n_kv, n_keys))}
        else:
            check_same("norm", (self.n_keys, self.n_kv_heads), (n_keys, n_kv), "(n_keys, n_kv_heads)")


@typechecked
def value_norm_stats(values: Float[Tensor, "batch key kv_head d_head"]) -> ValueNormStats:
    """Value-norm diagnostics of Assumption 1 (definitions §3; paper §3.1, Fig. 2).

    Parameters
    ----------
    values : Tensor [batch, key, kv_head, d_head]
        Value vectors of ``batch`` sequences of ``key >= 2`` positions (``hook_v``'s layout);
        position 0 is the sink. One key/value head only? Use ``values[:, :, None, :]``.

    Returns
    -------
    ValueNormStats
        ``summary`` (one row per ``kv_head``) and ``by_position`` (one row per
        ``(kv_head, position)``).

    Notes
    -----
    Per sequence ``s`` and head, with ``n_i = ||v_i||``:

    * ``sink_ratio_s = n_0 / median_{i>0} n_i`` (the paper's ``lambda``; the median of an even
      count is the mean of the two middle values);
    * ``norm_cv_s = std_{i>0} n_i / mean_{i>0} n_i`` (population std).

    ``sink_ratio``, ``norm_cv``, ``sink_norm``, ``median_norm`` and ``mean_norm`` in ``summary``
    are the **means over sequences** of these per-sequence numbers. This is this package's
    reading of definitions §3 "over the analysed sequences": a median does not merge across batches,
    a per-sequence ratio and a sum of ratios do. The curve ``m_i = mean_s n_i`` (Fig. 2, left)
    gives the other reading: ``sink_ratio_of_mean = m_0 / median_{i>0} m_i`` and
    ``norm_cv_of_mean = std_{i>0} m_i / mean_{i>0} m_i``; the second is much smaller than
    ``norm_cv`` when norms vary from token to token but not systematically with position.

    Examples
    --------
    >>> import torch, tl_geometry as tlg
    >>> _ = torch.manual_seed(0)
    >>> v = torch.randn(4, 128, 3, 64)                   # 4 sequences, 128 positions, 3 key/value heads
    >>> v[:, 0] *= 0.1                                   # a compressed sink
    >>> stats = tlg.diagnostics.value_norm_stats(v)
    >>> stats.summary[["kv_head", "sink_ratio", "norm_cv"]].round(2)   # norm_cv ~ 1/sqrt(2 * 64)
       kv_head  sink_ratio  norm_cv
    0        0         0.1     0.09
    1        1         0.1     0.09
    2        2         0.1     0.09
    """
    return NormAccumulator().update(values).result()
