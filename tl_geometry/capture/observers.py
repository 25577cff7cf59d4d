"""Observers: what :func:`tl_geometry.capture.hooks.run_streaming` feeds, layer by layer.

Columns: docs/columns.md#separability.

Every observer of the package follows one protocol, :class:`Observer`:

* ``observe(batch)`` adds one :class:`~tl_geometry.capture.hooks.LayerBatch` (one layer of one forward
  pass);
* ``merge(other)`` adds another observer's content (other sequences, same settings) in place and
  returns ``self``;
* ``state_dict()`` returns everything held so far as plain tensors, numbers, strings, lists and
  dicts (``torch.save``-able), and ``load_state_dict(state)`` puts it back (returns ``self``).

Two kinds exist. *Accumulators* (:class:`~tl_geometry.diagnostics.DiagnosticsObserver`,
:class:`~tl_geometry.taxonomy.TaxonomyObserver`) keep running sums over sequences; their
``state_dict`` is what :func:`tl_geometry.analyze` saves after every batch to resume.
*Row observers* (:class:`RowObserver`: :class:`SeparabilityObserver`,
:class:`~tl_geometry.theory.observer.BoundsObserver`) compute one row per
``(seq, layer, head, query_pos, n)`` and hand them over with ``take()``, which empties them.
:class:`RowMetricsObserver` is the base of the row observers.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd
import torch
from torch import Tensor

import tl_geometry.core.metrics as core_metrics
from tl_geometry.capture.hooks import LayerBatch
from tl_geometry.capture.tables import KEY_COLUMNS, empty_table, head_rows_table, query_rows_table
from tl_geometry.core.engine.layer import separability_of_layer
from tl_geometry.core.layouts import values_per_head
from tl_geometry.core.rankings import (
    DEFAULT_N_RANDOM,
    check_distance,
    check_n_random,
    check_rankings,
    check_seed,
    row_keys,
)
from tl_geometry.core.sizes import NsLike
from tl_geometry.errors import InputError
from tl_geometry.models import ModelInfo

#: Metric columns of the separability table, after :data:`~tl_geometry.capture.tables.KEY_COLUMNS`.
SEPARABILITY_METRICS = core_metrics.SEPARABILITY_METRICS
#: The local output errors of a selection (definitions §7), after the metrics.
LOCAL_ERROR_METRICS = core_metrics.LOCAL_ERROR_METRICS
#: Every column of the separability table after the keys, in order.
SEPARABILITY_COLUMNS = ["rank_by", *SEPARABILITY_METRICS, *LOCAL_ERROR_METRICS, "distance", "n_draws"]

_ROW_STATE_VERSION = 1


@runtime_checkable
class Observer(Protocol):
    """The protocol every observer follows (see the module docstring)."""

    def observe(self, batch: LayerBatch) -> None: ...

    def merge(self, other: Any) -> Any: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> Any: ...


@runtime_checkable
class RowObserver(Observer, Protocol):
    """An :class:`Observer` that gives its rows away: ``take()`` returns them and forgets them."""

    def take(self) -> pd.DataFrame: ...


class RowMetricsObserver:
    """Base of the observers that compute ``[batch, head, n]`` metrics for every chosen query row.

    A subclass sets :attr:`columns` and implements :meth:`metrics` (and :meth:`settings` when it
    has settings beyond ``ns``); this class maps query heads to their key/value heads (definitions §1),
    slices each row to the keys its query sees (``0..q``; on a sliding-window layer of ``W`` keys,
    ``q - W + 1..q``: :meth:`~tl_geometry.models.ModelInfo.first_visible_key`), and keeps the
    results as tidy tables until :meth:`take`.

    Parameters
    ----------
    info : ModelInfo
        The model's geometry.
    ns : None, "all", "log" or list of int
        Selection sizes, resolved per query row (``K`` = its visible keys, ``q + 1`` on a global layer).
    """

    columns: list[str] = []

    def __init__(self, info: ModelInfo, ns: NsLike) -> None:
        self.info = info
        self.ns = ns
        self.kv_head_of = info.kv_head_of()
        self.chunks: list[pd.DataFrame] = []

    def metrics(self, weights: Tensor, values: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """``weights [b, h, K]``, ``values [b, h, K, d]`` -> (``ns``, {column: ``[b, h, n]``})."""
        raise NotImplementedError

    def settings(self) -> dict:
        """What must agree for two observers' rows to be merged (the model geometry and ``ns``)."""
        ns = self.ns if isinstance(self.ns, (str, type(None))) else [int(n) for n in self.ns]
        return {"kind": type(self).__name__, "n_heads": self.info.n_heads, "n_kv_heads": self.info.n_kv_heads, "ns": ns}

    def observe(self, batch: LayerBatch) -> None:
        """Add the rows of one layer of one forward pass, in the key order of the results (per
        sequence and head, the query positions in turn, then ``N``)."""
        values = values_per_head(batch.values, self.kv_head_of)  # [b, h, L, d]
        tables = []
        for qi, q in enumerate(batch.query_positions):
            first = self.info.first_visible_key(batch.layer, q)
            ns, metrics = self.metrics(batch.weights[:, :, qi, first : q + 1], values[:, :, first : q + 1])
            tables.append(head_rows_table(batch, q, ns, self.kv_head_of, metrics))
        self.chunks.append(_in_key_order(tables))

    def take(self) -> pd.DataFrame:
        """The rows gathered since the last call, as one DataFrame (and forget them)."""
        out = pd.concat(self.chunks, ignore_index=True) if self.chunks else empty_table(self.columns)
        self.chunks = []
        return out

    def merge(self, other: "RowMetricsObserver") -> "RowMetricsObserver":
        """Append ``other``'s rows not yet taken (same settings required); returns ``self``."""
        if other.settings() != self.settings():
            raise InputError(f"cannot merge {type(self).__name__}s of different settings: {other.settings()}")
        self.chunks.extend(other.chunks)
        other.chunks = []
        return self

    def state_dict(self) -> dict:
        """The rows not yet taken, as ``{column: numpy array}``, with the settings."""
        rows = pd.concat(self.chunks, ignore_index=True) if self.chunks else empty_table(self.columns)
        return {
            "version": _ROW_STATE_VERSION,
            "settings": self.settings(),
            "rows": {c: rows[c].to_numpy() for c in rows.columns},
        }

    def load_state_dict(self, state: dict) -> "RowMetricsObserver":
        """Replace the rows not yet taken by those of :meth:`state_dict` (same settings)."""
        if state.get("version") != _ROW_STATE_VERSION or state.get("settings") != self.settings():
            raise InputError(
                f"this {type(self).__name__} state was saved with other settings ({state.get('settings')}); "
                f"expected {self.settings()}"
            )
        rows = pd.DataFrame(state["rows"])
        self.chunks = [rows] if len(rows) else []
        return self


