"""``DiagnosticsObserver``: the three assumption diagnostics of definitions §3, layer by layer, streamed.

It plugs into :func:`tl_geometry.capture.hooks.run_streaming` like
:class:`tl_geometry.capture.observers.SeparabilityObserver`. For every layer it keeps only mergeable
accumulators (a few ``[kv_head, L]`` / ``[kv_head, k_max]`` / ``[head, K]`` sums), so memory does
not grow with the number of sequences, and two observers (other batches, other machines, or a
saved state) merge into exactly what one observer seeing every sequence would hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pandas as pd
import torch

from tl_geometry.capture.hooks import LayerBatch, check_batch_heads
from tl_geometry.capture.tables import empty_frame
from tl_geometry.diagnostics.accumulators import check_same
from tl_geometry.diagnostics.norms import NORM_COLUMNS, NORM_CURVE_COLUMNS, NormAccumulator
from tl_geometry.diagnostics.profile import (
    DEFAULT_FLOOR,
    DEFAULT_MAX_LOG_ERROR,
    DEFAULT_N_OMEGA,
    PROFILE_COLUMNS,
    PROFILE_CURVE_COLUMNS,
    ProfileAccumulator,
    profile_tables,
)
from tl_geometry.diagnostics.profile_fit import fit_profiles
from tl_geometry.diagnostics.similarity import (
    DEFAULT_K_MAX,
    SIMILARITY_COLUMNS,
    SIMILARITY_CURVE_COLUMNS,
    SimilarityAccumulator,
)
from tl_geometry.errors import InputError
from tl_geometry.io.store import check_state_version
from tl_geometry.models import ModelInfo

_STATE_VERSION = 2  # 1: sums of squares (0.2), refused


@dataclass(frozen=True)
class DiagnosticsTables:
    """The assumption diagnostics of every observed layer (definitions §3), as tidy DataFrames.

    Attributes
    ----------
    value_norms : one row per ``(layer, kv_head)``: ``n_seqs, n_keys, sink_norm, median_norm,
        mean_norm, sink_ratio, norm_cv, sink_ratio_of_mean, norm_cv_of_mean``
        (:func:`tl_geometry.value_norm_stats`).
    similarity : one row per ``(layer, kv_head)``: ``n_seqs, n_keys, k_max, beta, mae,
        share_negative, rho_0`` (:func:`tl_geometry.similarity_decay`).
    attention_profile : one row per ``(layer, head)``: ``kv_head, query_pos, n_seqs, n_keys,
        p_sink, p_base, eta_osc, omega, eta_exp, T1, T2, fit_error, fit_ok, n_floored``
        (:func:`tl_geometry.fit_attention_profile` on the mean row of query ``query_pos``, over
        the keys it sees: on a sliding-window layer of ``W`` keys, the last ``min(W, q + 1)``, so
        that ``p_sink`` is then the weight of the first key of the window).
    value_norm_curve : one row per ``(layer, kv_head, position)``: ``mean_norm, std_norm,
        n_seqs`` (Fig. 2).
    similarity_curve : one row per ``(layer, kv_head, k)``: ``c, c_std, share_negative,
        n_pairs, fit`` (Fig. 3).
    attention_profile_curve : one row per ``(layer, head, position)``: ``kv_head, query_pos,
        alpha, fitted`` (Fig. 4).
    """

    value_norms: pd.DataFrame
    similarity: pd.DataFrame
    attention_profile: pd.DataFrame
    value_norm_curve: pd.DataFrame
    similarity_curve: pd.DataFrame
    attention_profile_curve: pd.DataFrame

    def as_dict(self) -> dict[str, pd.DataFrame]:
        """``{name: DataFrame}`` for the six tables (e.g. to set them on a result object)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class _LayerState:
    norms: NormAccumulator
    similarity: SimilarityAccumulator
    profile: ProfileAccumulator
    query_pos: int
    seqs: set[int] = field(default_factory=set)


