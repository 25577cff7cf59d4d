"""``AnalysisResult``: the tables one analysis produced, their summaries, and their files.

Columns: docs/columns.md#separability.

:meth:`AnalysisResult.save` writes every table as parquet, the windows as ``tokens.npy`` and the
rest as ``result.json``; :func:`load_result` reads them back. A run with ``out_dir`` keeps its
separability rows on disk until they are first read.
"""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from tl_geometry.capture.observers import LOCAL_ERROR_METRICS, SEPARABILITY_METRICS
from tl_geometry.capture.tables import REFERENCE_RANKING, attention_rows
from tl_geometry.errors import InputError
from tl_geometry.io.checksums import verify_checksums, write_checked
from tl_geometry.io.environment import package_version
from tl_geometry.io.files import write_json_atomic
from tl_geometry.io.row_sums import group_sums, means_of_sums
from tl_geometry.io.rows_on_disk import RowsOnDisk
from tl_geometry.models import ModelInfo
from tl_geometry.taxonomy import classify_heads, rho0_table, sink_effect
from tl_geometry.theory.observer import ENVELOPE_INPUTS, envelope_indicators, envelopes

#: Version of the layout :meth:`AnalysisResult.save` writes (recorded in ``result.json``).
RESULT_FORMAT = 1
#: Key order of the rows of ``AnalysisResult.separability`` (``rank_by`` in the order of the settings).
ROW_ORDER = ["seq", "layer", "head", "query_pos", "rank_by", "n"]
#: Groups of :meth:`AnalysisResult.separability_sums`: every key of a row but the window.
SUM_GROUPS = ["layer", "head", "kv_head", "query_pos", "rank_by", "n"]


