"""``analyze``: run a model over a corpus and measure separability for every layer and head.

The result is an :class:`AnalysisResult` whose tables are tidy pandas DataFrames (SPEC §6). With
``out_dir`` the per-batch results are written to disk as they are produced and a later call with
the same arguments resumes where an interrupted one stopped.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from .capture import resolve_query_positions, run_streaming
from .diagnostics import DiagnosticsObserver
from .taxonomy import TaxonomyObserver, classify_heads, rho0_table, sink_effect
from .corpus import Corpus, TokenCorpus, from_texts, from_tokens
from .errors import InputError
from .models import ModelInfo, describe_model, load_model
from .selection import NsLike, resolve_ns
from .observers import SEPARABILITY_METRICS, Observer, RowObserver, SeparabilityObserver
from .tables import empty_table
from .theory.bounds import RhoLike
from .theory.observer import BoundsObserver, envelopes, join_bounds

def _empty_separability() -> pd.DataFrame:
    return empty_table(SEPARABILITY_METRICS)


@dataclass
class AnalysisResult:
    """Everything :func:`analyze` measured.

    Attributes
    ----------
    separability : DataFrame
        One row per (seq, layer, head, query_pos, n) with the columns ``seq, layer, head,
        kv_head, query_pos, n, precision, recall, r_min, r_max, f_at_rmax, f_at_rmin``
        (SPEC §2). Nothing is averaged: aggregate it yourself, e.g.
        ``result.separability.groupby("n")[["precision", "recall"]].mean()``.
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
        ``p_sink, p_base, eta_osc, omega, eta_exp, T1, T2, fit_error...`` (SPEC §3).
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
        """Mean precision, recall and F-scores per ``N`` over every sequence, layer, head and query."""
        return self.separability.groupby("n")[SEPARABILITY_METRICS].mean().reset_index()

    def envelopes(self, by: Sequence[str] = ("n",)) -> pd.DataFrame:
        """Per ``N``: mean precision / recall, the mean envelopes, and the share of rows inside.

        Needs ``analyze(..., bounds=True)``. Aggregates over every sequence, layer, head and query
        position (see :func:`tl_geometry.theory.observer.envelopes` for the columns).
        """
        if "precision_lower" not in self.separability:
            raise InputError("this result has no bounds: run tlg.analyze(..., bounds=True) first")
        table = envelopes(self.separability, by)
        table.attrs["kappa"] = (self.config.get("bounds") or {}).get("kappa")
        return table

    def sink_effect(self, query_pos: int | None = None) -> pd.DataFrame:
        """Per ``N``: Pearson and Spearman correlation across (layer, head) of the mean recall(N)
        (over sequences) with ``rho_0``, and ``n_heads`` (SPEC §5, Figure 6).

        ``rho_0`` comes from ``regime_features`` (``taxonomy=True``) or, failing that, from
        ``similarity`` (``diagnostics=True``); see :func:`tl_geometry.taxonomy.sink_effect`.
        """
        if self.regime_features is not None:
            rho0 = rho0_table(self.regime_features)
        elif self.similarity is not None:
            rho0 = self.similarity
        else:
            raise InputError("this result has no rho_0: run tlg.analyze(..., taxonomy=True) or diagnostics=True")
        return sink_effect(self.separability, rho0, query_pos=query_pos)

    def classify_heads(self, query_pos: int | None = None, **thresholds: Any) -> pd.DataFrame:
        """Retriever / Reset / Mixer / Unclassified per (layer, head) (SPEC §5); see
        :func:`tl_geometry.taxonomy.classify_heads` for the thresholds and the columns."""
        return classify_heads(self, query_pos=query_pos, **thresholds)

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table this result holds, by attribute name (those not computed are left out)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if isinstance(getattr(self, f.name), pd.DataFrame)
        }

    def save(self, directory: str | Path) -> Path:
        """Write every table as ``NAME.parquet``, the windows as ``tokens.npy`` and the rest as
        ``result.json`` into ``directory`` (created if needed); :func:`load_result` reads it back."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for name, table in self.tables().items():
            tmp = out / f"{name}.parquet.tmp"
            table.to_parquet(tmp, index=False)
            tmp.replace(out / f"{name}.parquet")
        np.save(out / "tokens.npy", self.tokens.cpu().numpy())
        meta = {"model": asdict(self.model), "config": self.config, "timings": self.timings}
        (out / "result.json").write_text(json.dumps(meta, indent=2, default=str))
        return out

    def __repr__(self) -> str:
        s = self.separability
        return (
            f"AnalysisResult(model={self.model.name!r}, seqs={self.tokens.shape[0]}, seq_len={self.tokens.shape[1]}, "
            f"layers={s.layer.nunique() if len(s) else 0}, heads={self.model.n_heads}, rows={len(s)})"
        )


def load_result(directory: str | Path) -> AnalysisResult:
    """Read an :class:`AnalysisResult` written by :meth:`AnalysisResult.save` (or ``tl-geometry run``)."""
    src = Path(directory)
    if not (src / "result.json").is_file():
        raise InputError(f"{src} holds no saved result (no result.json): run `tl-geometry run --out {src}` first")
    meta = json.loads((src / "result.json").read_text())
    names = {f.name for f in fields(AnalysisResult)}
    tables = {p.name[: -len(".parquet")]: pd.read_parquet(p) for p in sorted(src.glob("*.parquet"))}
    return AnalysisResult(
        model=ModelInfo(**meta["model"]),
        config=meta["config"],
        timings=meta.get("timings", {}),
        tokens=torch.from_numpy(np.load(src / "tokens.npy")),
        **{name: table for name, table in tables.items() if name in names},
    )


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
    out_dir: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
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
    query_positions : "last", int, list of int, or range, default "last"
        Which query rows to analyse; a ``range(start, stop, stride)`` takes every ``stride``-th.
        Negative positions count from the end.
    layers : list of int, optional
        Layers to analyse (default all). The forward pass stops after the last one.
    batch_size : int, default 4
        Windows per forward pass. Results do not depend on it.
    dtype : torch.dtype, default torch.float64
        Precision of the separability computation.
    diagnostics : bool, default False
        Also accumulate the assumption diagnostics of SPEC §3 (value norms and the sink,
        similarity decay, the attention-weight profile of the largest query position) into
        ``result.value_norms``, ``result.similarity``, ``result.attention_profile`` and their
        curves (see :mod:`tl_geometry.diagnostics`).
    taxonomy : bool, default True
        Also accumulate the SPEC §5 regime features of every head (mean and std over sequences,
        per ``N``) into ``result.regime_features``; then ``result.sink_effect()`` and
        ``result.classify_heads()`` (see :mod:`tl_geometry.taxonomy`).
    k_max : int or None, default 64
        Largest lag of the cosine-by-lag curve ``c(k)`` (with ``diagnostics=True``).
    bounds : bool, default False
        Also compute the envelopes of Theorems 1-2 and Corollary 1 (SPEC §4) for every row and
        add their columns (``precision_lower``, ``precision_upper``, ``recall_lower``,
        ``recall_upper``, the four ``f_*`` bounds, ``delta``, ``delta0``, ``scale``) to
        ``result.separability``; compare with :meth:`AnalysisResult.envelopes`.
    kappa : float, default 0.5
        The theorems' unnamed concentration constant (used with ``bounds=True``).
    rho : "measured", SimilarityModel or ("model", beta, rho_0), default "measured"
        Source of the cosines in the bounds: the values' own cosines, or the assumption model
        ``exp(-beta |j-k|)`` with ``rho_0`` to the sink (see :func:`tl_geometry.theory.bounds.bounds`).
    out_dir : str or Path, optional
        If given, results are appended to ``out_dir/separability/`` after every batch, and an
        interrupted run with the same arguments resumes from what was written (``resume=True``).
    resume : bool, default True
        With ``out_dir``: continue a previous run instead of refusing to overwrite it.
    progress : bool, default True
        Show a progress bar over sequences.

    Returns
    -------
    AnalysisResult
    """
    model = load_model(model) if isinstance(model, str) else model
    info = describe_model(model)
    corpus = _as_corpus(corpus, default_seq_len=min(512, info.n_ctx))
    if corpus.seq_len > info.n_ctx:
        raise InputError(
            f"seq_len={corpus.seq_len} is longer than the model's context of {info.n_ctx} tokens; "
            f"use seq_len <= {info.n_ctx}"
        )
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
    layer_list = _resolve_layers(layers, info.n_layers)
    queries = resolve_query_positions(query_positions, corpus.seq_len)
    for q in queries:  # validate ns against every row length before running anything
        resolve_ns(ns, q + 1)

    tokens = corpus_tokens(model, corpus, info)

    config = {
        "corpus": corpus.name,
        "n_seqs": int(tokens.shape[0]),
        "seq_len": int(tokens.shape[1]),
        "ns": ns if isinstance(ns, (str, type(None))) else [int(n) for n in ns],
        "query_positions": list(queries),
        "layers": layer_list,
        "dtype": str(dtype),
        "bounds": {"kappa": float(kappa), "rho": str(rho)} if bounds else None,
        "diagnostics": {"k_max": k_max} if diagnostics else None,
        "taxonomy": taxonomy,
    }
    store = _ResultStore(Path(out_dir), config, resume) if out_dir is not None else None
    # observers whose rows are taken after every batch (separability first, then the bounds)
    row_observers: list[RowObserver] = [SeparabilityObserver(info, ns, dtype)]
    if bounds:
        row_observers.append(BoundsObserver(info, ns, kappa, dtype, rho))
    # observers that accumulate over sequences; their state is saved with every batch
    accumulators: dict[str, Observer] = {}
    diag = DiagnosticsObserver(info, k_max=k_max) if diagnostics else None
    tax = TaxonomyObserver(info, ns, dtype) if taxonomy else None
    if diag is not None:
        accumulators["diagnostics"] = diag
    if tax is not None:
        accumulators["taxonomy"] = tax
    if store:
        for name, state in store.load_states().items():
            accumulators[name].load_state_dict(state)
    observers: list[Observer] = [*row_observers, *accumulators.values()]
    done = store.done_seqs() if store else set()
    todo = [i for i in range(tokens.shape[0]) if i not in done]
    kept: list[pd.DataFrame] = []
    analysis_s = 0.0

    def add_time(seconds: float) -> None:
        nonlocal analysis_s
        analysis_s += seconds

    start = time.perf_counter()
    bar = tqdm(total=tokens.shape[0], initial=len(done), desc="sequences", unit="seq", disable=not progress)
    try:
        for b0 in range(0, len(todo), batch_size):
            ids = torch.tensor(todo[b0 : b0 + batch_size], dtype=torch.int64)
            run_streaming(model, info, tokens[ids], ids, layer_list, queries, observers, add_time)
            table = row_observers[0].take()
            for extra_rows in row_observers[1:]:
                table = join_bounds(table, extra_rows.take())
            if store:
                store.write(ids.tolist(), table, {name: acc.state_dict() for name, acc in accumulators.items()})
            else:
                kept.append(table)
            bar.update(len(ids))
    finally:
        bar.close()
    total_s = time.perf_counter() - start
    table = store.read() if store else (pd.concat(kept, ignore_index=True) if kept else _empty_separability())
    table = table.sort_values(["seq", "layer", "head", "query_pos", "n"], kind="stable").reset_index(drop=True)
    extra = diag.tables().as_dict() if diag is not None else {}
    if tax is not None:
        extra["regime_features"] = tax.features()
    return AnalysisResult(
        separability=table,
        model=info,
        config=config,
        tokens=tokens,
        timings={"total_s": total_s, "analysis_s": analysis_s, "forward_s": total_s - analysis_s},
        **extra,
    )


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


