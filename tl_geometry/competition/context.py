"""Context scaling: the same prediction targets seen through longer contexts (definitions §9).

For every document and context length ``L``, the targets are the document's last ``T`` tokens and
the window is ``BOS + (L - 1)`` text tokens before them (``L`` text tokens without a BOS), so
every ``L`` predicts exactly the same tokens. Per ``L``: the full ``NLL(L)`` over those ``T``
targets, ``delta_nll_rel(N; L)`` of the top-``N`` intervention and ``N*_tau(L)``, reported beside
``N*_tau(L) / L``. Each ``L`` is one :func:`~tl_geometry.intervention.sparsification_curve` over
the documents' windows (its passes, its resume and its torchrun sharding); columns:
docs/columns.md#context-scaling.

Examples
--------
>>> import torch
>>> from tl_geometry.testing import tiny_llama_bridge
>>> from tl_geometry.corpus import from_tokens
>>> docs = from_tokens(torch.randint(3, 259, (2, 40)))   # one row per document
>>> table = context_scaling(tiny_llama_bridge(), docs, contexts=(8, 16), targets=4, ns=[1, 4],
...                         rank_by="attention", renormalize=False, progress=False)
>>> table[["context", "n", "n_tokens"]].values.tolist()
[[8, 1, 8], [8, 4, 8], [16, 1, 8], [16, 4, 8]]
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch
from torch import Tensor

from tl_geometry.core.checks import is_integer
from tl_geometry.core.progress import tqdm
from tl_geometry.core.rankings import check_rankings
from tl_geometry.corpus import Corpus, as_corpus, corpus_documents
from tl_geometry.errors import InputError
from tl_geometry.intervention.curve import (
    DEFAULT_TOLERANCE,
    check_ns,
    check_renormalize,
    check_tolerance,
    sparsification_curve,
)
from tl_geometry.models import ModelInfo, describe_model
from tl_geometry.runtime.threads import runs_model

DEFAULT_CONTEXTS = (128, 256, 512, 1024)
CONTEXT_COLUMNS = [
    "context",
    "rank_by",
    "renormalize",
    "n",
    "nll",
    "nll_full",
    "delta_nll_rel",
    "n_tokens",
    "stage",
    "tolerance",
    "n_star",
    "n_star_over_context",
    "censored",
    "n_max",
    "n_star_text",
    "n_docs",
    "targets",
]


def check_contexts(contexts: Any) -> list[int]:
    """Sorted unique context lengths, each an int ``>= 2``."""
    items = [contexts] if isinstance(contexts, numbers.Integral) else contexts
    try:
        items = list(items)
    except TypeError:
        raise InputError(f"contexts must be a list of ints like (128, 256, 512), got {contexts!r}") from None
    if not items:
        raise InputError("contexts is empty: give at least one context length L")
    for L in items:
        if not is_integer(L) or L < 2:
            raise InputError(f"every context length must be an integer >= 2, got {L!r}")
    return sorted({int(L) for L in items})


def select_documents(docs: list[list[int]], needed: int, n_docs: int | None, skip_short: bool) -> tuple[list[int], int]:
    """Indices of the documents used (the first ``n_docs`` of at least ``needed`` tokens) and how many were skipped.

    Without ``skip_short`` the first ``n_docs`` documents are used and a short one is refused by its index.
    """
    pool = docs if n_docs is None or skip_short else docs[:n_docs]
    chosen, skipped = [], 0
    for i, doc in enumerate(pool):
        if len(doc) >= needed:
            chosen.append(i)
            if n_docs is not None and len(chosen) == n_docs:
                break
        elif skip_short:
            skipped += 1
        else:
            raise InputError(
                f"document {i} has {len(doc)} tokens, fewer than the {needed} that the longest context plus the "
                "targets need: pass skip_short=True to skip short documents, or use shorter contexts or fewer targets"
            )
    if not chosen or (n_docs is not None and len(chosen) < n_docs):
        raise InputError(
            f"the corpus has {len(chosen)} documents of at least {needed} tokens ({skipped} shorter ones skipped), "
            f"not the {n_docs or 1} asked for: lower n_docs, max(contexts) or targets, or use longer documents"
        )
    return chosen, skipped


def context_windows(docs: Sequence[Sequence[int]], context: int, targets: int, bos_token_id: int | None) -> Tensor:
    """Windows ``[n_docs, context + targets]``: BOS (if any), then the text before each document's last ``targets`` tokens."""
    text = context + targets - (0 if bos_token_id is None else 1)
    body = torch.tensor([list(doc[-text:]) for doc in docs], dtype=torch.int64)
    if bos_token_id is None:
        return body
    return torch.cat([torch.full((body.shape[0], 1), bos_token_id, dtype=torch.int64), body], dim=1)