@dataclass
class AnalysisResult:
    """Everything :func:`analyze` measured.

    Attributes
    ----------
    separability : DataFrame (property)
        One row per (seq, layer, head, query_pos, n) and ranking with the columns ``seq, layer,
        head, kv_head, query_pos, n, rank_by, precision, recall, r_min, r_max, f_at_rmax,
        f_at_rmin, retained_mass, local_error_del, local_error_ren, distance, n_draws``
        (definitions §2 and §7). Nothing is averaged over rows; a ``rank_by="random"`` row holds
        the mean over its ``n_draws`` random draws. Aggregate it yourself, e.g.
        ``result.separability.groupby(["rank_by", "n"])[["precision", "recall"]].mean()``, or
        with :meth:`mean_by_ranking`. A run with ``out_dir`` (or a :func:`load_result`) keeps these
        rows on disk until this property is first read; its means (:meth:`mean_by_n`,
        :meth:`mean_by_ranking`, :meth:`envelopes`, :meth:`sink_effect`, the figures, the report)
        come from :meth:`separability_sums`, which reads the file in batches: memory does not grow
        with the windows. A run without ``out_dir`` holds its rows in memory.
    rows : DataFrame or RowsOnDisk
        The separability rows as they were handed over: in memory, or on disk and not read yet.
    model : ModelInfo
        The model's geometry (layers, heads, key/value heads, ``d_head``, BOS...).
    config : dict
        Corpus, window length, query positions, selection sizes and dtype used.
    tokens : Tensor [n_seqs, seq_len] or None
        The token windows analysed (row ``seq`` of the tables is row ``seq`` here); None for
        :func:`~tl_geometry.pipeline.cache.analyze_cache` given no tokens.
    timings : dict
        ``total_s`` (wall time of the windows), ``forward_s`` (the model's forward passes and
        bookkeeping: the wall time less the analysis), ``analysis_s`` (time inside the hooks'
        computations), split into ``separability_s``, ``bounds_s``, ``diagnostics_s`` and
        ``taxonomy_s`` (the parts the run computed; their sum is ``analysis_s`` up to the loop
        around them), and ``tables_s`` (after the last window: the rows put in order, the
        attention-profile fits and the regime features). Under torchrun: the slowest rank's
        ``total_s``, the ranks' mean of the analysis times, and ``world_size``.
    value_norms, similarity, attention_profile : DataFrame or None
        With ``diagnostics=True``: per (layer, kv_head) ``sink_ratio, norm_cv, median_norm...``;
        per (layer, kv_head) ``beta, mae, share_negative, rho_0...``; per (layer, head)
        ``p_sink, p_base, eta_osc, omega, eta_exp, T1, T2, fit_error...`` (definitions §3).
    value_norm_curve, similarity_curve, attention_profile_curve : DataFrame or None
        The curves behind them: mean norm by position (Fig. 2), ``c(k)`` by lag with its fit
        (Fig. 3), mean attention by position with the fitted profile (Fig. 4).
    """

    rows: pd.DataFrame | RowsOnDisk = field(repr=False)
    model: ModelInfo
    config: dict
    tokens: Tensor | None = field(repr=False)
    timings: dict = field(default_factory=dict)
    value_norms: pd.DataFrame | None = field(default=None, repr=False)
    similarity: pd.DataFrame | None = field(default=None, repr=False)
    attention_profile: pd.DataFrame | None = field(default=None, repr=False)
    value_norm_curve: pd.DataFrame | None = field(default=None, repr=False)
    similarity_curve: pd.DataFrame | None = field(default=None, repr=False)
    attention_profile_curve: pd.DataFrame | None = field(default=None, repr=False)
    regime_features: pd.DataFrame | None = field(default=None, repr=False)
    _sums: pd.DataFrame | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def separability(self) -> pd.DataFrame:
        """The separability rows (see the class docstring), read from disk on first use."""
        if isinstance(self.rows, RowsOnDisk):
            self.rows = self.rows.load()
        return self.rows

    def separability_sums(self) -> pd.DataFrame:
        """The separability rows summed per (layer, head, kv_head, query_pos, rank_by, n), computed once.

        Every mean over rows that the result, its summaries, figures and report give comes from
        this table (:func:`tl_geometry.io.row_sums.means_of_sums`), so rows kept on disk
        (``out_dir``) are read in batches and never held: memory does not grow with the number of
        windows. Columns: the groups, ``n_rows``, and for every numeric column ``c`` its sum ``c``
        and count ``c__count`` (with bounds, also the indicators of
        :func:`tl_geometry.theory.observer.envelope_indicators`); ``attrs["n_seqs"]`` counts the
        windows.
        """
        if self._sums is None:
            source = self.rows.path if isinstance(self.rows, RowsOnDisk) else self.rows
            columns = self.separability_columns()
            groups = [c for c in SUM_GROUPS if c in columns]
            prepare = envelope_indicators if set(ENVELOPE_INPUTS) <= set(columns) else None
            self._sums = group_sums(source, groups, prepare=prepare)
        return self._sums

    def separability_columns(self) -> list[str]:
        """The columns of the separability table, without reading its rows."""
        if isinstance(self.rows, RowsOnDisk):
            return self.rows.column_names()
        return list(self.rows.columns)

    def mean_by_n(self) -> pd.DataFrame:
        """Mean precision, recall and F-scores per ``N`` over every sequence, layer, head and query,
        for the attention ranking (definitions §2; the other rankings: :meth:`mean_by_ranking`)."""
        return means_of_sums(attention_rows(self.separability_sums()), ["n"])[["n", *SEPARABILITY_METRICS]]

    def mean_by_ranking(self) -> pd.DataFrame:
        """Per ranking and ``N``: the mean of every metric and local error over every sequence, layer,
        head and query position (a random row is already the mean of its draws), and ``n_rows``.

        Rankings come in the order of ``rank_by``; compare attention with the random control at
        each ``N`` (definitions §7).
        """
        table = self.separability_sums()
        if "rank_by" not in table.columns:
            table = table.assign(rank_by=REFERENCE_RANKING)
        metrics = [c for c in [*SEPARABILITY_METRICS, *LOCAL_ERROR_METRICS] if c in table.columns]
        out = means_of_sums(table, ["rank_by", "n"], sort=False)[["rank_by", "n", *metrics, "n_rows"]]
        order = {name: i for i, name in enumerate(self.config.get("rank_by") or table["rank_by"].unique())}
        return out.sort_values(["rank_by", "n"], key=lambda c: c.map(order) if c.name == "rank_by" else c).reset_index(
            drop=True
        )

    def envelopes(self, by: Sequence[str] = ("n",)) -> pd.DataFrame:
        """Per ``N``: mean precision / recall, the mean envelopes, and the share of rows inside.

        Needs ``analyze(..., bounds=True)``. Aggregates over every sequence, layer, head and query
        position (see :func:`tl_geometry.theory.observer.envelopes` for the columns).
        """
        if "precision_lower" not in self.separability_columns():
            raise InputError("this result has no bounds: run tlg.analyze(..., bounds=True) first")
        if set(by) <= set(SUM_GROUPS):
            table = envelopes(self.separability_sums(), by)
        else:
            table = envelopes(attention_rows(self.separability), by)
        table.attrs["kappa"] = (self.config.get("bounds") or {}).get("kappa")
        return table

    def sink_effect(self, query_pos: int | None = None) -> pd.DataFrame:
        """Per ``N``: Pearson and Spearman correlation across (layer, head) of the mean recall(N)
        (over sequences) with ``rho_0``, and ``n_heads`` (definitions §5, Figure 6).

        ``rho_0`` comes from ``regime_features`` (``taxonomy=True``) or, failing that, from
        ``similarity`` (``diagnostics=True``); see :func:`tl_geometry.taxonomy.sink_effect`.
        """
        if self.regime_features is not None:
            rho0 = rho0_table(self.regime_features)
        elif self.similarity is not None:
            rho0 = self.similarity
        else:
            raise InputError("this result has no rho_0: run tlg.analyze(..., taxonomy=True) or diagnostics=True")
        return sink_effect(self.separability_sums(), rho0, query_pos=query_pos)

    def classify_heads(self, query_pos: int | None = None, *, mode: str = "strict", **thresholds: Any) -> pd.DataFrame:
        """Retriever / Reset / Mixer / Unclassified per (layer, head) (definitions §5), ``mode="strict"`` or
        ``"nearest"``; see
        :func:`tl_geometry.taxonomy.classify_heads` for the thresholds and the columns."""
        return classify_heads(self, mode=mode, query_pos=query_pos, **thresholds)

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table this result holds, by attribute name (those not computed are left out)."""
        tables = {name: getattr(self, name) for name in TABLES}
        return {"separability": self.separability, **{k: v for k, v in tables.items() if v is not None}}

    def save(self, directory: str | Path) -> Path:
        """Write every table as ``NAME.parquet``, the windows (if known) as ``tokens.npy`` and the rest as
        ``result.json`` (with the format version) into ``directory`` (created if needed);
        :func:`load_result` reads it back. Each file's SHA-256 is recorded as it is finished
        (:mod:`tl_geometry.io.checksums`); ``result.json`` is written last."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        tables: dict[str, pd.DataFrame | RowsOnDisk | None] = {"separability": self.rows}
        tables.update((name, getattr(self, name)) for name in TABLES)
        for name, table in tables.items():
            if isinstance(table, RowsOnDisk):  # rows still on disk are copied, not read
                write_checked(out / f"{name}.parquet", functools.partial(shutil.copyfile, table.path))
            elif isinstance(table, pd.DataFrame):
                write_checked(out / f"{name}.parquet", functools.partial(table.to_parquet, index=False))
        tokens = self.tokens
        if tokens is not None:
            write_checked(out / "tokens.npy", functools.partial(save_array, tokens.cpu().numpy()))
        meta = {
            "format": RESULT_FORMAT,
            "version": package_version(),
            "model": asdict(self.model),
            "config": self.config,
            "timings": self.timings,
        }
        write_json_atomic(out / "result.json", meta)
        return out

    def __repr__(self) -> str:
        s = self.rows
        layers, n_rows = (
            (s.n_layers, s.n_rows) if isinstance(s, RowsOnDisk) else (s.layer.nunique() if len(s) else 0, len(s))
        )
        return (
            f"AnalysisResult(model={self.model.name!r}, seqs={self.config.get('n_seqs')}, "
            f"seq_len={self.config.get('seq_len')}, "
            f"layers={layers}, heads={self.model.n_heads}, rows={n_rows})"
        )


