"""The sparsification curve ``delta_nll_rel(N)`` and the effective attention set size (definitions §8).

For every ranking, renormalisation flag and size ``N`` of a grid,
``delta_nll_rel(N) = (NLL_N - NLL) / NLL`` with every attention row restricted to its top-``N``
keys; ``N*_tau = min{N evaluated: delta_nll_rel(N) <= tau}``. With ``out_dir`` every point is
saved as measured and a later call resumes. Details: docs/sparsification.md; columns:
docs/columns.md#sparsification-curve.

Examples
--------
>>> import torch
>>> from tl_geometry.testing import tiny_llama_bridge
>>> from tl_geometry.corpus import from_tokens
>>> corpus = from_tokens(torch.randint(3, 259, (2, 16)))
>>> curve = sparsification_curve(tiny_llama_bridge(), corpus, ns=[1, 4, 16], rank_by="attention",
...                              renormalize=False, progress=False)
>>> list(curve.table.columns)
['rank_by', 'renormalize', 'n', 'nll', 'nll_full', 'delta_nll_rel', 'n_tokens', 'stage']
>>> float(curve.table.query("n == 16").delta_nll_rel.iloc[0])
0.0
"""

from __future__ import annotations

import json
import math
import numbers
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd
import torch

from tl_geometry.core.progress import tqdm
from tl_geometry.core.rankings import RANKINGS, check_rankings, check_seed
from tl_geometry.corpus import as_corpus, corpus_tokens
from tl_geometry.errors import InputError
from tl_geometry.intervention.context import top_n_attention
from tl_geometry.intervention.loss import LossSum, check_targets, check_windows, corpus_nll
from tl_geometry.io.files import write_json_atomic
from tl_geometry.io.lock import RunLock
from tl_geometry.io.store import StoreError, model_fingerprint, tokens_sha256
from tl_geometry.models import describe_model

CURVE_FILE = "curve.json"
CURVE_COLUMNS = ["rank_by", "renormalize", "n", "nll", "nll_full", "delta_nll_rel", "n_tokens", "stage"]
DEFAULT_TOLERANCE = 0.05


def pow2_sizes(seq_len: int) -> list[int]:
    """``1, 2, 4, ...`` up to and including the first power of two ``>= seq_len`` (capped at ``seq_len``)."""
    sizes, n = [], 1
    while n < seq_len:
        sizes.append(n)
        n *= 2
    return sizes + [seq_len]


def check_ns(ns: Any, seq_len: int) -> list[int]:
    """``"pow2"`` or a non-empty list of ints ``>= 1`` as sorted unique sizes."""
    if isinstance(ns, str):
        if ns != "pow2":
            raise InputError(f"ns={ns!r} is not understood: use 'pow2' or a list of sizes like [1, 2, 4, 8]")
        return pow2_sizes(seq_len)
    items = [ns] if isinstance(ns, numbers.Integral) else ns
    try:
        items = list(items)
    except TypeError:
        raise InputError(f"ns must be 'pow2' or a list of ints >= 1, got {ns!r}") from None
    if not items:
        raise InputError("ns is empty: give at least one size N")
    for n in items:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise InputError(f"every size N must be an integer >= 1, got {n!r}")
    return sorted({int(n) for n in items})


def check_renormalize(renormalize: Any) -> tuple[bool, ...]:
    """One flag or several as a tuple without duplicates."""
    flags = (
        [renormalize]
        if isinstance(renormalize, bool)
        else list(renormalize)
        if isinstance(renormalize, (list, tuple))
        else None
    )
    if not flags or not all(isinstance(f, bool) for f in flags):
        raise InputError(f"renormalize must be True, False or a list of them, got {renormalize!r}")
    return tuple(dict.fromkeys(flags))


def check_tolerance(tolerance: Any) -> float:
    """``tau >= 0`` (finite); else one :class:`InputError`."""
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, numbers.Real)
        or not math.isfinite(tolerance)
        or tolerance < 0
    ):
        raise InputError(
            f"tolerance must be a finite number >= 0 (a relative loss increase, e.g. 0.05), got {tolerance!r}"
        )
    return float(tolerance)