def _resolve_layers(layers: Sequence[int] | None, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    out = sorted({int(layer) for layer in layers})
    if not out:
        raise InputError("layers is empty: give at least one layer or None for all")
    bad = [layer for layer in out if not 0 <= layer < n_layers]
    if bad:
        raise InputError(f"layers {bad} do not exist: the model has layers 0..{n_layers - 1}")
    return out


class _ResultStore:
    """Per-batch parquet parts in ``out_dir/separability/`` plus ``out_dir/progress.json``.

    A part and the accumulators' states (``out_dir/state/NAME-NNNNNN.pt``) are written (to a
    temporary name, then renamed) before ``progress.json`` records them and their sequences as
    done, so an interruption at any moment leaves a directory that resumes without loss or
    duplicates. Older state files are deleted only after that record.
    """

    def __init__(self, out_dir: Path, config: dict, resume: bool) -> None:
        self.dir = out_dir
        self.parts = out_dir / "separability"
        self.progress = out_dir / "progress.json"
        self.config = config
        if self.progress.exists():
            saved = json.loads(self.progress.read_text())
            if not resume:
                raise InputError(f"{out_dir} already holds results: pass resume=True to continue, or another out_dir")
            if saved["config"] != config:
                raise InputError(
                    f"{out_dir} holds a run with other settings ({saved['config']}); use another out_dir "
                    "or the same settings to resume"
                )
            self.state = saved
        else:
            self.parts.mkdir(parents=True, exist_ok=True)
            self.state = {"config": config, "done": [], "parts": [], "states": {}}
            self._save()
        self.states_dir = out_dir / "state"

    def done_seqs(self) -> set[int]:
        return set(self.state["done"])

    def write(self, seq_ids: list[int], table: pd.DataFrame, states: dict[str, dict]) -> None:
        name = f"part-{seq_ids[0]:06d}-{seq_ids[-1]:06d}.parquet"
        tmp = self.parts / (name + ".tmp")
        table.to_parquet(tmp, index=False)
        tmp.replace(self.parts / name)
        n_done = len(self.state["done"]) + len(seq_ids)
        old_files = dict(self.state.get("states", {}))
        new_files = {}
        self.states_dir.mkdir(exist_ok=True)
        for key, state in states.items():
            file = f"{key}-{n_done:06d}.pt"
            torch.save(state, self.states_dir / (file + ".tmp"))
            (self.states_dir / (file + ".tmp")).replace(self.states_dir / file)
            new_files[key] = file
        self.state["done"].extend(seq_ids)
        self.state["parts"].append(name)
        self.state["states"] = new_files
        self._save()
        for file in set(old_files.values()) - set(new_files.values()):
            (self.states_dir / file).unlink(missing_ok=True)

    def load_states(self) -> dict[str, dict]:
        """The accumulators' states recorded as done (empty for a new run)."""
        return {key: torch.load(self.states_dir / file) for key, file in self.state.get("states", {}).items()}

    def read(self) -> pd.DataFrame:
        frames = [pd.read_parquet(self.parts / name) for name in self.state["parts"]]
        return pd.concat(frames, ignore_index=True) if frames else _empty_separability()

    def _save(self) -> None:
        tmp = self.progress.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        tmp.replace(self.progress)
