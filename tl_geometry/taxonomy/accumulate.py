"""Sums over sequences of the regime features, and the tidy per-(layer, head, N) table they give.

Columns: docs/columns.md#regime_features.

For every (part, layer, query position) the accumulator keeps, per head (and per ``N`` for the
curves), the mergeable moments of each feature over sequences (:class:`~tl_geometry.core.moments.Moments`:
count, mean and ``M2``, in float64), and the spread is their population standard deviation
``sqrt(M2 / count)``: the same numbers for any batching, resume or number of ranks. The leave-one-out norms are defined
only where the removed key is selected, so they have their own counts (``sink_in`` / ``last_in``
in the table are the share of sequences where they are defined). Parts let one pass accumulate
disjoint groups of sequences (for instance two halves) that merge exactly into the whole.
"""

from __future__ import annotations

from typing import Hashable, Iterable

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from tl_geometry.capture.tables import HEAD_KEY_COLUMNS, empty_frame
from tl_geometry.core.moments import Moments
from tl_geometry.core.numerics import ACC_DTYPE
from tl_geometry.errors import InputError
from tl_geometry.taxonomy.features import CURVE_FEATURES, SCALAR_FEATURES

_LOO = {"norm_s_minus_sink": "sink_in", "norm_s_minus_last": "last_in"}

FEATURE_COLUMNS = (
    ["n_seqs"]
    + [c for name in SCALAR_FEATURES for c in (name, f"{name}_std")]
    + ["cos_s_v0", "cos_s_v0_std", "cos_s_vL", "cos_s_vL_std", "norm_s", "norm_s_std"]
    + ["norm_s_minus_sink", "norm_s_minus_sink_std", "sink_in", "norm_s_minus_last", "norm_s_minus_last_std", "last_in"]
)
#: Columns of the features table (:meth:`FeatureAccumulator.table`).
TABLE_COLUMNS = HEAD_KEY_COLUMNS + FEATURE_COLUMNS


class _State:
    """Moments for one (part, layer, query position): ``[head]`` scalars, ``[head, n]`` curves."""

    def __init__(self, n_heads: int, ns: Tensor) -> None:
        self.ns = ns.cpu()
        g = len(ns)
        self.count = 0
        self.moments = {name: Moments.zeros((n_heads,)) for name in SCALAR_FEATURES}
        self.moments.update({name: Moments.zeros((n_heads, g)) for name in CURVE_FEATURES})
        self.seqs: set[int] = set()

    def add(self, scalars: dict[str, Tensor], curves: dict[str, Tensor], seq_ids: list[int]) -> None:
        """Add rows of ``len(seq_ids)`` sequences: scalars [b, head], curves [b, head, n]."""
        self.count += len(seq_ids)
        self.seqs.update(seq_ids)
        for name, x in {**scalars, **curves}.items():
            x = x.to(ACC_DTYPE).cpu()
            defined = ~torch.isnan(x) if name in _LOO else None
            self.moments[name] = self.moments[name].merge(Moments.of(x, dim=0, defined=defined))

    def merge(self, other: "_State") -> None:
        if not torch.equal(self.ns, other.ns):
            raise InputError("cannot merge regime features computed on different N grids")
        common = self.seqs & other.seqs
        if common:
            raise InputError(f"sequences {sorted(common)[:8]} were accumulated twice; merging would count them twice")
        self.count += other.count
        self.seqs |= other.seqs
        for name in self.moments:
            self.moments[name] = self.moments[name].merge(other.moments[name])

    def copy(self) -> "_State":
        out = _State(self.moments["c_sink"].count.shape[0], self.ns)
        out.merge(self)
        return out


