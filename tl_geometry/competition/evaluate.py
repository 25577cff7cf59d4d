"""Evaluating per-head budgets on held-out windows: ``delta_nll_rel`` at each rule and mean budget.

For every :class:`~tl_geometry.competition.budgets.HeadBudgets` (one rule at one ``B``), one
forward pass over the evaluation windows with ``top_n_attention(model, n=b.n, rank_by=b.rank_by)``:
``delta_nll_rel = (NLL_b - NLL) / NLL`` (definitions §8, §9). The budgets must have been chosen on
other windows of the same length. Columns: docs/columns.md#budget-evaluation.

Examples
--------
>>> import torch
>>> from tl_geometry.testing import tiny_llama_bridge
>>> from tl_geometry.corpus import from_tokens
>>> from tl_geometry.competition.budgets import head_budgets
>>> model = tiny_llama_bridge()
>>> choose, held_out = torch.randint(3, 259, (2, 2, 16))
>>> budgets = [head_budgets(model, from_tokens(choose), mean_budget=b, rule="uniform") for b in (2, 4)]
>>> table = evaluate_budgets(model, from_tokens(held_out), budgets, progress=False)
>>> table[["rule", "mean_budget", "n_full_heads"]].values.tolist()
[['uniform', 2.0, 0], ['uniform', 4.0, 0]]
"""

from __future__ import annotations

import hashlib
import json
import numbers
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch

from tl_geometry.competition.budgets import HeadBudgets, check_budgets
from tl_geometry.core.progress import tqdm
from tl_geometry.corpus import as_corpus, corpus_tokens
from tl_geometry.errors import InputError
from tl_geometry.intervention.context import top_n_attention
from tl_geometry.intervention.loss import check_windows, corpus_nll
from tl_geometry.io.files import write_json_atomic
from tl_geometry.io.store import StoreError, model_fingerprint, tokens_sha256
from tl_geometry.models import describe_model
from tl_geometry.runtime.threads import runs_model

EVALUATION_FILE = "budgets.json"
EVALUATION_COLUMNS = [
    "rule",
    "mean_budget",
    "realised_mean",
    "n_full_heads",
    "nll",
    "nll_full",
    "delta_nll_rel",
    "n_tokens",
]


@runs_model
def evaluate_budgets(
    model: Any,
    corpus: Any,
    budgets: Sequence[HeadBudgets],
    *,
    batch_size: int = 4,
    out_dir: str | Path | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """``delta_nll_rel`` of every budget on ``corpus`` (held-out windows), one forward pass per budget.

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer with eager attention.
    corpus : a corpus or token windows ``[n_seqs, L]`` not used to choose the budgets; ``L`` must be
        the budgets' ``seq_len``.
    budgets : :class:`HeadBudgets` (from :func:`tl_geometry.head_budgets`); every one is checked
        (shape, window length, mean budget met) before any pass.
    batch_size : windows per forward pass.
    out_dir : optional directory: every point is written to ``budgets.json`` as it is measured, and
        a later call with the same model and windows skips the points already there (a point is
        the budget itself, :func:`point_key`: other budgets of one rule and ``B`` are measured).
    progress : progress bar.

    Returns
    -------
    Tidy DataFrame, one row per budget: ``rule, mean_budget, realised_mean, n_full_heads, nll,
    nll_full, delta_nll_rel, n_tokens``.
    """
    info = describe_model(model)
    tokens = check_windows(corpus_tokens(model, as_corpus(corpus, 512), info))
    if isinstance(budgets, HeadBudgets):
        budgets = [budgets]
    budgets = [check_budgets(b, info, tokens.shape[1]) for b in budgets]
    if not budgets:
        raise InputError("no budgets to evaluate: pass at least one HeadBudgets")
    keys = [(b.rule, b.mean_budget) for b in budgets]
    if len(set(keys)) != len(keys):
        raise InputError("two budgets share a (rule, mean_budget): each point is measured once")
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise InputError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    identity = {"model": model_fingerprint(model), "tokens": tokens_sha256(tokens)}
    saved = load_points(out_dir, identity)
    with top_n_attention(model, n=1, layers=0, heads=0):  # refuses a model that ignores pattern edits
        pass
    if "full" not in saved:
        saved["full"] = corpus_nll(model, tokens, batch_size, progress=False).total
        save_points(out_dir, identity, saved)
    n_tokens = int(tokens.shape[0] * (tokens.shape[1] - 1))
    nll_full = saved["full"] / n_tokens
    rows = []
    for budget in tqdm(budgets, desc="budgets", unit="point", disable=not progress):
        key = point_key(budget)
        if key not in saved:
            with top_n_attention(model, n=budget.n, rank_by=budget.rank_by):
                saved[key] = corpus_nll(model, tokens, batch_size, progress=False).total
            save_points(out_dir, identity, saved)
        nll = saved[key] / n_tokens
        rows.append(
            {
                "rule": budget.rule,
                "mean_budget": budget.mean_budget,
                "realised_mean": budget.realised_mean(),
                "n_full_heads": int((budget.n <= 0).sum()),
                "nll": nll,
                "nll_full": nll_full,
                "delta_nll_rel": (nll - nll_full) / nll_full,
                "n_tokens": n_tokens,
            }
        )
    return pd.DataFrame(rows, columns=EVALUATION_COLUMNS)


def point_key(budget: HeadBudgets) -> str:
    """The key of a budget's loss sum in ``budgets.json``: its rule and mean budget, then the
    SHA-256 (16 hex digits) of what it keeps (every head's ``n`` and ranking), so that budgets chosen
    with other settings are measured, not read from the point of the others."""
    digest = hashlib.sha256(budget.n.to(torch.int64).contiguous().cpu().numpy().tobytes())
    digest.update(json.dumps(sorted((f"{layer},{head}", r) for (layer, head), r in budget.rank_by.items())).encode())
    return f"{budget.rule}@{budget.mean_budget!r}#{digest.hexdigest()[:16]}"


def load_points(out_dir: str | Path | None, identity: dict) -> dict[str, float]:
    """The loss sums saved in ``out_dir`` (empty without one); a file of another model or windows is refused."""
    if out_dir is None or not (Path(out_dir) / EVALUATION_FILE).exists():
        return {}
    saved = json.loads((Path(out_dir) / EVALUATION_FILE).read_text())
    if saved.get("identity") != identity:
        raise StoreError(f"{Path(out_dir) / EVALUATION_FILE} holds points of another model or other windows")
    return {str(k): float(v) for k, v in saved["points"].items()}


def save_points(out_dir: str | Path | None, identity: dict, points: dict[str, float]) -> None:
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(out_dir) / EVALUATION_FILE, {"identity": identity, "points": points})


__all__ = ["EVALUATION_COLUMNS", "EVALUATION_FILE", "evaluate_budgets", "load_points", "point_key", "save_points"]