def save_array(array: np.ndarray, path: Path) -> None:
    """``np.save`` of ``array`` into ``path`` as named (``np.save`` given a name would append ``.npy``),
    the file closed on return."""
    with path.open("wb") as file:
        np.save(file, array)


#: The optional tables of a result besides the separability rows (attribute and file name alike).
TABLES = tuple(f.name for f in fields(AnalysisResult) if f.default is None and f.init)


def load_result(directory: str | Path) -> AnalysisResult:
    """Read an :class:`AnalysisResult` written by :meth:`AnalysisResult.save` (or ``tl-geometry run``).

    Raises :class:`InputError` naming the file when ``directory`` holds no result, a result of
    another format version, or a damaged file (or one whose SHA-256 is not the one recorded when
    it was written).
    """
    src = Path(directory)
    meta = _read_result_json(src)
    tables = {name: src / f"{name}.parquet" for name in TABLES}
    files = ["separability.parquet", "tokens.npy", *(path.name for path in tables.values())]
    verify_checksums(src, files, advice=f"the saved result in {src} cannot be trusted; analyse again")
    return AnalysisResult(
        rows=_read_saved(src / "separability.parquet", RowsOnDisk.of),
        model=ModelInfo(**meta["model"]),
        config=meta["config"],
        timings=meta.get("timings", {}),
        tokens=torch.from_numpy(_read_saved(src / "tokens.npy", np.load))
        if meta["config"].get("tokens", True)
        else None,
        **{name: _read_saved(path, pd.read_parquet) for name, path in tables.items() if path.is_file()},
    )