def check_context_inputs(info: ModelInfo, contexts: list[int], targets: Any, n_docs: Any) -> tuple[int, int | None]:
    """``targets`` (``1 <= T < min(contexts)``) and ``n_docs``, against the model's context."""
    if isinstance(targets, bool) or not isinstance(targets, numbers.Integral) or int(targets) < 1:
        raise InputError(f"targets must be an integer >= 1 (the last tokens of each document), got {targets!r}")
    targets = int(targets)
    if targets >= contexts[0]:
        raise InputError(
            f"targets={targets} is not below the shortest context {contexts[0]}: use T < L for every context"
        )
    if contexts[-1] + targets > info.n_ctx:
        raise InputError(
            f"the longest context {contexts[-1]} plus {targets} targets is {contexts[-1] + targets} tokens, more than "
            f"the model's context of {info.n_ctx}: drop the longer contexts or use fewer targets"
        )
    if n_docs is not None and (not is_integer(n_docs) or n_docs < 1):
        raise InputError(f"n_docs must be a positive integer or None (every document), got {n_docs!r}")
    return int(targets), None if n_docs is None else int(n_docs)


def censoring(curve: pd.DataFrame, stars: pd.DataFrame) -> pd.DataFrame:
    """Per (rank_by, renormalize): ``censored`` (no size passed: ``n_star`` is ``<NA>``), ``n_max``
    (the largest size measured) and ``n_star_text`` (``"32"`` or ``"> 64"``), so that a censored
    ``N*`` stays in the table."""
    n_max = curve.groupby(["rank_by", "renormalize"], sort=False).n.max().rename("n_max").reset_index()
    out = stars[["rank_by", "renormalize", "n_star"]].merge(n_max, on=["rank_by", "renormalize"], how="left")
    out["censored"] = out.n_star.isna()
    out["n_star_text"] = [f"> {m}" if c else str(int(s)) for s, c, m in zip(out.n_star, out.censored, out.n_max)]
    return out.drop(columns="n_star")


