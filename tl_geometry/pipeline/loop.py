"""``run_analysis``: the batch loop of a checked plan, its observers, and the result it assembles.

:class:`Wiring` builds the observers a plan asks for; :func:`run_batches` runs the forward passes
over some windows and hands each batch's rows to a store (or keeps them); :func:`assemble` turns
rows and accumulators into an :class:`~tl_geometry.pipeline.result.AnalysisResult`. One process
calls :func:`run_analysis`; torchrun's ranks call the same pieces
(:func:`tl_geometry.pipeline.torchrun.run_sharded`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd
import torch
from torch import Tensor

from tl_geometry.capture.cached import run_cached
from tl_geometry.capture.hooks import LayerBatch, LayerObserver, model_device, run_streaming
from tl_geometry.capture.observers import Observer, RowObserver, SeparabilityObserver
from tl_geometry.capture.tables import KEY_COLUMNS, REFERENCE_RANKING, empty_table
from tl_geometry.core.progress import tqdm
from tl_geometry.diagnostics import DiagnosticsObserver
from tl_geometry.io.row_order import in_key_order
from tl_geometry.io.rows_on_disk import RowsOnDisk
from tl_geometry.io.store import RunStore
from tl_geometry.pipeline.plan import AnalysisPlan
from tl_geometry.pipeline.result import ROW_ORDER, AnalysisResult
from tl_geometry.runtime.threads import analysis_threads
from tl_geometry.taxonomy import TaxonomyObserver
from tl_geometry.theory.observer import BoundsObserver


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
    process's shard under torchrun (:mod:`tl_geometry.pipeline.torchrun`); the tables' ``seq`` column keeps
    the index of the window in ``plan.tokens``, and the accumulators hold those windows only.
    """
    store = RunStore(out_dir, plan.identity(), resume=resume, repair=True) if out_dir is not None else None
    if store is not None:
        redo_damaged_parts(plan, store)
    wiring = Wiring.build(plan)
    if store is not None:
        wiring.load_states(store.states)
    done = store.done_seqs() if store is not None else set()
    mine = range(plan.n_seqs) if windows is None else sorted(set(int(i) for i in windows))
    todo = [i for i in mine if i not in done]
    start = time.perf_counter()
    try:
        kept, analysis = run_batches(plan, wiring, store, todo, progress, initial=len(done))
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
    timings = {"total_s": total_s, "forward_s": total_s - analysis["analysis_s"], **analysis}
    return assemble(plan, wiring, table, timings)


def redo_damaged_parts(plan: AnalysisPlan, store: RunStore) -> None:
    """Compute again the rows of every damaged part of ``store`` (:attr:`RunStore.damaged`) and
    write them in its place. The saved states already hold those windows: only the row observers
    run (each window's rows do not depend on the others)."""
    for name, windows in list(store.damaged.items()):
        rows_only = Wiring(Wiring.build(plan).rows, {})
        kept, _ = run_batches(plan, rows_only, None, sorted(windows), False, 0)
        store.replace_part(name, pd.concat(kept, ignore_index=True))


@dataclass
class Wiring:
    """The observers of one run, each by the name of its part of the analysis: row observers
    (taken after every batch, joined on the key columns; separability first) and accumulators (whose
    states are saved after every batch, by name)."""

    rows: dict[str, RowObserver]
    accumulators: dict[str, Observer]
    diagnostics: DiagnosticsObserver | None = None
    taxonomy: TaxonomyObserver | None = None

    @classmethod
    def build(cls, plan: AnalysisPlan) -> "Wiring":
        s, info = plan.settings, plan.info
        separability = SeparabilityObserver(
            info, s.ns, s.dtype, s.rank_by, s.distance, s.n_random, s.seed, kernel=s.kernel
        )
        rows: dict[str, RowObserver] = {"separability": separability}
        if s.bounds:
            rows["bounds"] = BoundsObserver(info, s.ns, s.kappa, s.dtype, s.rho)
        diag = DiagnosticsObserver(info, k_max=s.k_max) if s.diagnostics else None
        tax = TaxonomyObserver(info, s.ns, s.dtype) if s.taxonomy else None
        accumulators: dict[str, Observer] = {k: v for k, v in (("diagnostics", diag), ("taxonomy", tax)) if v}
        return cls(rows, accumulators, diag, tax)

    def named(self) -> dict[str, Observer]:
        """Every observer by the name of its part of the analysis: ``separability``, ``bounds``,
        ``diagnostics``, ``taxonomy`` (those the plan asks for), in the order they observe."""
        return {**self.rows, **self.accumulators}

    def columns(self) -> list[str]:
        """The float columns of the joined row table (after the key columns)."""
        return [c for obs in self.rows.values() for c in getattr(obs, "columns", [])]

    def take_rows(self) -> pd.DataFrame:
        """The rows of the last batch, every row observer's columns side by side."""
        first, *others = self.rows.values()
        table = first.take()
        for obs in others:
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


