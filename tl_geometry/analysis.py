"""``analyze``: run a model over a corpus and measure separability for every layer and head.

The result is an :class:`AnalysisResult` whose tables are tidy pandas DataFrames (definitions §6). With
``out_dir`` the per-batch results are written to disk as they are produced
(:class:`~tl_geometry.io.store.RunStore`) and a later call with the same model, windows and settings
resumes where an interrupted one stopped.

``analyze`` is four short steps: the settings are checked on their own
(:class:`~tl_geometry.settings.AnalysisSettings`), then against the model and the windows
(:func:`plan_analysis`); :func:`run_analysis` wires the observers, resumes from the store, runs the
batches and assembles the result.
"""

from __future__ import annotations

import functools
import json
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from tl_geometry.capture.hooks import model_device, run_streaming
from tl_geometry.capture.observers import (
    LOCAL_ERROR_METRICS,
    SEPARABILITY_METRICS,
    Observer,
    RowObserver,
    SeparabilityObserver,
)
from tl_geometry.capture.tables import KEY_COLUMNS, REFERENCE_RANKING, attention_rows, empty_table
from tl_geometry.core.sizes import NsLike
from tl_geometry.corpus import Corpus, TokenCorpus, from_texts, from_tokens
from tl_geometry.diagnostics import DiagnosticsObserver
from tl_geometry.errors import InputError
from tl_geometry.io.files import write_atomic, write_json_atomic
from tl_geometry.io.rows_on_disk import RowsOnDisk
from tl_geometry.io.store import RunStore, run_identity
from tl_geometry.models import ModelInfo, describe_model, load_model
from tl_geometry.settings import AnalysisSettings
from tl_geometry.taxonomy import TaxonomyObserver, classify_heads, rho0_table, sink_effect
from tl_geometry.theory.bounds import RhoLike
from tl_geometry.theory.observer import BoundsObserver, envelopes

#: Version of the layout :meth:`AnalysisResult.save` writes (recorded in ``result.json``).
RESULT_FORMAT = 1
#: Key order of the rows of ``AnalysisResult.separability`` (``rank_by`` in the order of the settings).
ROW_ORDER = ["seq", "layer", "head", "query_pos", "rank_by", "n"]


