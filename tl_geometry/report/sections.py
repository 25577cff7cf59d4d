"""The text and tables of a report: the header (model, corpus, parameters, timings, versions) and
one summary per analysis, each with what is missing and how to get it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

import numpy as np
import pandas as pd

from tl_geometry.capture.tables import attention_rows
from tl_geometry.errors import InputError
from tl_geometry.io.environment import installed_versions

_METRICS = ["precision", "recall", "f_at_rmax", "f_at_rmin"]


@dataclass
class Summary:
    """What a section shows besides its figures."""

    available: bool
    heading_extra: str = ""  # e.g. "κ = 0.5"
    lead: str = ""  # one paragraph (HTML-escaped by the page)
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    note: str | None = None  # "not available: ..." when not available


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (int, np.integer)) for v in value) and len(value) > 2:
            ints = [int(v) for v in value]
            if ints == list(range(ints[0], ints[-1] + 1)):
                return f"{ints[0]}–{ints[-1]} ({len(ints)})"
        if len(value) > 12:
            head = ", ".join(_fmt(v) for v in value[:6])
            return f"[{head}, … {_fmt(value[-1])}] ({len(value)} values)"
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())
    return str(value)


def _fmt_timing(name: str, value: Any) -> str:
    """``12.50 s`` for a time (a ``*_s`` name), else the value as it is (``world_size``: a count)."""
    if name.endswith("_s") and isinstance(value, (int, float)):
        return f"{value:.2f} s"
    return _fmt(value)


def header_rows(result: Any, run_info: dict | None) -> list[tuple[str, list[tuple[str, str]]]]:
    """The header as groups of ``(label, value)`` rows: model, corpus, parameters, timings, versions."""
    m = result.model
    info = asdict(m) if is_dataclass(m) and not isinstance(m, type) else dict(getattr(m, "__dict__", {}))
    model_rows = [
        ("name", _fmt(info.get("name"))),
        ("kind", _fmt(info.get("kind"))),
        (
            "layers × heads",
            f"{info.get('n_layers')} × {info.get('n_heads')} ({info.get('n_kv_heads')} key/value heads)",
        ),
        ("d_head", _fmt(info.get("d_head"))),
        ("context", _fmt(info.get("n_ctx"))),
        ("BOS token", _fmt(info.get("bos_token_id"))),
        ("values include b_V", _fmt(info.get("values_include_value_bias"))),
    ]
    config = dict(result.config or {})
    corpus_rows = [
        ("corpus", _fmt(config.pop("corpus", None))),
        ("windows", f"{config.pop('n_seqs', '?')} × {config.pop('seq_len', '?')} tokens"),
    ]
    param_rows = [(str(k), _fmt(v)) for k, v in config.items()]
    timings = dict((run_info or {}).get("timings") or {})
    timings.update(result.timings or {})
    time_rows = [(k, _fmt_timing(k, v)) for k, v in timings.items()]
    if run_info and run_info.get("versions"):
        versions = dict(run_info["versions"])
        if run_info.get("python"):
            versions.setdefault("python", run_info["python"])
        version_label = "versions (recorded by the run)"
    else:
        versions = installed_versions()
        version_label = "versions (installed when the report was built)"
    version_rows = [(k, _fmt(v)) for k, v in versions.items()]
    return [
        ("model", model_rows),
        ("corpus", corpus_rows),
        ("parameters", param_rows),
        ("timings", time_rows or [("—", "not recorded")]),
        (version_label, version_rows),
    ]


def _thin_ns(table: pd.DataFrame, limit: int = 24) -> pd.DataFrame:
    """At most about ``limit`` rows of a per-N table: N <= 4, powers of two, and the largest N."""
    if len(table) <= limit or "n" not in table:
        return table
    n = table["n"].astype(int)
    keep = (n <= 4) | ((n & (n - 1)) == 0) | (n == n.max())
    return table[keep]


def separability_summary(result: Any) -> Summary:
    sums = result.separability_sums()  # rows on disk are read in batches, never whole
    if sums is None or len(sums) == 0:
        return Summary(False, note="not available: the result holds no separability rows (run tlg.analyze first)")
    sep = attention_rows(sums)
    mean_by_n = result.mean_by_n()
    by_n = _thin_ns(mean_by_n[["n", *_METRICS]])
    lead = (
        f"{int(sep['n_rows'].sum()):,} rows: {sums.attrs['n_seqs']} windows × {sep['layer'].nunique()} layers × "
        f"{sep['head'].nunique()} heads × {sep['query_pos'].nunique()} query positions × "
        f"{sep['n'].nunique()} selection sizes N. Means over every window, layer, head and query position."
    )
    shown = "" if len(by_n) == mean_by_n.shape[0] else " (N ≤ 4, powers of two and the largest N)"
    return Summary(True, lead=lead, tables=[(f"Mean precision, recall and F by N{shown}", by_n)])


def envelope_summary(result: Any) -> Summary:
    if "precision_lower" not in result.separability_columns():
        return Summary(False, note="not available: run with bounds (tlg.analyze(..., bounds=True))")
    bounds_cfg = (result.config or {}).get("bounds") or {}
    kappa = bounds_cfg.get("kappa")
    try:
        table = result.envelopes()
    except InputError as exc:
        return Summary(False, note=f"not available: {exc}")
    cols = [
        c
        for c in (
            "n",
            "rows",
            "precision",
            "precision_lower",
            "precision_upper",
            "precision_inside",
            "recall",
            "recall_lower",
            "recall_upper",
            "recall_inside",
        )
        if c in table
    ]
    extra = f"κ = {_fmt(kappa)}" + (f", ρ {bounds_cfg['rho']}" if bounds_cfg.get("rho") else "")
    lead = (
        f"Theorems 1–2 and Corollary 1 (definitions §4) with κ = {_fmt(kappa)} (the paper's unnamed concentration "
        "constant). Per N: mean measured value, mean lower / upper envelope, and the share of rows "
        "inside their envelope."
    )
    tables = [(f"Envelopes by N, κ = {_fmt(kappa)}", _thin_ns(table[cols]))]
    return Summary(True, heading_extra=extra, lead=lead, tables=tables)


def _stats(frame: pd.DataFrame, columns: list[str], over: str) -> pd.DataFrame:
    rows = []
    for c in columns:
        if c not in frame:
            continue
        x = pd.to_numeric(frame[c], errors="coerce")
        finite = x[np.isfinite(x)]
        rows.append(
            {
                "statistic": c,
                "over": over,
                "count": int(finite.size),
                "median": float(finite.median()) if finite.size else np.nan,
                "min": float(finite.min()) if finite.size else np.nan,
                "max": float(finite.max()) if finite.size else np.nan,
            }
        )
    return pd.DataFrame(rows)


def diagnostics_summary(result: Any) -> Summary:
    parts = [
        (getattr(result, "value_norms", None), ["sink_ratio", "norm_cv", "sink_ratio_of_mean"], "(layer, kv_head)"),
        (getattr(result, "similarity", None), ["beta", "mae", "share_negative", "rho_0"], "(layer, kv_head)"),
        (getattr(result, "attention_profile", None), ["p_sink", "p_base", "fit_error"], "(layer, head)"),
    ]
    frames = [_stats(t, cols, over) for t, cols, over in parts if isinstance(t, pd.DataFrame)]
    if not frames:
        return Summary(False, note="not available: run with diagnostics (tlg.analyze(..., diagnostics=True))")
    lead = (
        "The paper's three assumptions (definitions §3): compressed sink value norm (sink_ratio ≪ 1), "
        "exponential decay of value cosines with lag (beta, mae), and the attention-weight profile "
        "(sink, plateau, oscillation, recency)."
    )
    profile = getattr(result, "attention_profile", None)
    if isinstance(profile, pd.DataFrame) and "fit_ok" in profile and len(profile):
        lead += f" The profile law fits {int(profile['fit_ok'].sum())} of {len(profile)} heads (fit_ok)."
    k_max = ((result.config or {}).get("diagnostics") or {}).get("k_max")
    extra = f"k_max = {k_max}" if k_max is not None else ""
    return Summary(
        True,
        heading_extra=extra,
        lead=lead,
        tables=[("Summary over layers and heads", pd.concat(frames, ignore_index=True))],
    )


def heads_table(result: Any) -> tuple[pd.DataFrame | None, str | None]:
    """``classify_heads(result)`` and None, or None and why it is not available."""
    try:
        from tl_geometry.taxonomy import classify_heads
    except ImportError as exc:  # pragma: no cover - the taxonomy is part of the package
        return None, f"not available: tl_geometry.taxonomy cannot be imported ({exc})"
    queries = (getattr(result, "config", None) or {}).get("query_positions") or [None]
    try:  # the last analysed query position, as the taxonomy observer's largest one
        return classify_heads(result, query_pos=queries[-1]), None
    except InputError as exc:
        return None, f"not available: run with the head taxonomy (tlg.analyze(..., taxonomy=True)): {exc}"


def _counts_by_layer(heads: pd.DataFrame, column: str, order: list[str]) -> pd.DataFrame:
    counts = pd.crosstab(heads["layer"], heads[column].astype(str))
    counts = counts.reindex(columns=order, fill_value=0)
    counts.loc["all"] = counts.sum()
    counts.columns.name = None
    return counts.reset_index().rename(columns={"index": "layer"})


def _totals(labels: pd.Series, order: list[str]) -> str:
    total = labels.astype(str).value_counts().reindex(order, fill_value=0)
    return ", ".join(f"{k} {v}" for k, v in total.items())


def taxonomy_summary(heads: pd.DataFrame | None, why: str | None) -> Summary:
    if heads is None or len(heads) == 0 or "regime" not in heads:
        return Summary(False, note=why or "not available: run with the head taxonomy")
    regimes = heads["regime"]
    order = list(regimes.cat.categories) if isinstance(regimes.dtype, pd.CategoricalDtype) else sorted(regimes.unique())
    order = [str(o) for o in order]
    mode = heads.attrs.get("mode", "strict")
    lead = (
        f"{len(heads)} heads: {_totals(regimes, order)}. Labels of definitions §5: the candidate regime from the "
        "order of the contributions c_sink, c_last, c_rest, confirmed by its alignment; "
        f"{mode} mode{' (Unclassified when the candidate is not confirmed)' if mode == 'strict' else ''}."
    )
    tables = [(f"Heads per regime and layer ({mode})", _counts_by_layer(heads, "regime", order))]
    if "regime_nearest" in heads.columns and mode != "nearest":
        nearest_order = [o for o in order if o != "Unclassified"]
        lead += f" Nearest mode (every head takes the regime it misses least): {_totals(heads['regime_nearest'], nearest_order)}."
        tables.append(
            ("Heads per regime and layer (nearest)", _counts_by_layer(heads, "regime_nearest", nearest_order))
        )
    thresholds = heads.attrs.get("thresholds")
    if thresholds:
        tables.append(("Thresholds", pd.DataFrame({"threshold": list(thresholds), "value": list(thresholds.values())})))
    return Summary(True, lead=lead, tables=tables)


def head_types_summary(table: pd.DataFrame | None) -> Summary:
    """The lead and the typed heads of a :func:`tl_geometry.head_types` table joined to the regimes."""
    if table is None:
        return Summary(
            False,
            note="not available: pass head_types=tlg.head_types(model, result) to build_report "
            "(previous-token, duplicate-token, induction and current-token scores on repeated random tokens)",
        )
    if not {"head_type", "regime_strict", "regime_nearest"} <= set(table.columns):
        raise InputError("head_types= needs tlg.head_types(model, regimes) with the regimes joined (pass regimes=)")
    kinds = table["head_type"].astype(str)
    typed = table[kinds != "none"]
    threshold = table.attrs.get("threshold")
    lead = (
        f"{len(typed)} of {len(table)} heads have a circuit type (largest TransformerLens head_detector score "
        f"{'>= ' + format(threshold, 'g') if threshold is not None else 'over the threshold'}, on repeated random "
        f"tokens): {_totals(kinds[kinds != 'none'], sorted(set(kinds) - {'none'}))}. "
        "The figures count them by regime; the table lists each typed head with its scores and both labels."
    )
    columns = ["layer", "head", "head_type"] + [c for c in table.columns if c.endswith("_score")]
    listing = typed[[*columns, "regime_strict", "regime_nearest"]].copy()
    for column in columns[3:]:
        listing[column] = listing[column].round(3)
    return Summary(True, lead=lead, tables=[("Typed heads", listing.reset_index(drop=True))])


def read_run_info(text: str) -> dict | None:
    """``run.json`` as the header reads it: its ``timings`` (numbers), ``versions`` (a mapping) and
    ``python`` (a string) kept only in those shapes, so a file of another version (or edited by
    hand) never stops the report; None if it is not a JSON object."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    timings = data.get("timings")
    if isinstance(timings, dict):
        data["timings"] = {str(k): v for k, v in timings.items() if isinstance(v, (int, float))}
    else:
        data.pop("timings", None)
    if not isinstance(data.get("versions"), dict):
        data.pop("versions", None)
    if not isinstance(data.get("python"), str):
        data.pop("python", None)
    return data