@dataclass
class SparsificationCurve:
    """Loss of the top-``N`` intervention by ranking, renormalisation and ``N``.

    Attributes
    ----------
    table : tidy DataFrame ``rank_by, renormalize, n, nll, nll_full, delta_nll_rel, n_tokens,
        stage`` (``stage``: ``"grid"`` or ``"refine"``), one row per point measured.
    nll_full : the full model's NLL (nats per target).
    config : model, windows and settings the curve was measured with.
    """

    table: pd.DataFrame
    nll_full: float
    config: dict
    _measure: Callable[[str, bool, int], dict] | None = field(default=None, repr=False)
    _progress: bool = field(default=False, repr=False)
    _window_totals: dict = field(default_factory=dict, repr=False)

    def window_table(self) -> pd.DataFrame:
        """Each window's float64 NLL sum at every point measured, tidy: ``rank_by, renormalize, n,
        window, total``; the full model as ``rank_by="full"``, ``n`` = the window length (every key
        kept). Empty for points saved by a version that did not keep them. The paired bootstrap of
        context scaling resamples these."""
        rows = [
            {"rank_by": r, "renormalize": f, "n": n, "window": w, "total": t}
            for (r, f, n), totals in self._window_totals.items()
            for w, t in enumerate(totals)
        ]
        return pd.DataFrame(rows, columns=["rank_by", "renormalize", "n", "window", "total"])

    def effective_set_size(self, tolerance: float = DEFAULT_TOLERANCE, refine: bool = True) -> pd.DataFrame:
        """Measure ``N*_tau`` per (rank_by, renormalize): the smallest size with ``delta_nll_rel <= tau``.

        **Runs the model** by default: with ``refine=True`` (needs the live model: a curve from
        :func:`sparsification_curve`, or :func:`load_curve` given the model) the sizes strictly
        between the largest failing size below ``N*`` and ``N*`` are bisected, and each step is one
        more pass of the intervention over every window of the corpus (about ``log2`` of the gap
        per ranking: up to 8 passes where ``N*`` lies between 256 and 512); the new points join
        :attr:`table` (``stage="refine"``) and are not measured again. ``refine=False`` only
        reads the sizes already in :attr:`table` (no pass). One bar, ``N* search``, counts those
        passes (its total, known before the first, is the bisection's most); it is shown when the
        curve was measured with ``progress=True``.

        Returns
        -------
        DataFrame ``rank_by, renormalize, tolerance, n_star, sizes_tried, n_refined`` (``n_star``
        is ``<NA>`` when no size evaluated passes; ``sizes_tried`` lists every size measured).
        """
        tau = check_tolerance(tolerance)
        if not isinstance(refine, bool):
            raise InputError(f"refine must be True or False, got {refine!r}")
        if refine and self._measure is None:
            raise InputError(
                "refine=True needs the model: load the curve with load_curve(out_dir, model, corpus), or pass refine=False"
            )
        groups = list(self.table.groupby(["rank_by", "renormalize"], sort=False).groups)
        most = sum(self._bisection_steps(rank_by, renorm, tau) for rank_by, renorm in groups) if refine else 0
        search = tqdm(total=most, desc="N* search", unit="pass", disable=not self._progress or not most)
        rows = []
        for rank_by, renorm in groups:
            n_refined = 0
            while True:
                points = self._points(rank_by, renorm)
                passing = points[points.delta_nll_rel <= tau].n
                n_star = int(passing.min()) if len(passing) else None
                if not refine or n_star is None:
                    break
                failing = points[(points.n < n_star) & (points.delta_nll_rel > tau)].n
                low = int(failing.max()) if len(failing) else 0
                if n_star - low <= 1:
                    break
                search.set_postfix_str(f"{rank_by}{' renorm' if renorm else ''} N={(low + n_star) // 2}", refresh=False)
                self._add_point(rank_by, renorm, (low + n_star) // 2)
                search.update()
                n_refined += 1
            rows.append(
                {
                    "rank_by": rank_by,
                    "renormalize": bool(renorm),
                    "tolerance": tau,
                    "n_star": pd.NA if n_star is None else n_star,
                    "sizes_tried": ",".join(str(int(n)) for n in sorted(points.n)),
                    "n_refined": n_refined,
                }
            )
        search.close()
        out = pd.DataFrame(rows)
        out["n_star"] = out["n_star"].astype("Int64")
        return out

    def _bisection_steps(self, rank_by: str, renorm: bool, tau: float) -> int:
        """The most passes the bisection of ``N*`` takes from the points measured now: ``ceil(log2(gap))``."""
        points = self._points(rank_by, renorm)
        passing = points[points.delta_nll_rel <= tau].n
        if not len(passing):
            return 0
        n_star = int(passing.min())
        failing = points[(points.n < n_star) & (points.delta_nll_rel > tau)].n
        gap = n_star - (int(failing.max()) if len(failing) else 0)
        return max(0, math.ceil(math.log2(gap))) if gap > 1 else 0

    def n_star_table(self, tolerances: Sequence[float] = (0.01, 0.05, 0.10), refine: bool = True) -> pd.DataFrame:
        """``N*_tau`` at every tolerance (:meth:`effective_set_size`, refined to integers at each
        crossing when ``refine``), with ``censored`` (no size measured passes: ``n_star`` is
        ``<NA>``), ``n_max`` (the largest size measured) and ``n_star_text`` (``"> n_max"`` then).

        Returns
        -------
        DataFrame ``rank_by, renormalize, tolerance, n_star, censored, n_max, n_star_text,
        sizes_tried, n_refined``, one row per (tolerance, rank_by, renormalize).
        """
        items = [tolerances] if isinstance(tolerances, numbers.Real) else list(tolerances)
        if not items:
            raise InputError("tolerances is empty: give at least one tau, e.g. (0.01, 0.05, 0.10)")
        frames = [self.effective_set_size(tau, refine=refine) for tau in sorted({check_tolerance(t) for t in items})]
        out = pd.concat(frames, ignore_index=True)
        out["n_max"] = [max(int(n) for n in tried.split(",")) for tried in out.sizes_tried]
        out["censored"] = out.n_star.isna()
        out["n_star_text"] = [f"> {m}" if c else str(int(n)) for n, c, m in zip(out.n_star, out.censored, out.n_max)]
        columns = ["rank_by", "renormalize", "tolerance", "n_star", "censored", "n_max", "n_star_text"]
        return out[[*columns, "sizes_tried", "n_refined"]]

    def _points(self, rank_by: str, renorm: bool) -> pd.DataFrame:
        t = self.table
        return t[(t.rank_by == rank_by) & (t.renormalize == renorm)].sort_values("n")

    def _add_point(self, rank_by: str, renorm: bool, n: int) -> None:
        if self._measure is None:  # effective_set_size refuses refine=True without the model first
            raise InputError("measuring a size needs the model: load the curve with load_curve(out_dir, model, corpus)")
        row = self._measure(rank_by, renorm, n)
        self.table = pd.concat([self.table, pd.DataFrame([row])], ignore_index=True)[CURVE_COLUMNS]


class _CurveStore:
    """``out_dir/curve.json``: identity, full NLL and every point, rewritten atomically after each point."""

    def __init__(self, out_dir: Path | None, identity: dict, resume: bool, writes: bool = True) -> None:
        self.path = None if out_dir is None else Path(out_dir) / CURVE_FILE
        self.writes = writes  # under torchrun only rank 0 writes (every rank reads, to resume)
        self.identity = identity
        self.full: dict | None = None
        self.rows: list[dict] = []
        if self.path is None:
            return
        if self.path.exists() and resume:
            data = read_curve_json(self.path)
            if data["identity"] != identity:
                diff = sorted(
                    k for k in set(identity) | set(data["identity"]) if identity.get(k) != data["identity"].get(k)
                )
                raise StoreError(
                    f"{self.path} holds a curve of another run (differs in: {', '.join(diff)}): use another out_dir, "
                    "or resume=False to start over"
                )
            self.full, self.rows = data["full"], data["rows"]

    def lookup(self, rank_by: str, renorm: bool, n: int) -> dict | None:
        for row in self.rows:
            if row["rank_by"] == rank_by and row["renormalize"] == renorm and row["n"] == n:
                return row
        return None

    def save(self) -> None:
        if self.path is None or not self.writes:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, {"format": 1, "identity": self.identity, "full": self.full, "rows": self.rows})


