"""Cross-token similarity decay and sink similarity (definitions §3, paper §3.2, Assumption 2, Fig. 3).

Per key/value head: ``c(k) = mean cos(v_i, v_j)`` over the pairs ``i, j > 0`` at lag
``|i - j| = k`` (pooled over sequences), the fit ``c(k) ~ exp(-beta k)`` with its ``mae``, the
``share_negative`` of those cosines, and ``rho_0 = mean_{j>0} cos(v_0, v_j)``. Accumulators keep
sums and mergeable moments (count, mean, ``M2``) per lag, so batches merge exactly; lagged cosines come from banded block products
(:mod:`.lag_cosines`). Details: docs/diagnostics.md §1-3.

Columns: docs/columns.md#similarity.
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
from tl_geometry.core.moments import Moments
from tl_geometry.core.numerics import ACC_DTYPE, sink_cosine_sums, unit_vectors
from tl_geometry.diagnostics.accumulators import KeyedSums, check_same
from tl_geometry.diagnostics.decay_fit import fit_exponential_decay
from tl_geometry.diagnostics.lag_cosines import lag_cosine_moments
from tl_geometry.errors import InputError

#: Default largest lag. Assumption 2 is about how similarity falls off with distance; at
#: long lags real values keep a floor of shared direction that a pure exponential cannot follow.
DEFAULT_K_MAX = 64

SIMILARITY_COLUMNS = ["kv_head", "n_seqs", "n_keys", "k_max", "beta", "mae", "share_negative", "rho_0"]
SIMILARITY_CURVE_COLUMNS = ["kv_head", "k", "c", "c_std", "share_negative", "n_pairs", "fit"]


@dataclass(frozen=True)
class SimilarityDecay:
    """Similarity diagnostics of one layer's values (definitions §3), as tidy DataFrames.

    Attributes
    ----------
    summary : DataFrame, one row per ``kv_head``
        ``n_seqs``, ``n_keys`` (``L``), ``k_max`` (lags fitted), ``beta``, ``mae``,
        ``share_negative`` (over the pairs with lag ``1..k_max``), ``rho_0``.
    curve : DataFrame, one row per ``(kv_head, k)``
        ``c`` (``c(k)``), ``c_std`` (population std of the pairwise cosines at lag ``k``),
        ``share_negative`` (at lag ``k``), ``n_pairs``, ``fit`` (``exp(-beta k)``): Fig. 3's input.
    """

    summary: pd.DataFrame
    curve: pd.DataFrame


class SimilarityAccumulator(KeyedSums):
    """Mergeable per-lag sums behind :func:`similarity_decay` (one layer, every key/value head).

    Parameters
    ----------
    k_max : int or None, default 64
        Largest lag. ``None`` means every lag (``L - 2``); a value above ``L - 2`` is lowered to
        ``L - 2`` (the ``k_max`` column says which lags were used).
    """

    name = "similarity"

    def __init__(self, k_max: int | None = DEFAULT_K_MAX) -> None:
        if k_max is not None and (not isinstance(k_max, int) or k_max < 1):
            raise InputError(f"k_max must be a positive integer or None (every lag), got {k_max!r}")
        super().__init__()
        self.k_max_requested = k_max
        self.k_max: int | None = None

    def update(self, values: Tensor) -> "SimilarityAccumulator":
        """Add the sequences of ``values`` ``[batch, key, kv_head, d_head]`` (detached: no gradient flows)."""
        values = values.detach()
        if not self._start(values, 3, "similarity decay needs at least 3 positions (the sink and a pair)"):
            return self
        b, n_keys, g, d = values.shape
        u = torch.empty((b * g, n_keys, d), dtype=ACC_DTYPE, device=values.device)  # one widening copy
        u.view(b, g, n_keys, d).copy_(einops.rearrange(values, "b l g d -> b g l d"))
        u = unit_vectors(u)  # [(b g), L, d]
        moments, neg = lag_cosine_moments(u[:, 1:], self.lags())
        per_seq = Moments(
            *(einops.rearrange(x, "(b g) k -> b g k", b=b) for x in (moments.count, moments.mean, moments.m2))
        )
        sink_sums = sink_cosine_sums(u)  # [(b g)]
        add: dict[str, Tensor | Moments] = {
            "lag": per_seq.reduce(0),
            "lag_neg": einops.reduce(neg.to(ACC_DTYPE), "(b g) k -> g k", "sum", b=b),
            "sink": einops.reduce(sink_sums, "(b g) -> g", "sum", b=b),
        }
        self._add(add, b)
        return self

    def _check_settings(self, other: "KeyedSums") -> None:
        check_same("similarity", self.k_max_requested, getattr(other, "k_max_requested", None), "k_max")

    def lags(self) -> int:
        """``k_max`` in use, fixed by the first sequence added (the requested one, at most ``L - 2``)."""
        if self.k_max is None:
            raise InputError("the similarity accumulator holds no sequence yet")
        return self.k_max

    def curve_tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``(ks, c, c_std, n_neg, n_pairs)``: ``ks`` ``[k_max]``, the rest ``[kv_head, k_max]``
        except ``n_pairs`` ``[k_max]`` (pairs per head)."""
        n_keys, _ = self.geometry()
        ks = torch.arange(1, self.lags() + 1, dtype=torch.int64)
        n_pairs = (self.n_seqs * (n_keys - 1 - ks)).to(ACC_DTYPE)
        lag = self.moments["lag"]
        c, c_std = lag.mean, lag.std()
        return ks, c, c_std, self.sums["lag_neg"], n_pairs

    def result(self, k_fit: int | None = None) -> SimilarityDecay:
        """The summary and the ``c(k)`` curve; the exponential is fitted on ``k = 1..k_fit``.

        ``k_fit`` (default: the accumulator's ``k_max``) refits a shorter range of the same curve.
        """
        if self.n_seqs == 0:
            return SimilarityDecay(empty_frame(SIMILARITY_COLUMNS), empty_frame(SIMILARITY_CURVE_COLUMNS))
        n_keys, _ = self.geometry()
        k_max = self.lags()
        k_fit = k_max if k_fit is None else int(k_fit)
        if not 1 <= k_fit <= k_max:
            raise InputError(f"k_fit={k_fit} is outside the accumulated lags 1..{k_max}")
        ks, c, c_std, n_neg, n_pairs = self.curve_tensors()
        ks, c, c_std, n_neg, n_pairs = ks[:k_fit], c[:, :k_fit], c_std[:, :k_fit], n_neg[:, :k_fit], n_pairs[:k_fit]
        beta, mae = fit_exponential_decay(c, ks)
        g = c.shape[0]
        n_sink = self.n_seqs * (n_keys - 1)
        summary = pd.DataFrame(
            {
                "kv_head": np.arange(g, dtype=np.int64),
                "n_seqs": np.full(g, self.n_seqs, dtype=np.int64),
                "n_keys": np.full(g, n_keys, dtype=np.int64),
                "k_max": np.full(g, k_fit, dtype=np.int64),
                "beta": beta.numpy(),
                "mae": mae.numpy(),
                "share_negative": (n_neg.sum(-1) / n_pairs.sum()).numpy(),
                "rho_0": (self.sums["sink"] / n_sink).numpy(),
            }
        )
        curve = pd.DataFrame(
            {
                "kv_head": np.repeat(np.arange(g, dtype=np.int64), k_fit),
                "k": np.tile(ks.numpy(), g),
                "c": c.reshape(-1).numpy(),
                "c_std": c_std.reshape(-1).numpy(),
                "share_negative": (n_neg / n_pairs).reshape(-1).numpy(),
                "n_pairs": np.tile(n_pairs.numpy().astype(np.int64), g),
                "fit": torch.exp(-beta[:, None] * ks).reshape(-1).numpy(),
            }
        )
        return SimilarityDecay(summary, curve)

    def _extra_state(self) -> dict:
        return {"k_max_requested": self.k_max_requested, "k_max": self.k_max}

    @classmethod
    def from_state_dict(cls, state: dict) -> "SimilarityAccumulator":
        """Rebuild an accumulator saved with :meth:`state_dict`."""
        acc = cls(state["k_max_requested"])._load_state(state)
        acc.k_max = state["k_max"]
        return acc

    def _init(self, n_keys: int, n_kv: int) -> None:
        if self.n_keys is None:
            self.n_keys, self.n_kv_heads = n_keys, n_kv
            req = self.k_max_requested
            k_max = n_keys - 2 if req is None else min(req, n_keys - 2)
            self.k_max = k_max
            self.moments = {"lag": Moments.zeros((n_kv, k_max))}
            self.sums = {
                "lag_neg": torch.zeros(n_kv, k_max, dtype=ACC_DTYPE),
                "sink": torch.zeros(n_kv, dtype=ACC_DTYPE),
            }
        else:
            check_same("similarity", (self.n_keys, self.n_kv_heads), (n_keys, n_kv), "(n_keys, n_kv_heads)")