class SeparabilityObserver(RowMetricsObserver):
    """Computes :func:`tl_geometry.core.separability` for every head, chosen query row and ranking of a layer.

    One row per ``(seq, layer, head, query_pos, n)`` and ranking with the columns :data:`KEY_COLUMNS`
    and :data:`SEPARABILITY_COLUMNS`: ``rank_by``, the metrics and local errors (float64), the
    ``distance`` and ``n_draws`` (random draws averaged in the row; 1 for the other rankings), as in
    ``AnalysisResult.separability``. The random draws of a row are keyed by its
    ``(seq, layer, head, query_pos)`` (:func:`tl_geometry.core.rankings.row_keys`), so they do not depend
    on the batch or on resuming.

    Parameters
    ----------
    info : ModelInfo
        The model's geometry.
    ns : None, "all", "log" or list of int
        Selection sizes, resolved per query row (``K`` = its visible keys, ``q + 1`` on a global layer).
    dtype : torch.dtype, default torch.float64
        Precision of the computation.
    rank_by : str or sequence of str, default ("attention",)
        The rankings (definitions §7), one block of rows each.
    distance : "euclidean" or "cosine", default "euclidean"
    n_random : int, default 16
        Draws per row of the random control.
    seed : int, default 0
        Seed of the random control.
    kernel : "auto", "numba" or "torch", default "auto"
        The separability route, passed to the engine unchanged (:func:`tl_geometry.core.engine.dispatch.route`
        decides): the compiled numba screen on the CPU where numba imports (``"auto"``), or the
        batched tensor route (``"torch"``; always on a GPU). The rows are the same.

    Examples
    --------
    >>> import torch
    >>> from tl_geometry.capture.hooks import LayerBatch
    >>> from tl_geometry.models import ModelInfo
    >>> info = ModelInfo("toy", "TransformerBridge", 1, 2, 1, 3, 8, 0, True)
    >>> weights = torch.tensor([0.1, 0.2, 0.3, 0.4]).expand(1, 2, 1, 4)  # [batch, head, query, key]
    >>> values = torch.arange(12.0).reshape(1, 4, 1, 3)  # [batch, key, kv_head, d_head]
    >>> batch = LayerBatch(0, torch.tensor([0]), (3,), weights, values)
    >>> obs = SeparabilityObserver(info, ns=[1, 4])
    >>> obs.observe(batch)
    >>> obs.take()[["head", "n", "precision", "recall"]].to_dict("list")
    {'head': [0, 0, 1, 1], 'n': [1, 4, 1, 4], 'precision': [1.0, 1.0, 1.0, 1.0], 'recall': [1.0, 1.0, 1.0, 1.0]}
    """

    columns = SEPARABILITY_COLUMNS

    def __init__(
        self,
        info: ModelInfo,
        ns: NsLike,
        dtype: torch.dtype = torch.float64,
        rank_by: Any = ("attention",),
        distance: str = "euclidean",
        n_random: int = DEFAULT_N_RANDOM,
        seed: int = 0,
        kernel: str = "auto",
    ) -> None:
        super().__init__(info, ns)
        self.dtype = dtype
        self.kernel = kernel
        self.rank_by = check_rankings(rank_by)
        self.distance = check_distance(distance)
        self.n_random = check_n_random(n_random)
        self.seed = check_seed(seed)

    def settings(self) -> dict:
        return {
            **super().settings(),
            "dtype": str(self.dtype),
            "rank_by": list(self.rank_by),
            "distance": self.distance,
            "n_random": self.n_random,
            "seed": self.seed,
        }

    def observe(self, batch: LayerBatch) -> None:
        """Add the rows of one layer of one forward pass.

        :func:`tl_geometry.core.engine.layer.separability_of_layer` computes every chosen query row of the
        layer (it decides how, :func:`tl_geometry.core.engine.dispatch.plan_layer`); each row is cut to the
        keys its query sees (on a sliding-window layer of ``W`` keys, ``q - W + 1..q``). The rows come
        in the key order of the results (per sequence, head and query position: per ranking and
        ``N``), so that the final sort of millions of rows finds them in order.
        """
        queries = batch.query_positions
        heads = torch.arange(batch.weights.shape[1])
        keys = row_keys(
            seq=batch.seq_ids.cpu()[:, None, None],
            layer=batch.layer,
            head=heads[None, :, None],
            query_pos=torch.tensor(queries, dtype=torch.int64)[None, None, :],
        )
        results = separability_of_layer(
            batch.weights,
            batch.values,
            queries,
            self.kv_head_of,
            [self.info.first_visible_key(batch.layer, q) for q in queries],
            self.ns,
            self.rank_by,
            distance=self.distance,
            n_random=self.n_random,
            seed=self.seed,
            row_keys=keys.to(batch.weights.device),
            kernel=self.kernel,
        )
        tables = [
            query_rows_table(
                batch.seq_ids, batch.layer, queries, res.ns, res.valid, self.kv_head_of, self._columns(res)
            )
            for res in results.values()
        ]
        self.chunks.append(_in_key_order(tables))

    def _columns(self, res: Any) -> dict[str, Any]:
        """The columns after the keys of a table of ``res``: the ranking, the metrics and local
        errors, the distance and the draws (one table built at once, without inserting columns)."""
        metrics = {name: getattr(res, name) for name in [*SEPARABILITY_METRICS, *LOCAL_ERROR_METRICS]}
        return {"rank_by": res.rank_by, **metrics, "distance": self.distance, "n_draws": res.n_draws}


def _in_key_order(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """The tables of one layer (each in sequence, head, query, ``N`` order; one per ranking, or per
    query position and ranking) as one, per sequence, head and query position the rankings in
    turn: the key order of the results."""
    table = pd.concat(tables, ignore_index=True)
    if len(tables) > 1:
        by = [table[name].to_numpy() for name in ("query_pos", "head", "seq")]  # lexsort: last key first, stable
        table = table.iloc[np.lexsort(by)].reset_index(drop=True)
    return table


__all__ = [
    "KEY_COLUMNS",
    "Observer",
    "RowMetricsObserver",
    "RowObserver",
    "LOCAL_ERROR_METRICS",
    "SEPARABILITY_COLUMNS",
    "SEPARABILITY_METRICS",
    "SeparabilityObserver",
]