def run_batches(
    plan: AnalysisPlan, wiring: Wiring, store: RunStore | None, todo: list[int], progress: bool, initial: int
) -> tuple[list[pd.DataFrame], dict[str, float]]:
    """Forward passes (or reads of the cache) over the windows ``todo`` in batches; each batch's rows are saved to ``store``
    (with the accumulators' states) or kept. Returns the kept tables and the seconds spent observing:
    ``analysis_s`` in all and ``<part>_s`` for each part of :meth:`Wiring.named` (their sum, up to
    the loop around them).

    Each batch runs on the CPUs free when it starts (:func:`tl_geometry.runtime.threads.analysis_threads`).
    The progress bar (:func:`progress_bar`) moves as each layer of a batch is observed."""
    device = model_device(plan.model) if plan.model is not None else torch.device("cpu")
    kept: list[pd.DataFrame] = []
    spent: list[float] = []  # seconds inside the observers, per layer
    parts = {name: _Timed(obs) for name, obs in wiring.named().items()}  # and in each observer
    n_layers = max(len(plan.layers), 1)
    bar = progress_bar(initial + len(todo), initial, n_layers, progress)
    batch = {"windows": 0, "layers": 0}  # the running batch: its windows, its layers counted on the bar

    def on_layer(seconds: float) -> None:
        spent.append(seconds)
        if batch["layers"] < n_layers:
            batch["layers"] += 1
            if len(spent) == 1:  # the process's first layer: warm-up (imports, compiled kernels)
                count_without_rate(bar, batch["windows"])
            else:
                bar.update(batch["windows"])

    try:
        for b0 in range(0, len(todo), plan.settings.batch_size):
            ids = torch.tensor(todo[b0 : b0 + plan.settings.batch_size], dtype=torch.int64)
            batch.update(windows=len(ids), layers=0)
            with analysis_threads(device):
                feed(plan, ids, list(parts.values()), on_layer)
            table = wiring.take_rows()
            if store is not None:
                store.write(ids.tolist(), table, wiring.states())
            else:
                kept.append(table)
            bar.update(len(ids) * (n_layers - batch["layers"]))  # layers the feed did not report
    finally:
        bar.close()
    return kept, {"analysis_s": sum(spent), **{f"{name}_s": part.seconds for name, part in parts.items()}}


class _Timed:
    """An observer's :meth:`observe`, its seconds added up in :attr:`seconds`."""

    def __init__(self, observer: Observer) -> None:
        self.observer, self.seconds = observer, 0.0

    def observe(self, batch: LayerBatch) -> None:
        start = time.perf_counter()
        self.observer.observe(batch)
        self.seconds += time.perf_counter() - start


def progress_bar(n_windows: int, done: int, n_layers: int, show: bool) -> tqdm:
    """The bar of a run over ``n_windows`` windows (``done`` of them saved before): it counts one
    window's layer at a time, ``n_windows * n_layers`` in all, so it moves while a batch runs.
    Its rate is the mean since the warm-up (:func:`count_without_rate`), not a moving average."""
    return tqdm(
        total=n_windows * n_layers,
        initial=done * n_layers,
        desc=f"analysis ({n_windows} windows x {n_layers} layers)",
        unit="layer",
        disable=not show,
        smoothing=0,
    )


def count_without_rate(bar: tqdm, steps: int) -> None:
    """Count ``steps`` done as warm-up: the rate, and so the time left, is measured from now on.

    A process's first layer loads the analyses and their compiled kernels (a minute on a busy
    machine against seconds for the next one): estimated from it, the time left was 25 x too long.
    """
    if bar.disable:
        return
    bar.n += steps
    bar.initial = bar.n  # the rate counts the steps after these (tqdm: (n - initial) / elapsed)
    bar.start_t = bar.last_print_t = bar._time()
    bar.refresh()


def feed(
    plan: AnalysisPlan, ids: Tensor, observers: Sequence[LayerObserver], on_layer_time: Callable[[float], None]
) -> None:
    """Hand the observers every layer of the windows ``ids``: from a forward pass
    (:func:`~tl_geometry.capture.hooks.run_streaming`) or from the plan's cache
    (:func:`~tl_geometry.capture.cached.run_cached`)."""
    if plan.cached is not None:

        def queries_of_length(length: int) -> tuple[int, ...]:  # a padded cache's rows of ``length`` real tokens
            return plan.settings.resolve(plan.info.n_layers, length, plan.info.sliding_windows)[1]

        run_cached(plan.cached, plan.info, ids, plan.layers, plan.queries, observers, on_layer_time, queries_of_length)
        return
    if plan.tokens is None:
        raise ValueError("an AnalysisPlan needs tokens or cached activations")
    run_streaming(plan.model, plan.info, plan.tokens[ids], ids, plan.layers, plan.queries, observers, on_layer_time)


def assemble(plan: AnalysisPlan, wiring: Wiring, table: pd.DataFrame | RowsOnDisk, timings: dict) -> AnalysisResult:
    """The :class:`AnalysisResult`: the rows in key order (or on disk, already in that order) and
    the accumulators' tables; ``timings`` gains ``tables_s``, the time this takes."""
    start = time.perf_counter()
    # on the CPUs free now, as the batches: the accumulators' float64 element-wise operations
    # (MKL's) on torch's default threads waited ~20 ms each for a busy CPU, 3 x the analysis
    with analysis_threads("cpu"):
        rows = table
        if isinstance(table, pd.DataFrame):
            rows = in_key_order(table, ROW_ORDER, plan.settings.rank_by)
        extra = wiring.diagnostics.tables().as_dict() if wiring.diagnostics is not None else {}
        if wiring.taxonomy is not None:
            extra["regime_features"] = wiring.taxonomy.features()
    timings = {**timings, "tables_s": time.perf_counter() - start}
    return AnalysisResult(
        rows=rows, model=plan.info, config=plan.config(), tokens=plan.tokens, timings=timings, **extra
    )