class FeatureAccumulator:
    """Mergeable moments of the regime features over sequences, keyed by (part, layer, query_pos).

    ``add`` takes the per-row features of one layer, one query position and a batch of sequences
    (rows ``[batch, head]``); ``table`` turns the sums into the tidy features table.
    """

    def __init__(self, kv_head_of: Tensor) -> None:
        self.kv_head_of = kv_head_of.cpu()
        self.states: dict[tuple[Hashable, int, int], _State] = {}

    @property
    def parts(self) -> list[Hashable]:
        """The part labels seen so far, in first-seen order."""
        return list(dict.fromkeys(part for part, _, _ in self.states))

    def add(
        self,
        part: Hashable,
        layer: int,
        query_pos: int,
        ns: Tensor,
        scalars: dict[str, Tensor],
        curves: dict[str, Tensor],
        seq_ids: Iterable[int],
    ) -> None:
        ids = [int(s) for s in seq_ids]
        key = (part, int(layer), int(query_pos))
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = _State(len(self.kv_head_of), ns)
        elif not torch.equal(state.ns, ns.cpu()):
            raise InputError(f"layer {layer}, query {query_pos}: the N grid changed between batches")
        seen = state.seqs.intersection(ids)
        if seen or len(set(ids)) != len(ids):
            raise InputError(
                f"layer {layer}, query {query_pos}: sequences {sorted(seen)[:8] or ids} were already observed"
            )
        state.add(scalars, curves, ids)

    def merge(self, other: "FeatureAccumulator") -> "FeatureAccumulator":
        """Add ``other``'s sums into this accumulator (in place; returns ``self``)."""
        if not torch.equal(self.kv_head_of, other.kv_head_of):
            raise InputError("cannot merge regime features of models with different head grouping")
        for key, theirs in other.states.items():
            if key in self.states:
                self.states[key].merge(theirs)
            else:
                self.states[key] = theirs.copy()
        return self

    def state_dict(self) -> dict:
        """Everything the accumulator holds, as plain tensors, ints and lists (for ``torch.save``)."""
        return {
            "kv_head_of": self.kv_head_of.clone(),
            "states": [
                {
                    "key": list(key),
                    "ns": st.ns.clone(),
                    "count": st.count,
                    "seqs": sorted(st.seqs),
                    "moments": {k: m.state_dict() for k, m in st.moments.items()},
                }
                for key, st in self.states.items()
            ],
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> "FeatureAccumulator":
        """The accumulator saved by :meth:`state_dict`."""
        acc = cls(state["kv_head_of"])
        for item in state["states"]:
            st = _State(len(acc.kv_head_of), item["ns"])
            st.count, st.seqs = int(item["count"]), set(item["seqs"])
            st.moments = {k: Moments.from_state_dict(m) for k, m in item["moments"].items()}
            acc.states[tuple(item["key"])] = st
        return acc

    def table(self, part: Hashable | list[Hashable] | None = None) -> pd.DataFrame:
        """The features table of the chosen parts (None: every part), summed over sequences.

        One row per ``(layer, head, query_pos, n)``, columns :data:`TABLE_COLUMNS`: the mean of
        every feature over the sequences of those parts, its population std (``*_std``) and
        ``n_seqs``; per-head scalars (``c_*``, ``rho_0``) repeat on every ``n`` of the head.
        """
        wanted = None if part is None else set(part if isinstance(part, list) else [part])
        if wanted is not None and not wanted & set(self.parts):
            raise InputError(f"part {part!r} was not observed; parts seen: {self.parts}")
        merged: dict[tuple[int, int], _State] = {}
        for (p, layer, q), state in self.states.items():
            if wanted is not None and p not in wanted:
                continue
            if (layer, q) in merged:
                merged[(layer, q)].merge(state)
            else:
                merged[(layer, q)] = state.copy()
        frames = [self._frame(layer, q, merged[(layer, q)]) for layer, q in sorted(merged)]
        if not frames:
            return empty_table()
        return pd.concat(frames, ignore_index=True)

    def _frame(self, layer: int, q: int, st: _State) -> pd.DataFrame:
        n_heads, g = st.moments["cos_s_v0"].count.shape
        heads = np.repeat(np.arange(n_heads), g)
        cols: dict[str, np.ndarray] = {
            "layer": np.full(n_heads * g, layer, dtype=np.int64),
            "head": heads,
            "kv_head": self.kv_head_of.numpy()[heads],
            "query_pos": np.full(n_heads * g, q, dtype=np.int64),
            "n": np.tile(st.ns.numpy(), n_heads),
            "n_seqs": np.full(n_heads * g, st.count, dtype=np.int64),
        }
        for name in SCALAR_FEATURES:
            m = st.moments[name]
            cols[name] = np.repeat(m.mean_or_nan().numpy(), g)
            cols[f"{name}_std"] = np.repeat(m.std().numpy(), g)
        for name in CURVE_FEATURES:
            m = st.moments[name]
            cols[name] = m.mean_or_nan().reshape(-1).numpy()
            cols[f"{name}_std"] = m.std().reshape(-1).numpy()
            if name in _LOO:
                cols[_LOO[name]] = (m.count / max(st.count, 1)).reshape(-1).numpy()
        return pd.DataFrame(cols)[TABLE_COLUMNS]


def empty_table() -> pd.DataFrame:
    """A features table with no rows and the right columns."""
    return empty_frame(TABLE_COLUMNS, int_columns=[*HEAD_KEY_COLUMNS, "n_seqs"])