@runs_model
def context_scaling(
    model: Any,
    corpus: Any,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    targets: int = 64,
    ns: str | Sequence[int] = "pow2",
    rank_by: str | Sequence[str] = "attention",
    renormalize: bool | Sequence[bool] = (False, True),
    *,
    n_docs: int | None = None,
    skip_short: bool = False,
    tolerance: float = DEFAULT_TOLERANCE,
    refine: bool = False,
    scoring: str = "final",
    per_document: bool = False,
    seed: int = 0,
    batch_size: int = 1,
    out_dir: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
    world: Any = None,
) -> Any:
    """The loss curve and ``N*_tau`` of the same last ``T`` tokens of every document, per context length ``L``.

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer with eager attention.
    corpus : a text corpus (each text one document, e.g. ``tl_geometry.corpus.python_docs()``) or
        token ids (:func:`~tl_geometry.corpus.from_tokens`, one row per document, without BOS).
    contexts : the context lengths ``L`` (``BOS`` included when the model has one).
    targets : ``T``, the number of last tokens of each document that are predicted, ``1 <= T < min(contexts)``.
    ns : sizes ``N``: "pow2" (``1, 2, 4, ...`` up to ``L + T``, per ``L``) or one list for every ``L``.
    rank_by : one ranking or several (``"attention"``, ``"contribution"``, ``"random"``, ``"sink_window"``).
    renormalize : one flag or several.
    n_docs : number of documents (default: the corpus's ``n_seqs``; None there: every document).
    skip_short : skip documents shorter than ``max(contexts) + T`` tokens (counted) instead of refusing them.
    tolerance : ``tau`` of ``N*_tau``.
    refine : bisect ``N*`` between the grid's sizes (one more pass per step).
    scoring : ``"final"`` (the loss over the last ``T`` tokens, the same at every ``L``) or ``"all"``
        (over every token of each window, as a plain curve would).
    per_document : also return each document's NLL sum per point (for the paired bootstrap).
    seed : seed of ``"random"``.
    batch_size : windows per forward pass.
    out_dir : each ``L``'s curve is saved in ``out_dir/context_{L}/curve.json`` as measured and resumed from.
    resume : False starts over even if ``out_dir`` holds curves.
    progress : show progress bars.
    world : a started :class:`tl_geometry.pipeline.torchrun.World` under torchrun (documents sharded
        across ranks as :func:`~tl_geometry.intervention.sparsification_curve` shards windows), or None.

    Returns
    -------
    Tidy DataFrame, one row per ``(context, rank_by, renormalize, n)``: the curve's columns plus
    ``tolerance``, ``n_star`` and ``n_star_over_context`` (the same on every row of one context;
    ``<NA>`` when no size passes), ``censored``, ``n_max`` and ``n_star_text`` (``"> n_max"`` then),
    ``n_docs`` and ``targets`` (targets counted per document); ``attrs["skipped_docs"]`` counts the
    short documents skipped. With ``per_document``, ``(table, windows)``: ``windows`` holds each
    document's NLL sum per point (``context``, the columns of
    :meth:`~tl_geometry.intervention.SparsificationCurve.window_table`, ``targets``), which
    :func:`~tl_geometry.competition.scaling.context_bootstrap` resamples.
    """
    sizes_spec, rankings, flags = ns, check_rankings(rank_by), check_renormalize(renormalize)
    tau = check_tolerance(tolerance)
    if scoring not in ("final", "all"):
        raise InputError(f"scoring must be 'final' (the last T tokens) or 'all' (every token), got {scoring!r}")
    for name, flag in (("skip_short", skip_short), ("refine", refine), ("per_document", per_document)):
        if not isinstance(flag, bool):
            raise InputError(f"{name} must be True or False, got {flag!r}")
    lengths = check_contexts(contexts)
    info = describe_model(model)
    corpus = as_corpus(corpus, lengths[-1])
    n_targets, wanted = check_context_inputs(info, lengths, targets, n_docs)
    if wanted is None and isinstance(corpus, Corpus):
        wanted = corpus.n_seqs
    docs = corpus_documents(model, corpus)
    needed = lengths[-1] + n_targets - (0 if info.bos_token_id is None else 1)
    chosen, skipped = select_documents(docs, needed, wanted, skip_short)
    used = [docs[i] for i in chosen]
    for L in lengths:  # every size list checked before the first pass
        check_ns(sizes_spec, L + n_targets)
    frames, window_frames = [], []
    bar = tqdm(lengths, desc="contexts", unit="L", disable=not progress)
    for L in bar:
        bar.set_postfix(L=L)
        windows = context_windows(used, L, n_targets, info.bos_token_id)
        curve = sparsification_curve(
            model,
            windows,
            ns=sizes_spec,
            rank_by=rankings,
            renormalize=flags,
            seed=seed,
            batch_size=batch_size,
            out_dir=None
            if out_dir is None
            else Path(out_dir) / (f"context_{L}" + ("" if scoring == "final" else "_all")),
            resume=resume,
            progress=progress,
            world=world,
            targets=n_targets if scoring == "final" else None,
        )
        stars = curve.effective_set_size(tau, refine=refine)[["rank_by", "renormalize", "n_star"]]
        stars = stars.merge(censoring(curve.table, stars), on=["rank_by", "renormalize"], how="left")
        table = curve.table.merge(stars, on=["rank_by", "renormalize"], how="left")
        table.insert(0, "context", L)
        table["tolerance"] = tau
        table["n_star_over_context"] = table["n_star"].astype("Float64") / L
        table["n_docs"] = len(used)
        table["targets"] = n_targets if scoring == "final" else windows.shape[1] - 1
        frames.append(table)
        per_window = curve.window_table()
        per_window.insert(0, "context", L)
        per_window["targets"] = int(table["targets"].iloc[0])
        window_frames.append(per_window)
    bar.close()
    out = pd.concat(frames, ignore_index=True)[CONTEXT_COLUMNS]
    out = out.sort_values(["context", "rank_by", "renormalize", "n"], kind="stable", ignore_index=True)
    out.attrs["skipped_docs"] = skipped
    if per_document:
        return out, pd.concat(window_frames, ignore_index=True)
    return out


__all__ = [
    "CONTEXT_COLUMNS",
    "DEFAULT_CONTEXTS",
    "censoring",
    "check_contexts",
    "context_scaling",
    "context_windows",
    "select_documents",
]