class DiagnosticsObserver:
    """Accumulates the assumption diagnostics of definitions §3 for every layer it observes.

    Parameters
    ----------
    info : ModelInfo
        The model's geometry (``n_heads``, ``n_kv_heads``: query head ``h`` reads key/value head
        ``h // (n_heads // n_kv_heads)``).
    k_max : int or None, default 64
        Largest lag of ``c(k)`` (``None``: every lag). Lowered to ``L - 2`` for short windows.
    floor, max_log_error, n_omega
        Settings of the attention-profile fit (see :func:`tl_geometry.fit_attention_profile`).

    Notes
    -----
    ``observe`` reads ``batch.values`` ``[batch, key, kv_head, d_head]`` (every position) for the
    norm and similarity statistics and, for the attention profile, the row of the **last**
    (largest) query position ``q`` of ``batch.weights`` ``[batch, head, query, key]``, keys
    ``0..q``. A sequence id seen twice in a layer is refused (it would be counted twice).

    Examples
    --------
    >>> import torch, tl_geometry as tlg
    >>> from tl_geometry.capture.hooks import run_streaming
    >>> from tl_geometry.testing import tiny_llama_bridge
    >>> model = tiny_llama_bridge()                    # a real one: tlg.load_model("smollm2-135m")
    >>> info = tlg.describe_model(model)
    >>> tokens = torch.randint(3, 259, (8, 64))        # [n_seqs, L] token windows
    >>> obs = tlg.diagnostics.DiagnosticsObserver(info, k_max=16)
    >>> for ids in torch.arange(len(tokens)).split(4):
    ...     run_streaming(model, info, tokens[ids], ids, range(info.n_layers), (tokens.shape[1] - 1,), [obs])
    >>> tables = obs.tables()
    >>> tables.value_norms.groupby("layer").n_seqs.first().tolist()   # every window, in both layers
    [8, 8]
    """

    def __init__(
        self,
        info: ModelInfo,
        k_max: int | None = DEFAULT_K_MAX,
        *,
        floor: float = DEFAULT_FLOOR,
        max_log_error: float = DEFAULT_MAX_LOG_ERROR,
        n_omega: int = DEFAULT_N_OMEGA,
    ) -> None:
        SimilarityAccumulator(k_max)  # validates k_max
        if floor <= 0:
            raise InputError(f"floor must be positive, got {floor}")
        self.info = info
        self.k_max = k_max
        self.floor = float(floor)
        self.max_log_error = float(max_log_error)
        self.n_omega = int(n_omega)
        self.kv_head_of = info.kv_head_of()
        self.layers: dict[int, _LayerState] = {}

    # ------------------------------------------------------------------ accumulate
    def observe(self, batch: LayerBatch) -> None:
        """Add one layer of one forward pass (the accumulators live on the CPU: a batch on another
        device is copied there first)."""
        batch = batch.cpu()
        check_batch_heads(batch, self.info)
        q = max(batch.query_positions)
        qi = batch.query_positions.index(q)
        state = self.layers.get(batch.layer)
        if state is None:
            state = self.layers[batch.layer] = self._new_state(q)
        elif state.query_pos != q:
            raise InputError(
                f"layer {batch.layer}: the attention profile was accumulated at query {state.query_pos}, "
                f"this batch's last query is {q}; use the same query positions for every batch"
            )
        ids = [int(s) for s in batch.seq_ids.tolist()]
        seen = state.seqs.intersection(ids)
        if seen or len(set(ids)) != len(ids):
            raise InputError(f"layer {batch.layer}: sequences {sorted(seen)[:8] or ids} were already observed")
        state.norms.update(batch.values)
        state.similarity.update(batch.values)
        first = self.info.first_visible_key(batch.layer, q)  # a sliding window hides the keys before it
        state.profile.update(batch.weights[:, :, qi, first : q + 1])
        state.seqs.update(ids)

    def merge(self, other: "DiagnosticsObserver") -> "DiagnosticsObserver":
        """Add ``other``'s accumulators to this observer (in place; returns ``self``).

        Both must have the same model geometry and settings, and no sequence in common.
        """
        check_same("diagnostics", self._settings(), other._settings(), "model or settings")
        for layer, theirs in other.layers.items():
            mine = self.layers.get(layer)
            if mine is None:
                self.layers[layer] = _copy_state(theirs)
                continue
            check_same("diagnostics", mine.query_pos, theirs.query_pos, f"query position (layer {layer})")
            common = mine.seqs & theirs.seqs
            if common:
                raise InputError(
                    f"layer {layer}: both observers hold sequences {sorted(common)[:8]}; merging would count them twice"
                )
            mine.norms.merge(theirs.norms)
            mine.similarity.merge(theirs.similarity)
            mine.profile.merge(theirs.profile)
            mine.seqs |= theirs.seqs
        return self

    # ------------------------------------------------------------------ results
    def tables(self, k_fit: int | None = None) -> DiagnosticsTables:
        """The six tables of every layer observed so far (see :class:`DiagnosticsTables`).

        ``k_fit`` fits the exponential of ``c(k)`` on ``k = 1..k_fit`` instead of ``1..k_max``.
        Nothing is forgotten: later ``observe`` calls keep adding to the same accumulators.
        """
        layers = sorted(self.layers)
        norms, norm_curves, sims, sim_curves = [], [], [], []
        for layer in layers:
            st = self.layers[layer]
            nr = st.norms.result()
            k_max = st.similarity.k_max
            sr = st.similarity.result(k_fit=None if k_fit is None or k_max is None else min(k_fit, k_max))
            norms.append(_with_layer(nr.summary, layer))
            norm_curves.append(_with_layer(nr.by_position, layer))
            sims.append(_with_layer(sr.summary, layer))
            sim_curves.append(_with_layer(sr.curve, layer))
        profile, profile_curve = self._profile_tables(layers)
        return DiagnosticsTables(
            value_norms=_concat(norms, ["layer", *NORM_COLUMNS]),
            similarity=_concat(sims, ["layer", *SIMILARITY_COLUMNS]),
            attention_profile=profile,
            value_norm_curve=_concat(norm_curves, ["layer", *NORM_CURVE_COLUMNS]),
            similarity_curve=_concat(sim_curves, ["layer", *SIMILARITY_CURVE_COLUMNS]),
            attention_profile_curve=profile_curve,
        )

    def _profile_tables(self, layers: list[int]) -> tuple[pd.DataFrame, pd.DataFrame]:
        summary_cols = ["layer", "head", "kv_head", "query_pos", *PROFILE_COLUMNS[1:]]
        curve_cols = ["layer", "head", "kv_head", "query_pos", *PROFILE_CURVE_COLUMNS[1:]]
        if not layers:
            return _concat([], summary_cols), _concat([], curve_cols)
        summaries, curves = [], []
        # one vectorised fit for every layer sharing a query position and first visible key (normally
        # all of them; a sliding-window layer's rows hold only the keys its window shows)
        by_query: dict[tuple[int, int], list[int]] = {}
        for layer in layers:
            q = self.layers[layer].query_pos
            by_query.setdefault((q, self.info.first_visible_key(layer, q)), []).append(layer)
        h = self.info.n_heads
        for (q, first), group in by_query.items():
            means = torch.cat([self.layers[layer].profile.mean() for layer in group])  # [layers*h, K]
            fit = fit_profiles(means, floor=self.floor, n_omega=self.n_omega, max_log_error=self.max_log_error)
            summary, curve = profile_tables(fit, means, 0)
            for table in (summary, curve):
                row = table.pop("head").to_numpy()
                table.insert(0, "layer", [group[r // h] for r in row])
                table.insert(1, "head", row % h)
                table.insert(2, "kv_head", self.kv_head_of.numpy()[row % h])
                table.insert(3, "query_pos", q)
            curve["position"] += first  # the key index, past the keys a window hides
            summary["n_seqs"] = [self.layers[layer].profile.n_seqs for layer in summary["layer"]]
            summaries.append(summary)
            curves.append(curve)
        summary = _concat(summaries, summary_cols).sort_values(["layer", "head"], kind="stable")
        curve = _concat(curves, curve_cols).sort_values(["layer", "head", "position"], kind="stable")
        return summary.reset_index(drop=True), curve.reset_index(drop=True)

    @property
    def n_seqs(self) -> dict[int, int]:
        """Sequences observed per layer."""
        return {layer: len(st.seqs) for layer, st in sorted(self.layers.items())}

    # ------------------------------------------------------------------ save / resume
    def state_dict(self) -> dict:
        """Everything accumulated so far (tensors, ints, lists): save with ``torch.save``."""
        return {
            "version": _STATE_VERSION,
            "settings": self._settings(),
            "layers": {
                layer: {
                    "query_pos": st.query_pos,
                    "seqs": sorted(st.seqs),
                    "norms": st.norms.state_dict(),
                    "similarity": st.similarity.state_dict(),
                    "profile": st.profile.state_dict(),
                }
                for layer, st in self.layers.items()
            },
        }

    def load_state_dict(self, state: dict) -> "DiagnosticsObserver":
        """Replace this observer's accumulators by a saved :meth:`state_dict` (same settings)."""
        check_state_version(state, _STATE_VERSION, "diagnostics")
        check_same("diagnostics", self._settings(), _as_settings(state["settings"]), "model or settings")
        self.layers = {
            int(layer): _LayerState(
                norms=NormAccumulator.from_state_dict(s["norms"]),
                similarity=SimilarityAccumulator.from_state_dict(s["similarity"]),
                profile=ProfileAccumulator.from_state_dict(s["profile"]),
                query_pos=int(s["query_pos"]),
                seqs={int(i) for i in s["seqs"]},
            )
            for layer, s in state["layers"].items()
        }
        return self

    def _settings(self) -> tuple:
        i = self.info
        return (i.n_layers, i.n_heads, i.n_kv_heads, i.d_head, self.k_max, self.floor, self.max_log_error, self.n_omega)

    def _new_state(self, query_pos: int) -> _LayerState:
        return _LayerState(NormAccumulator(), SimilarityAccumulator(self.k_max), ProfileAccumulator(), query_pos)


def _as_settings(settings: object) -> tuple:
    return tuple(settings) if isinstance(settings, (list, tuple)) else (settings,)


def _copy_state(st: _LayerState) -> _LayerState:
    return _LayerState(
        norms=NormAccumulator.from_state_dict(st.norms.state_dict()),
        similarity=SimilarityAccumulator.from_state_dict(st.similarity.state_dict()),
        profile=ProfileAccumulator.from_state_dict(st.profile.state_dict()),
        query_pos=st.query_pos,
        seqs=set(st.seqs),
    )


def _with_layer(table: pd.DataFrame, layer: int) -> pd.DataFrame:
    table = table.copy()
    table.insert(0, "layer", layer)
    table["layer"] = table["layer"].astype("int64")
    return table


def _concat(tables: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    if not tables:
        return empty_frame(columns)
    return pd.concat(tables, ignore_index=True)[columns]