@typechecked
def similarity_decay(
    values: Float[Tensor, "batch key kv_head d_head"],
    k_max: int | None = DEFAULT_K_MAX,
) -> SimilarityDecay:
    """Cosine-by-lag curve ``c(k)``, its exponential fit and the sink similarity (definitions §3; Fig. 3).

    Parameters
    ----------
    values : Tensor [batch, key, kv_head, d_head]
        Value vectors of ``batch`` sequences of ``key >= 3`` positions (``hook_v``'s layout);
        position 0 is the sink.
    k_max : int or None, default 64
        Largest lag ``k``. ``None``: every lag, ``L - 2``. Values above ``L - 2`` are lowered
        to it (the ``k_max`` column reports the lags used).

    Returns
    -------
    SimilarityDecay
        ``summary`` (one row per ``kv_head``: ``beta``, ``mae``, ``share_negative``, ``rho_0``)
        and ``curve`` (one row per ``(kv_head, k)``).

    Notes
    -----
    With ``u_i = v_i / ||v_i||`` and ``S`` sequences of ``L`` keys:

    * ``c(k) = sum_s sum_{i=1}^{L-1-k} <u_i, u_{i+k}> / (S (L - 1 - k))``, ``k = 1..k_max``:
      every pair ``i, j > 0`` with ``|i - j| = k`` counted once, pooled over sequences;
    * ``beta = argmin_{beta > 0} sum_{k=1}^{k_max} (c(k) - exp(-beta k))^2`` (least squares in
      ``c``, searched on ``[1e-6, 50]``); ``mae = mean_{k=1}^{k_max} |c(k) - exp(-beta k)|``;
    * ``share_negative = #{pairs counted in c(1..k_max) with cos < 0} / #{those pairs}``;
    * ``rho_0 = sum_s sum_{j=1}^{L-1} <u_0, u_j> / (S (L - 1))``.

    The products are taken in float64 between blocks of ``max(k_max, 32)`` positions, so the
    cost is ``O(L k_max d)`` per head and no ``[L, L]`` matrix is formed unless ``k_max`` is
    close to ``L``. A zero vector has cosine 0 with everything.

    Examples
    --------
    >>> import torch, tl_geometry as tlg
    >>> _ = torch.manual_seed(0)
    >>> v = torch.randn(2, 256, 1, 512)            # independent directions: c(k) ~ 0
    >>> res = tlg.diagnostics.similarity_decay(v, k_max=32)
    >>> res.summary[["mae", "share_negative"]].round(2)   # half the cosines negative
       mae  share_negative
    0  0.0             0.5
    >>> bool(abs(res.summary["rho_0"].iloc[0]) < 0.01)   # the sink is as unrelated as the rest
    True
    >>> bool(res.summary["beta"].iloc[0] > 10)    # exp(-beta k) ~ 0 from the first lag
    True
    >>> list(res.curve.columns)
    ['kv_head', 'k', 'c', 'c_std', 'share_negative', 'n_pairs', 'fit']
    """
    return SimilarityAccumulator(k_max).update(values).result()