def read_curve_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        assert isinstance(data, dict) and data.get("format") == 1 and {"identity", "full", "rows"} <= set(data)
    except (OSError, ValueError, AssertionError) as exc:
        raise StoreError(
            f"{path} is damaged or not a tl_geometry curve ({type(exc).__name__}): delete it, or resume=False"
        ) from exc
    return data


def sparsification_curve(
    model: Any,
    corpus: Any,
    ns: str | Sequence[int] = "pow2",
    rank_by: str | Sequence[str] = RANKINGS,
    renormalize: bool | Sequence[bool] = (False, True),
    *,
    seed: int = 0,
    batch_size: int = 4,
    out_dir: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
    world: Any = None,
    targets: int | None = None,
) -> SparsificationCurve:
    """Measure ``delta_nll_rel(N)`` for every ranking, renormalisation flag and size (definitions §8).

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer with eager attention.
    corpus : a corpus (:mod:`tl_geometry.corpus`) or token windows ``[n_seqs, L]``, ``L >= 2``.
    ns : "pow2" (``1, 2, 4, ...``, then ``L``) or a list of sizes.
    rank_by : one ranking or several (``"attention"``, ``"contribution"``, ``"random"``, ``"sink_window"``).
    renormalize : one flag or several.
    seed : seed of ``"random"`` (draws keyed by window index: independent of ``batch_size``).
    batch_size : windows per forward pass.
    out_dir : write ``curve.json`` there as points are measured, and resume from it.
    resume : False starts over even if ``out_dir`` holds a curve.
    progress : show progress bars.
    world : a started :class:`tl_geometry.pipeline.torchrun.World` (torchrun), or None. Each process runs
        the windows ``i % world.size == world.rank`` (as ``tl-geometry run``), the per-window float64
        NLL sums are gathered by every process and summed in one process's order, so every point
        equals a one-process curve's (exactly with ``batch_size=1``); only rank 0 writes
        ``curve.json``. Every process must make the same calls (refinement included).
    targets : the loss counts only the last ``targets`` positions of every window (default: all
        ``L - 1``), as context scaling does (definitions §9).

    Returns
    -------
    :class:`SparsificationCurve`
    """
    sizes_spec, rankings, flags = ns, check_rankings(rank_by), check_renormalize(renormalize)
    seed = check_seed(seed)
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise InputError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    info = describe_model(model)
    tokens = check_windows(corpus_tokens(model, as_corpus(corpus, 512), info))
    seq_len = int(tokens.shape[1])
    sizes = check_ns(sizes_spec, seq_len)
    if targets is not None:
        targets = check_targets(targets, seq_len)
    identity = {
        "model": info.name,
        "model weights": model_fingerprint(model),
        "token windows": tokens_sha256(tokens),
        "n_seqs": int(tokens.shape[0]),
        "seq_len": seq_len,
        "seed": seed,
        **({} if targets is None else {"targets": targets}),  # absent when all: older curves still resume
    }
    writes = world is None or world.is_main

    def locked() -> Any:
        """``out_dir``'s lock (nested holds of one process are counted), where this process writes."""
        return RunLock(out_dir) if out_dir is not None and writes else nullcontext()

    with locked():
        store = _CurveStore(None if out_dir is None else Path(out_dir), identity, resume, writes)
        shard: dict[str, Any] = {"targets": targets}
        if world is not None:
            from tl_geometry.pipeline.torchrun import shard_windows

            shard |= {
                "windows": shard_windows(int(tokens.shape[0]), world.rank, world.size),
                "gather": world.merge_dicts,
            }
        with top_n_attention(
            model, n=1, rank_by=rankings[0]
        ):  # refuses a model that ignores pattern edits, before any pass
            pass
        if store.full is None:
            full = corpus_nll(model, tokens, batch_size, progress, desc="full model", **shard)
            store.full = {"total": full.total, "n_tokens": full.n_tokens, "window_totals": list(full.window_totals)}
            store.save()
        full = LossSum(**{**store.full, "window_totals": tuple(store.full.get("window_totals", ()))})
        window_totals: dict[tuple[str, bool, int], tuple[float, ...]] = {}
        if full.window_totals:
            window_totals[("full", False, seq_len)] = full.window_totals

        grid = [(r, f, n) for r in rankings for f in flags for n in sizes]
        todo = sum(1 for r, f, n in grid if n < seq_len and store.lookup(r, f, n) is None)
        # one bar over the grid's forward passes: passes left and the time they will take
        passes = tqdm(total=todo, desc="curve passes", unit="pass", disable=not progress or not todo)

        def measure(rank_by: str, renorm: bool, n: int, stage: str = "refine") -> dict:
            row = store.lookup(rank_by, renorm, n)
            if row is not None:
                if row.get("window_totals"):
                    window_totals[(rank_by, renorm, n)] = tuple(row["window_totals"])
                return {**row, "stage": stage if row.get("stage") is None else row["stage"]}
            if n >= seq_len:
                loss = full
            else:
                with top_n_attention(model, n=n, rank_by=rank_by, renormalize=renorm, seed=seed) as state:

                    def set_ids(seq_ids: torch.Tensor) -> None:
                        state.seq_ids = seq_ids

                    desc = f"{rank_by}{' renorm' if renorm else ''} N={n}"
                    in_grid = stage == "grid"
                    if in_grid:
                        passes.set_postfix_str(desc, refresh=False)
                    shown = False  # the grid's passes and the N* search each count on one bar
                    loss = corpus_nll(model, tokens, batch_size, shown, desc=desc, before_batch=set_ids, **shard)
                    if in_grid:
                        passes.update()
            row = {
                "rank_by": rank_by,
                "renormalize": renorm,
                "n": n,
                "nll": loss.nll,
                "nll_full": full.nll,
                "delta_nll_rel": (loss.nll - full.nll) / full.nll,
                "n_tokens": loss.n_tokens,
                "stage": stage,
                "window_totals": list(loss.window_totals),
            }
            if loss.window_totals:
                window_totals[(rank_by, renorm, n)] = loss.window_totals
            store.rows.append(row)
            with locked():  # a size measured after this call returned (refinement) is saved under the lock too
                store.save()
            return row

        try:
            rows = [measure(r, f, n, "grid") for r, f, n in grid]
        finally:
            passes.close()
    table = pd.DataFrame(rows, columns=CURVE_COLUMNS)
    config = {**identity, "ns": sizes, "rank_by": list(rankings), "renormalize": list(flags), "batch_size": batch_size}
    return SparsificationCurve(
        table=table,
        nll_full=full.nll,
        config=config,
        _measure=measure,
        _progress=progress,
        _window_totals=window_totals,
    )


