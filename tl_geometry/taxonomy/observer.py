"""``TaxonomyObserver``: the regime features of every head, streamed layer by layer (definitions §5).

It plugs into :func:`tl_geometry.capture.hooks.run_streaming` beside
:class:`tl_geometry.capture.observers.SeparabilityObserver`. Per layer it computes the per-row features
of every head and chosen query row (:func:`~tl_geometry.taxonomy.features.row_features`), adds
them to running sums over sequences, and drops them: memory holds a few ``[head, n]`` sums per
layer, whatever the number of sequences.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Mapping

import pandas as pd
import torch

from tl_geometry.capture.hooks import LayerBatch, check_batch_heads
from tl_geometry.core.checks import check_row_inputs
from tl_geometry.core.layouts import values_per_head
from tl_geometry.core.sizes import DEFAULT_NS, NsLike, clip_ns, resolve_ns
from tl_geometry.errors import InputError
from tl_geometry.io.store import check_state_version
from tl_geometry.models import ModelInfo
from tl_geometry.taxonomy.accumulate import FeatureAccumulator
from tl_geometry.taxonomy.features import row_features, sink_similarity

_STATE_VERSION = 2  # 1: sums of squares (0.2), refused

PartsLike = Mapping[int, Hashable] | Callable[[int], Hashable] | None


def halves(n_seqs: int) -> dict[int, int]:
    """``{seq: 0}`` for the first ``ceil(n_seqs / 2)`` sequences and ``{seq: 1}`` for the rest.

    Two disjoint halves for :func:`tl_geometry.taxonomy.classification_stability`
    (``TaxonomyObserver(info, ns, parts=halves(n_seqs))``).
    """
    if n_seqs < 2:
        raise InputError(f"two halves need at least 2 sequences, got {n_seqs}")
    first = (n_seqs + 1) // 2
    return {i: int(i >= first) for i in range(n_seqs)}


class TaxonomyObserver:
    """Accumulates the definitions §5 regime features of every head of every observed layer.

    Parameters
    ----------
    info : ModelInfo
        The model's geometry (query head ``h`` reads key/value head ``h // (n_heads // n_kv_heads)``).
    ns : None, "all", "log", or list of int, default "log"
        Selection sizes ``N`` of the curves, resolved per query row (``K = q + 1`` keys), as in
        :func:`tl_geometry.analyze`.
    dtype : torch.dtype, default torch.float64
        Precision of the per-row computation (sums are always float64).
    parts : mapping or callable seq_id -> label, optional
        Accumulate groups of sequences separately (e.g. :func:`halves`); :meth:`features` merges
        them exactly. Default: one part, ``0``.

    Notes
    -----
    Per (layer, head, query position ``q``) it averages over sequences the features of the row of
    query ``q`` over keys ``0..q`` (``L = q``). ``rho_0`` is computed once per key/value head, on
    the same keys ``0..q``, and mapped to the query heads that read it; for the default last
    query it is definitions §3's ``rho_0`` over the whole window.

    Examples
    --------
    >>> import torch, tl_geometry as tlg
    >>> from tl_geometry.capture.hooks import run_streaming
    >>> from tl_geometry.capture.observers import SeparabilityObserver
    >>> from tl_geometry.testing import tiny_llama_bridge
    >>> model = tiny_llama_bridge()                    # a real one: tlg.load_model("smollm2-135m")
    >>> info = tlg.describe_model(model)
    >>> tokens = torch.randint(3, 259, (8, 64))        # [n_seqs, L] token windows
    >>> sep, tax = SeparabilityObserver(info, "log"), TaxonomyObserver(info, "log")
    >>> run_streaming(model, info, tokens, torch.arange(len(tokens)), range(info.n_layers), (63,), [sep, tax])
    >>> features = tax.features()                   # one row per (layer, head, query_pos, n)
    >>> heads = tlg.classify_heads(features)        # one row per (layer, head)
    >>> len(heads) == info.n_layers * info.n_heads
    True
    """

    def __init__(
        self,
        info: ModelInfo,
        ns: NsLike = DEFAULT_NS,
        dtype: torch.dtype = torch.float64,
        parts: PartsLike = None,
    ) -> None:
        self.info = info
        self.ns = ns
        self.dtype = dtype
        self.kv_head_of = info.kv_head_of()
        self.parts = parts
        self.acc = FeatureAccumulator(self.kv_head_of)

    def _part_of(self, seq: int) -> Hashable:
        if self.parts is None:
            return 0
        if callable(self.parts):
            return self.parts(seq)
        if seq not in self.parts:
            raise InputError(f"sequence {seq} has no part in `parts`; give every analysed sequence a label")
        return self.parts[seq]

    def observe(self, batch: LayerBatch) -> None:
        """Add one layer of one forward pass (the accumulators live on the CPU: a batch on another
        device is copied there first)."""
        batch = batch.cpu()
        check_batch_heads(batch, self.info)
        check_row_inputs(batch.weights, batch.values)
        values_kv = batch.values.to(self.dtype)  # [b, L, g, d]
        values = values_per_head(values_kv, self.kv_head_of)  # [b, h, L, d]
        seq_ids = [int(s) for s in batch.seq_ids.tolist()]
        labels = [self._part_of(s) for s in seq_ids]
        for qi, q in enumerate(batch.query_positions):
            n_keys = q + 1
            ns = resolve_ns(clip_ns(self.ns, n_keys), n_keys, device=values.device)
            rho_kv = sink_similarity(values_kv[:, :n_keys].transpose(1, 2))  # [b, g]
            accumulate_rows(
                self.acc,
                labels,
                seq_ids,
                batch.layer,
                q,
                ns,
                batch.weights[:, :, qi, :n_keys].to(self.dtype),
                values[:, :, :n_keys],
                rho_kv.index_select(1, self.kv_head_of.to(rho_kv.device)),
            )

    def features(self, part: Any = None) -> pd.DataFrame:
        """The features table (see :data:`tl_geometry.taxonomy.accumulate.TABLE_COLUMNS`).

        One row per ``(layer, head, query_pos, n)``: the mean over the sequences of ``part``
        (None: every sequence observed; a label or a list of labels otherwise) of each definitions §5
        feature, its population std over those sequences (``*_std``) and ``n_seqs``.
        Nothing is forgotten: later ``observe`` calls keep adding to the same sums.
        """
        return self.acc.table(part)

    def state_dict(self) -> dict:
        """The sums gathered so far, as plain tensors, ints, strings and lists (``torch.save``-able).

        With :meth:`load_state_dict` this is the protocol :func:`tl_geometry.analyze` uses to make
        accumulating observers resumable.
        """
        return {"version": _STATE_VERSION, "settings": self._settings(), "accumulator": self.acc.state_dict()}

    def load_state_dict(self, state: dict) -> "TaxonomyObserver":
        """Replace the sums with those of :meth:`state_dict` (same model and ``ns`` required); returns ``self``."""
        check_state_version(state, _STATE_VERSION, "taxonomy")
        if state.get("settings") != self._settings():
            raise InputError(
                f"this taxonomy state was saved with other settings ({state.get('settings')}); "
                f"expected {self._settings()}"
            )
        self.acc = FeatureAccumulator.from_state_dict(state["accumulator"])
        return self

    def _settings(self) -> dict:
        ns = self.ns if isinstance(self.ns, (str, type(None))) else [int(n) for n in self.ns]
        return {"n_heads": self.info.n_heads, "n_kv_heads": self.info.n_kv_heads, "ns": ns, "dtype": str(self.dtype)}

    def merge(self, other: "TaxonomyObserver") -> "TaxonomyObserver":
        """Add ``other``'s sums (other sequences of the same model and settings) into this one."""
        if other._settings() != self._settings():
            raise InputError("cannot merge taxonomy observers of different models or N grids")
        self.acc.merge(other.acc)
        return self