@dataclass
class AnalysisResult:
    """Everything :func:`analyze` measured.

    Attributes
    ----------
    separability : DataFrame
        One row per (seq, layer, head, query_pos, n) and ranking with the columns ``seq, layer,
        head, kv_head, query_pos, n, rank_by, precision, recall, r_min, r_max, f_at_rmax,
        f_at_rmin, retained_mass, local_error_del, local_error_ren, distance, n_draws``
        (definitions §2 and §7). Nothing is averaged over rows; a ``rank_by="random"`` row holds
        the mean over its ``n_draws`` random draws. Aggregate it yourself, e.g.
        ``result.separability.groupby(["rank_by", "n"])[["precision", "recall"]].mean()``, or
        with :meth:`mean_by_ranking`.
    model : ModelInfo
        The model's geometry (layers, heads, key/value heads, ``d_head``, BOS...).
    config : dict
        Corpus, window length, query positions, selection sizes and dtype used.
    tokens : Tensor [n_seqs, seq_len]
        The token windows analysed (row ``seq`` of the tables is row ``seq`` here).
    timings : dict
        ``total_s`` (wall time), ``analysis_s`` (time inside the hooks' computations) and
        ``forward_s`` (the rest: the model's forward passes and bookkeeping).
    value_norms, similarity, attention_profile : DataFrame or None
        With ``diagnostics=True``: per (layer, kv_head) ``sink_ratio, norm_cv, median_norm...``;
        per (layer, kv_head) ``beta, mae, share_negative, rho_0...``; per (layer, head)
        ``p_sink, p_base, eta_osc, omega, eta_exp, T1, T2, fit_error...`` (definitions §3).
    value_norm_curve, similarity_curve, attention_profile_curve : DataFrame or None
        The curves behind them: mean norm by position (Fig. 2), ``c(k)`` by lag with its fit
        (Fig. 3), mean attention by position with the fitted profile (Fig. 4).
    """

    separability: pd.DataFrame
    model: ModelInfo
    config: dict
    tokens: Tensor = field(repr=False)
    timings: dict = field(default_factory=dict)
    value_norms: pd.DataFrame | None = field(default=None, repr=False)
    similarity: pd.DataFrame | None = field(default=None, repr=False)
    attention_profile: pd.DataFrame | None = field(default=None, repr=False)
    value_norm_curve: pd.DataFrame | None = field(default=None, repr=False)
    similarity_curve: pd.DataFrame | None = field(default=None, repr=False)
    attention_profile_curve: pd.DataFrame | None = field(default=None, repr=False)
    regime_features: pd.DataFrame | None = field(default=None, repr=False)

    def mean_by_n(self) -> pd.DataFrame:
        """Mean precision, recall and F-scores per ``N`` over every sequence, layer, head and query,
        for the attention ranking (definitions §2; the other rankings: :meth:`mean_by_ranking`)."""
        return attention_rows(self.separability).groupby("n")[SEPARABILITY_METRICS].mean().reset_index()

    def mean_by_ranking(self) -> pd.DataFrame:
        """Per ranking and ``N``: the mean of every metric and local error over every sequence, layer,
        head and query position (a random row is already the mean of its draws), and ``n_rows``.

        Rankings come in the order of ``rank_by``; compare attention with the random control at
        each ``N`` (definitions §7).
        """
        table = self.separability
        if "rank_by" not in table.columns:
            table = table.assign(rank_by=REFERENCE_RANKING)
        metrics = [c for c in [*SEPARABILITY_METRICS, *LOCAL_ERROR_METRICS] if c in table.columns]
        grouped = table.groupby(["rank_by", "n"], sort=False)
        out = grouped[metrics].mean()
        out["n_rows"] = grouped.size()
        order = {name: i for i, name in enumerate(self.config.get("rank_by") or table["rank_by"].unique())}
        out = out.reset_index()
        return out.sort_values(["rank_by", "n"], key=lambda c: c.map(order) if c.name == "rank_by" else c).reset_index(
            drop=True
        )

    def envelopes(self, by: Sequence[str] = ("n",)) -> pd.DataFrame:
        """Per ``N``: mean precision / recall, the mean envelopes, and the share of rows inside.

        Needs ``analyze(..., bounds=True)``. Aggregates over every sequence, layer, head and query
        position (see :func:`tl_geometry.theory.observer.envelopes` for the columns).
        """
        if "precision_lower" not in self.separability:
            raise InputError("this result has no bounds: run tlg.analyze(..., bounds=True) first")
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
        return sink_effect(attention_rows(self.separability), rho0, query_pos=query_pos)

    def classify_heads(self, query_pos: int | None = None, *, mode: str = "strict", **thresholds: Any) -> pd.DataFrame:
        """Retriever / Reset / Mixer / Unclassified per (layer, head) (definitions §5), ``mode="strict"`` or
        ``"nearest"``; see
        :func:`tl_geometry.taxonomy.classify_heads` for the thresholds and the columns."""
        return classify_heads(self, mode=mode, query_pos=query_pos, **thresholds)

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if name == "separability" and isinstance(value, RowsOnDisk):  # a run with out_dir: read on first use
            value = value.load()
            object.__setattr__(self, name, value)
        return value

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table this result holds, by attribute name (those not computed are left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), pd.DataFrame)}

    def save(self, directory: str | Path) -> Path:
        """Write every table as ``NAME.parquet``, the windows as ``tokens.npy`` and the rest as
        ``result.json`` (with the format version) into ``directory`` (created if needed);
        :func:`load_result` reads it back. ``result.json`` is written last."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for f in fields(self):
            table = object.__getattribute__(self, f.name)  # rows still on disk are copied, not read
            if isinstance(table, RowsOnDisk):
                write_atomic(out / f"{f.name}.parquet", functools.partial(shutil.copyfile, table.path))
            elif isinstance(table, pd.DataFrame):
                write_atomic(out / f"{f.name}.parquet", functools.partial(table.to_parquet, index=False))
        write_atomic(out / "tokens.npy", lambda p: np.save(p.open("wb"), self.tokens.cpu().numpy()))
        meta = {"format": RESULT_FORMAT, "model": asdict(self.model), "config": self.config, "timings": self.timings}
        write_json_atomic(out / "result.json", meta)
        return out

    def __repr__(self) -> str:
        s = object.__getattribute__(self, "separability")
        layers, n_rows = (
            (s.n_layers, s.n_rows) if isinstance(s, RowsOnDisk) else (s.layer.nunique() if len(s) else 0, len(s))
        )
        return (
            f"AnalysisResult(model={self.model.name!r}, seqs={self.tokens.shape[0]}, seq_len={self.tokens.shape[1]}, "
            f"layers={layers}, heads={self.model.n_heads}, rows={n_rows})"
        )


def load_result(directory: str | Path) -> AnalysisResult:
    """Read an :class:`AnalysisResult` written by :meth:`AnalysisResult.save` (or ``tl-geometry run``).

    Raises :class:`InputError` naming the file when ``directory`` holds no result, a result of
    another format version, or a damaged file.
    """
    src = Path(directory)
    meta = _read_result_json(src)
    names = {f.name for f in fields(AnalysisResult)}
    tables = {p.name[: -len(".parquet")]: p for p in sorted(src.glob("*.parquet"))}
    return AnalysisResult(
        model=ModelInfo(**meta["model"]),
        config=meta["config"],
        timings=meta.get("timings", {}),
        tokens=torch.from_numpy(_read_saved(src / "tokens.npy", np.load)),
        **{name: _read_saved(path, pd.read_parquet) for name, path in tables.items() if name in names},
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
    return meta


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


def analyze(
    model: Any,
    corpus: Corpus | TokenCorpus | str | Sequence[str] | Tensor,
    *,
    ns: NsLike = "log",
    query_positions: Any = "last",
    layers: Sequence[int] | None = None,
    batch_size: int = 4,
    dtype: torch.dtype = torch.float64,
    diagnostics: bool = False,
    taxonomy: bool = True,
    k_max: int | None = 64,
    bounds: bool = False,
    kappa: float = 0.5,
    rho: RhoLike = "measured",
    rank_by: str | Sequence[str] = ("attention",),
    distance: str = "euclidean",
    n_random: int = 16,
    seed: int = 0,
    out_dir: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
    device: str | torch.device | None = None,
) -> AnalysisResult:
    """Measure top-N separability of every attention head of ``model`` over ``corpus``.

    Parameters
    ----------
    model : TransformerBridge, HookedTransformer or str
        A TransformerLens model, or a name for :func:`tl_geometry.load_model`.
    corpus : Corpus, TokenCorpus, str, list of str, or int tensor [n_seqs, seq_len]
        The windows to analyse (see :mod:`tl_geometry.corpus`). Plain text is cut into windows
        of ``min(512, n_ctx)`` tokens; a tensor is taken as token ids.
    ns : None, "all", "log" or list of int, default "log"
        Selection sizes ``N``: "log" is a log-spaced grid (every ``N <= 8``, then 4 per
        doubling, and ``N = K``); None or "all" is every ``N`` from 1 to ``K``.
    query_positions : "last", "all", int, list of int, range or slice, default "last"
        Which query rows to analyse: ``"all"`` is every position; a ``range(start, stop, stride)``
        or ``slice(stride - 1, None, stride)`` takes every ``stride``-th.
        Negative positions count from the end.
    layers : list of int, optional
        Layers to analyse (default all). The forward pass stops after the last one.
    batch_size : int, default 4
        Windows per forward pass. Results do not depend on it.
    dtype : torch.float64 or torch.float32, default torch.float64
        Precision of the separability computation.
    diagnostics : bool, default False
        Also accumulate the assumption diagnostics of definitions §3 (value norms and the sink,
        similarity decay, the attention-weight profile of the largest query position) into
        ``result.value_norms``, ``result.similarity``, ``result.attention_profile`` and their
        curves (see :mod:`tl_geometry.diagnostics`).
    taxonomy : bool, default True
        Also accumulate the definitions §5 regime features of every head (mean and std over sequences,
        per ``N``) into ``result.regime_features``; then ``result.sink_effect()`` and
        ``result.classify_heads()`` (see :mod:`tl_geometry.taxonomy`).
    k_max : int or None, default 64
        Largest lag of the cosine-by-lag curve ``c(k)`` (with ``diagnostics=True``).
    bounds : bool, default False
        Also compute the envelopes of Theorems 1-2 and Corollary 1 (definitions §4) for every row and
        add their columns (``precision_lower``, ``precision_upper``, ``recall_lower``,
        ``recall_upper``, the four ``f_*`` bounds, ``delta``, ``delta0``, ``scale``) to
        ``result.separability``; compare with :meth:`AnalysisResult.envelopes`.
    kappa : float, default 0.5
        The theorems' unnamed concentration constant (used with ``bounds=True``).
    rho : "measured", SimilarityModel or ("model", beta, rho_0), default "measured"
        Source of the cosines in the bounds: the values' own cosines, or the assumption model
        ``exp(-beta |j-k|)`` with ``rho_0`` to the sink (see :func:`tl_geometry.theory.bounds.bounds`).
    rank_by : str or sequence of str, default ("attention",)
        The rankings that define ``I_N`` (definitions §7), one block of rows each in
        ``result.separability`` (column ``rank_by``): ``"attention"`` (definitions §2),
        ``"contribution"`` (``alpha_i ||v_i||``), ``"random"`` (the control: ``n_random`` uniform
        permutations per row, each measured around its own ``s(N)``, averaged) and
        ``"sink_window"`` (the sink and the most recent keys). Everything that reads one
        ranking (taxonomy, bounds, figures, report) reads the attention rows.
    distance : "euclidean" or "cosine", default "euclidean"
        The distance of the balls (definitions §7).
    n_random : int, default 16
        Random draws per row of the random control.
    seed : int, default 0
        Seed of the random control; a row's draws are keyed by (seq, layer, head, query_pos), so
        they do not depend on ``batch_size`` or on resuming.
    out_dir : str or Path, optional
        If given, results are appended to ``out_dir/separability/`` after every batch, and an
        interrupted run with the same arguments resumes from what was written (``resume=True``).
    resume : bool, default True
        With ``out_dir``: continue a previous run instead of refusing to overwrite it.
    progress : bool, default True
        Show a progress bar over sequences.
    device : str or torch.device, optional
        Where the model runs and the analysis computes (the analysis always computes on the
        model's device). A model given by name is loaded there; a model object must already be
        there (``model.to(device)``), else :class:`InputError` says so before any work.

    Returns
    -------
    AnalysisResult
    """
    settings = AnalysisSettings(
        ns=ns, query_positions=query_positions, layers=layers, batch_size=batch_size, dtype=dtype,
        diagnostics=diagnostics, k_max=k_max, taxonomy=taxonomy, bounds=bounds, kappa=kappa, rho=rho,
        rank_by=rank_by, distance=distance, n_random=n_random, seed=seed,
    )  # fmt: skip
    model = place_model(model, device)
    plan = plan_analysis(model, corpus, settings)
    return run_analysis(plan, out_dir=out_dir, resume=resume, progress=progress)


def place_model(model: Any, device: str | torch.device | None) -> Any:
    """``model`` loaded on ``device`` when given by name; a model object checked to be on ``device``.

    Examples
    --------
    >>> place_model("smollm2-135m", "nowhere")
    Traceback (most recent call last):
    ...
    tl_geometry.errors.InputError: device='nowhere' is not a torch device: use 'cpu', 'cuda', 'cuda:1', 'mps'...
    """
    if device is None:
        return model
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"device={device!r} is not a torch device: use 'cpu', 'cuda', 'cuda:1', 'mps'...") from None
    if isinstance(model, str):
        return load_model(model, device=target)
    here = model_device(model)
    if here.type != target.type or (target.index is not None and here.index != target.index):
        raise InputError(
            f"the model is on {here} but device={str(target)!r}: move it first (model.to({str(target)!r})) "
            "or pass the model by name to load it there"
        )
    return model


@dataclass(frozen=True)
class AnalysisPlan:
    """A checked analysis, ready to run: the model, its windows and the settings resolved against them.

    Made by :func:`plan_analysis`; :func:`run_analysis` runs it.

    Attributes
    ----------
    model : the TransformerLens model.
    info : its :class:`ModelInfo`.
    settings : the :class:`~tl_geometry.settings.AnalysisSettings`.
    corpus_name : the corpus's name (recorded in ``config``).
    tokens : int64 tensor [n_seqs, seq_len], the windows.
    layers : the layers to analyse, sorted.
    queries : the query positions, sorted, non-negative.
    """

    model: Any
    info: ModelInfo
    settings: AnalysisSettings
    corpus_name: str
    tokens: Tensor = field(repr=False)
    layers: list[int]
    queries: tuple[int, ...]

    def config(self) -> dict:
        """``AnalysisResult.config``: corpus, geometry of the windows and the settings as used."""
        s = self.settings
        return {
            "corpus": self.corpus_name,
            "n_seqs": int(self.tokens.shape[0]),
            "seq_len": int(self.tokens.shape[1]),
            "ns": s.ns if isinstance(s.ns, str) else list(s.ns),
            "query_positions": list(self.queries),
            "layers": list(self.layers),
            "dtype": str(s.dtype),
            "bounds": {"kappa": s.kappa, "rho": str(s.rho)} if s.bounds else None,
            "diagnostics": {"k_max": s.k_max} if s.diagnostics else None,
            "taxonomy": s.taxonomy,
            "rank_by": list(s.rank_by),
            "distance": s.distance,
            "n_random": s.n_random if s.random_control else None,
            "seed": s.seed if s.random_control else None,
        }

    def identity(self) -> dict[str, Any]:
        """What a saved run must share to be resumed (see :func:`tl_geometry.io.store.run_identity`)."""
        return run_identity(self.model, self.info, self.tokens, self.settings.identity())


def plan_analysis(model: Any, corpus: Any, settings: AnalysisSettings) -> AnalysisPlan:
    """Load the model (when given by name), cut the corpus into windows and check every setting
    against both; raises :class:`InputError` / :class:`ModelError` before any forward pass.

    Parameters
    ----------
    model : TransformerBridge, HookedTransformer or str
        As for :func:`analyze`.
    corpus : Corpus, TokenCorpus, str, list of str, or int tensor [n_seqs, seq_len]
        As for :func:`analyze`.
    settings : AnalysisSettings
        Already checked on their own (at construction).
    """
    model = load_model(model) if isinstance(model, str) else model
    info = describe_model(model)
    corpus = _as_corpus(corpus, default_seq_len=min(512, info.n_ctx))
    if corpus.seq_len > info.n_ctx:
        raise InputError(
            f"seq_len={corpus.seq_len} is longer than the model's context of {info.n_ctx} tokens; "
            f"use seq_len <= {info.n_ctx}"
        )
    layers, queries = settings.resolve(info.n_layers, corpus.seq_len)
    tokens = corpus_tokens(model, corpus, info)
    return AnalysisPlan(model, info, settings, corpus.name, tokens, layers, queries)


def run_analysis(
    plan: AnalysisPlan,
    out_dir: str | Path | None = None,
    *,
    resume: bool = True,
    progress: bool = True,
    windows: Sequence[int] | None = None,
) -> AnalysisResult:
    """Run a checked :class:`AnalysisPlan`; ``out_dir``, ``resume`` and ``progress`` as for :func:`analyze`.

    ``windows`` (default: all) are the indices of the windows this call analyses, for instance one
    process's shard under torchrun (:mod:`tl_geometry.distributed`); the tables' ``seq`` column keeps
    the index of the window in ``plan.tokens``, and the accumulators hold those windows only.
    """
    store = RunStore(out_dir, plan.identity(), resume=resume) if out_dir is not None else None
    wiring = _Wiring.build(plan)
    if store is not None:
        wiring.load_states(store.states)
    done = store.done_seqs() if store is not None else set()
    mine = range(plan.tokens.shape[0]) if windows is None else sorted(set(int(i) for i in windows))
    todo = [i for i in mine if i not in done]
    start = time.perf_counter()
    try:
        kept, analysis_s = _run_batches(plan, wiring, store, todo, progress, initial=len(done))
    except BaseException:
        if store is not None:
            store.discard_if_unused()
        raise
    total_s = time.perf_counter() - start
    empty = empty_table(wiring.columns())
    table: pd.DataFrame | RowsOnDisk
    if store is not None:  # merged on disk, one part at a time: memory does not grow with the windows
        table = store.merge_rows(ROW_ORDER, list(plan.settings.rank_by), empty)
    else:
        table = pd.concat(kept, ignore_index=True) if kept else empty
    timings = {"total_s": total_s, "analysis_s": analysis_s, "forward_s": total_s - analysis_s}
    return _assemble(plan, wiring, table, timings)


@dataclass
class _Wiring:
    """The observers of one run: row observers (taken after every batch, joined on the key columns;
    separability first) and accumulators (whose states are saved after every batch, by name)."""

    rows: list[RowObserver]
    accumulators: dict[str, Observer]
    diagnostics: DiagnosticsObserver | None = None
    taxonomy: TaxonomyObserver | None = None

    @classmethod
    def build(cls, plan: AnalysisPlan) -> "_Wiring":
        s, info = plan.settings, plan.info
        rows: list[RowObserver] = [SeparabilityObserver(info, s.ns, s.dtype, s.rank_by, s.distance, s.n_random, s.seed)]
        if s.bounds:
            rows.append(BoundsObserver(info, s.ns, s.kappa, s.dtype, s.rho))
        diag = DiagnosticsObserver(info, k_max=s.k_max) if s.diagnostics else None
        tax = TaxonomyObserver(info, s.ns, s.dtype) if s.taxonomy else None
        accumulators: dict[str, Observer] = {k: v for k, v in (("diagnostics", diag), ("taxonomy", tax)) if v}
        return cls(rows, accumulators, diag, tax)

    def all(self) -> list[Observer]:
        return [*self.rows, *self.accumulators.values()]

    def columns(self) -> list[str]:
        """The float columns of the joined row table (after the key columns)."""
        return [c for obs in self.rows for c in getattr(obs, "columns", [])]

    def take_rows(self) -> pd.DataFrame:
        """The rows of the last batch, every row observer's columns side by side."""
        table = self.rows[0].take()
        for obs in self.rows[1:]:
            extra = obs.take()  # one ranking (the bounds: attention selection)
            attrs = {**table.attrs, **extra.attrs}
            extra = extra.assign(rank_by=REFERENCE_RANKING)
            table = table.merge(extra, on=[*KEY_COLUMNS, "rank_by"], how="left", validate="one_to_one")
            table.attrs = attrs
        return table

    def states(self) -> dict[str, dict]:
        return {name: obs.state_dict() for name, obs in self.accumulators.items()}

    def load_states(self, states: dict[str, dict]) -> None:
        for name, state in states.items():
            self.accumulators[name].load_state_dict(state)


def _run_batches(
    plan: AnalysisPlan, wiring: _Wiring, store: RunStore | None, todo: list[int], progress: bool, initial: int
) -> tuple[list[pd.DataFrame], float]:
    """Forward passes over the windows ``todo`` in batches; each batch's rows are saved to ``store``
    (with the accumulators' states) or kept. Returns the kept tables and the seconds spent observing."""
    kept: list[pd.DataFrame] = []
    spent: list[float] = []  # seconds inside the observers, per layer
    bar = tqdm(total=initial + len(todo), initial=initial, desc="sequences", unit="seq", disable=not progress)
    try:
        for b0 in range(0, len(todo), plan.settings.batch_size):
            ids = torch.tensor(todo[b0 : b0 + plan.settings.batch_size], dtype=torch.int64)
            run_streaming(
                plan.model, plan.info, plan.tokens[ids], ids, plan.layers, plan.queries, wiring.all(), spent.append
            )
            table = wiring.take_rows()
            if store is not None:
                store.write(ids.tolist(), table, wiring.states())
            else:
                kept.append(table)
            bar.update(len(ids))
    finally:
        bar.close()
    return kept, sum(spent)


def _assemble(plan: AnalysisPlan, wiring: _Wiring, table: pd.DataFrame | RowsOnDisk, timings: dict) -> AnalysisResult:
    """The :class:`AnalysisResult`: the rows in key order (or on disk, already in that order) and
    the accumulators' tables."""
    rows = table
    if isinstance(table, pd.DataFrame):
        order = {name: i for i, name in enumerate(plan.settings.rank_by)}
        table = table.sort_values(
            ROW_ORDER, key=lambda c: c.map(order) if c.name == "rank_by" else c, kind="stable"
        ).reset_index(drop=True)
        rows = table
    extra = wiring.diagnostics.tables().as_dict() if wiring.diagnostics is not None else {}
    if wiring.taxonomy is not None:
        extra["regime_features"] = wiring.taxonomy.features()
    placeholder = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame()
    result = AnalysisResult(
        separability=placeholder, model=plan.info, config=plan.config(), tokens=plan.tokens, timings=timings, **extra
    )
    object.__setattr__(result, "separability", rows)  # RowsOnDisk: read when first used
    return result


def corpus_tokens(model: Any, corpus: Corpus | TokenCorpus, info: ModelInfo | None = None) -> Tensor:
    """The token windows ``[n_seqs, seq_len]`` that :func:`analyze` runs ``model`` on.

    Text is tokenised with the model's tokenizer, documents separated by its EOS token, and
    every window starts with its BOS token when it has one (see :mod:`tl_geometry.corpus`).
    """
    info = info or describe_model(model)
    tokenizer = getattr(model, "tokenizer", None)
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    tokens = corpus.windows(tokenizer, info.bos_token_id, eos)
    vocab = int(getattr(model.cfg, "d_vocab", 0) or 0)
    if tokens.numel() and int(tokens.min()) < 0:
        raise InputError(f"token id {int(tokens.min())} is negative: token ids are indices into the vocabulary (>= 0)")
    if vocab and int(tokens.max()) >= vocab:
        raise InputError(f"token id {int(tokens.max())} is outside the model's vocabulary of {vocab}")
    return tokens


def _as_corpus(corpus: Any, default_seq_len: int) -> Corpus | TokenCorpus:
    if isinstance(corpus, (Corpus, TokenCorpus)):
        return corpus
    if isinstance(corpus, Tensor):
        return from_tokens(corpus)
    if isinstance(corpus, str) or (isinstance(corpus, Sequence) and all(isinstance(t, str) for t in corpus)):
        return from_texts(corpus, seq_len=default_seq_len)
    raise InputError(
        f"corpus of type {type(corpus).__name__} is not understood: pass tl_geometry.corpus.python_docs(), "
        "from_texts([...]), from_tokens(tensor), a string or a list of strings"
    )