def load_curve(
    out_dir: str | Path, model: Any = None, corpus: Any = None, batch_size: int = 4, progress: bool = True
) -> SparsificationCurve:
    """A curve saved by ``sparsification_curve(..., out_dir=...)``; with ``model`` and ``corpus`` it can be refined."""
    path = Path(out_dir) / CURVE_FILE
    if not path.is_file():
        raise InputError(
            f"{path} does not exist: measure the curve with sparsification_curve(..., out_dir={str(out_dir)!r})"
        )
    data = read_curve_json(path)
    if data["full"] is None:
        raise StoreError(
            f"{path} holds no full-model loss yet: run sparsification_curve again with this out_dir to resume"
        )
    table = pd.DataFrame(data["rows"], columns=CURVE_COLUMNS)
    full = LossSum(data["full"]["total"], data["full"]["n_tokens"])
    measure = None
    if model is not None:
        if corpus is None:
            raise InputError("load_curve needs the corpus together with the model, to measure refinement points")
        grid = table[table.stage == "grid"]
        live = sparsification_curve(
            model,
            corpus,
            ns=sorted(set(grid.n)) or [1],
            rank_by=list(dict.fromkeys(grid.rank_by)) or "attention",
            renormalize=list(dict.fromkeys(bool(f) for f in grid.renormalize)) or False,
            seed=data["identity"].get("seed", 0),
            batch_size=batch_size,
            out_dir=out_dir,
            progress=progress,
            targets=data["identity"].get("targets"),
        )
        return live
    return SparsificationCurve(table=table, nll_full=full.nll, config=dict(data["identity"]), _measure=measure)


__all__ = [
    "CURVE_COLUMNS",
    "SparsificationCurve",
    "check_ns",
    "check_tolerance",
    "load_curve",
    "pow2_sizes",
    "sparsification_curve",
]