def accumulate_rows(
    acc: FeatureAccumulator,
    labels: list[Hashable],
    seq_ids: list[int],
    layer: int,
    query_pos: int,
    ns: torch.Tensor,
    weights: torch.Tensor,
    values: torch.Tensor,
    rho_0: torch.Tensor,
) -> None:
    """Features of rows ``weights [b, head, K]`` / ``values [b, head, K, d]`` into ``acc``, by part.

    ``rho_0`` is ``[b, head]``; ``labels[i]`` is the part of sequence ``seq_ids[i]``.
    """
    b, h, n_keys = weights.shape
    scalars, curves, _ = row_features(weights.reshape(b * h, n_keys), values.reshape(b * h, n_keys, -1), ns)
    scalars = {k: x.reshape(b, h) for k, x in scalars.items()}
    scalars["rho_0"] = rho_0
    curves = {k: x.reshape(b, h, -1) for k, x in curves.items()}
    for part in dict.fromkeys(labels):
        rows = torch.tensor([i for i, lab in enumerate(labels) if lab == part], dtype=torch.int64)
        acc.add(
            part,
            layer,
            query_pos,
            ns,
            {k: x.index_select(0, rows.to(x.device)) for k, x in scalars.items()},
            {k: x.index_select(0, rows.to(x.device)) for k, x in curves.items()},
            [seq_ids[i] for i in rows.tolist()],
        )