def _read_result_json(src: Path) -> dict:
    file = src / "result.json"
    if not file.is_file():
        raise InputError(f"{src} holds no saved result (no result.json): save one with result.save({str(src)!r})")
    meta = _read_saved(file, lambda p: json.loads(p.read_text()))
    if not isinstance(meta, dict) or meta.get("format") != RESULT_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise InputError(
            f"{file} was written by another version of tl_geometry (format {found}, this one reads "
            f"{RESULT_FORMAT}): analyse again with this version"
        )
    check_result_entries(file, meta)
    return meta


def check_result_entries(file: Path, meta: dict) -> None:
    """``result.json``'s ``model`` (every :class:`ModelInfo` field, no other), ``config`` and
    ``timings`` (dicts) as this version reads them; else one :class:`InputError` naming the version
    that wrote ``file`` (its ``version``; files before it was recorded have none)."""
    known = {f.name for f in fields(ModelInfo)}
    model, problem = meta.get("model"), None
    if not isinstance(model, dict):
        problem = "no 'model' entry"
    elif set(model) - known:
        problem = f"model keys this version does not know: {sorted(set(model) - known)}"
    elif known - set(model):
        problem = f"no model keys {sorted(known - set(model))}"
    elif not isinstance(meta.get("config"), dict):
        problem = "no 'config' entry"
    elif not isinstance(meta.get("timings", {}), dict):
        problem = "a 'timings' entry that is not a mapping"
    if problem is None:
        return
    wrote = meta.get("version")
    by = f"tl_geometry {wrote}" if isinstance(wrote, str) else "a tl_geometry that did not record its version"
    use = f"read it with tl_geometry {wrote}, or analyse" if isinstance(wrote, str) else "analyse"
    raise InputError(
        f"{file} was written by {by} and holds {problem}: tl_geometry {package_version()} cannot read it; {use} again "
        "with this version"
    )


def _read_saved(path: Path, read: Any) -> Any:
    """``read(path)``, with a missing or damaged file reported as one :class:`InputError`."""
    if not path.is_file():
        raise InputError(f"{path} is missing: the saved result in {path.parent} is incomplete; analyse again")
    try:
        return read(path)
    except Exception as exc:  # numpy, pyarrow and json raise many kinds on a truncated file
        raise InputError(
            f"{path} is damaged ({type(exc).__name__}): the saved result in {path.parent} cannot be read; analyse again"
        ) from None
