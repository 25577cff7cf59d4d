"""Retrieval under competition (bAbI qa1 style): the support fact's keys and the answer as background grows.

Per example, condition and background size ``m`` the sequence is ``BOS, F, "\\n", G_m, "\\n", Q``:
the supporting fact ``F``, the first ``m`` tokens of background ``G`` ("neutral": the embedded
corpus; "competitors": the example's same-format facts about other people) and the question
``Q``. At the query that predicts the answer (the last token of ``Q``): the support measures of
:mod:`~tl_geometry.competition.support` per (layer, head) under full attention, and the
candidate-normalised answer loss under full attention and under top-``N`` selection (definitions
§8). ``N*`` is the smallest ``N`` whose mean answer loss is within ``tolerance`` nats of full
attention's. With ``out_dir`` the tables are rewritten after every (condition, amount, example)
and a later call resumes; columns: docs/columns.md#retrieval-under-competition.

Examples
--------
>>> from tl_geometry.testing import tiny_llama_bridge
>>> from tl_geometry.competition.babi import babi_examples
>>> examples = babi_examples(2, places=("attic", "barn", "cellar", "den", "garden", "hall"), n_competitors=8,
...                          space_in_answer=False)   # the tiny model's tokenizer is byte-level
>>> result = retrieval_under_competition(tiny_llama_bridge(), examples, background="lorem ipsum " * 20,
...                                      amounts=(0, 16), ns=(2, 8), progress=False)
>>> sorted(set(result.answers.condition)), len(result.heads)   # 2 conditions x 2 amounts x 2 examples x 8 heads
(['competitors', 'neutral'], 64)
"""

from __future__ import annotations

import hashlib
import json
import numbers
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from tl_geometry.capture.hooks import model_device
from tl_geometry.competition.babi import RetrievalExample, babi_examples, check_examples, examples_sha256
from tl_geometry.competition.fact import SEPARATOR, background_tokens, check_amounts, check_sizes, query_rows_hook
from tl_geometry.competition.support import (
    answer_summary,
    candidate_scores,
    hidden_support,
    retrieval_n_star,
    support_measures,
    support_summary,
)
from tl_geometry.core.ranking_checks import check_rankings
from tl_geometry.core.rankings import check_seed
from tl_geometry.corpus import encode_text
from tl_geometry.errors import InputError
from tl_geometry.intervention.context import top_n_attention
from tl_geometry.intervention.curve import check_tolerance
from tl_geometry.io.checksums import ChecksumError, verify_checksums, write_checked
from tl_geometry.io.files import write_json_atomic
from tl_geometry.io.store import StoreError, describe_differences, model_fingerprint
from tl_geometry.models import describe_model, hook_pattern_name, last_logits

CONDITIONS = ("neutral", "competitors")
DEFAULT_AMOUNTS = (0, 1024, 2048, 4096)
DEFAULT_NS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_TOLERANCE = 0.10
DEFAULT_TOP = 64
PROGRESS_FILE = "retrieval.json"
#: Bumped when a measure's definition changes: a saved run of another version is not resumed into this one.
MEASURES_VERSION = 2  # 2: the support measured over the keys a sliding-window query sees
HEAD_COLUMNS = [
    "condition",
    "amount",
    "example_id",
    "layer",
    "head",
    "mass",
    "rank_displacement",
    "recall_at_top",
    "pairwise_outrank",
    "mean_outranked",
    "n_support",
    "n_support_visible",
    "n_keys",
    "top",
]
ANSWER_COLUMNS = [
    "condition",
    "amount",
    "example_id",
    "rank_by",
    "renormalize",
    "n",
    "answer_loss",
    "correct",
    "answer_loss_full",
    "correct_full",
    "delta_loss",
    "n_keys",
]


@dataclass
class Retrieval:
    """What :func:`retrieval_under_competition` measured.

    Attributes
    ----------
    heads : one row per (condition, amount, example, layer, head): the support measures at the answer query.
    answers : one row per (condition, amount, example, rank_by, renormalize, n): ``answer_loss``
        and ``correct`` under top-``n``, the same under full attention, ``delta_loss``.
    examples : one row per example (``example_id``, ``fact``, ``question``, ``answer``, ``candidates``).
    config : the identity and settings of the run.
    """

    heads: pd.DataFrame
    answers: pd.DataFrame
    examples: pd.DataFrame
    config: dict

    def summary(self) -> pd.DataFrame:
        """Mean answer loss and accuracy (95 % Wilson intervals) per (condition, amount, rank_by, renormalize, n)."""
        return answer_summary(self.answers)

    def n_star(self, tolerance: float | None = None) -> pd.DataFrame:
        """``N*`` per (condition, amount, rank_by, renormalize), censored ones kept (``censored``, ``n_star_text``)."""
        tau = self.config.get("tolerance", DEFAULT_TOLERANCE) if tolerance is None else check_tolerance(tolerance)
        return retrieval_n_star(self.summary(), tau)

    def support(self) -> pd.DataFrame:
        """The support measures' means per (condition, amount)."""
        return support_summary(self.heads)


def check_conditions(conditions: Any) -> list[str]:
    """A non-empty list of :data:`CONDITIONS`, in that order."""
    items = [conditions] if isinstance(conditions, str) else conditions
    try:
        items = list(items)
    except TypeError:
        raise InputError(f"conditions must be a list of {CONDITIONS}, got {conditions!r}") from None
    bad = [c for c in items if c not in CONDITIONS]
    if bad or not items:
        raise InputError(f"conditions must be one or more of {', '.join(CONDITIONS)}, got {conditions!r}")
    return [c for c in CONDITIONS if c in items]


def check_top(top: Any) -> int:
    if isinstance(top, bool) or not isinstance(top, numbers.Integral) or top < 1:
        raise InputError(f"top (the recall cut-off) must be an integer >= 1, got {top!r}")
    return int(top)


def retrieval_settings(
    examples: Sequence[RetrievalExample],
    conditions: Sequence[str],
    amounts: Sequence[int],
    ns: Sequence[int],
    rank_by: Sequence[str],
    renormalize: bool,
    tolerance: float,
    top: int,
    seed: int,
) -> dict[str, Any]:
    """The settings part of a run's identity (what needs no model), as JSON reads it back."""
    return {
        "measures version": MEASURES_VERSION,
        "examples": examples_sha256(examples),
        "n_examples": len(examples),
        "conditions": list(conditions),
        "amounts": list(amounts),
        "ns": list(ns),
        "rank_by": list(rank_by),
        "renormalize": renormalize,
        "tolerance": tolerance,
        "top": top,
        "seed": seed,
    }


def read_progress(out_dir: str | Path) -> dict | None:
    """``out_dir``'s saved progress (identity and units done), None if there is none; damaged: :class:`StoreError`."""
    path = Path(out_dir) / PROGRESS_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(data, dict) and data.get("format") == 1 and isinstance(data.get("identity"), dict)
        assert isinstance(data.get("done"), list)
    except (OSError, ValueError, AssertionError) as exc:
        raise StoreError(f"{path} is damaged or not a retrieval run ({type(exc).__name__})") from None
    return data


def check_saved_identity(out_dir: str | Path, identity: Mapping[str, Any], keys: Sequence[str] | None = None) -> None:
    """Refuse ``out_dir`` if its saved identity differs from ``identity`` (on ``keys``, default all)."""
    saved = read_progress(out_dir)
    if saved is None:
        return
    mine = json.loads(json.dumps(dict(identity), default=str))
    theirs = saved["identity"] if keys is None else {k: saved["identity"].get(k) for k in keys}
    if keys is not None:
        mine = {k: mine.get(k) for k in keys}
    differences = describe_differences(mine, theirs)
    if differences:
        raise StoreError(
            f"{out_dir} holds a retrieval run with other settings: {'; '.join(differences)} (here vs saved); "
            "use the saved settings to resume, or another output directory"
        )


def competitor_tokens(model: Any, example: RetrievalExample, needed: int) -> list[int]:
    """The first ``needed`` tokens of the example's competitor facts, joined by spaces (repeated if too short)."""
    if needed == 0:
        return []
    if not example.competitors:
        raise InputError(
            f"the example {example.fact!r} has no competitor facts: the 'competitors' condition needs some"
        )
    stream: list[int] = []
    while len(stream) < needed:
        for sentence in example.competitors:
            stream.extend(encode_text(model, sentence if not stream else " " + sentence))
            if len(stream) >= needed:
                break
    return stream[:needed]


def retrieval_under_competition(
    model: Any,
    examples: Sequence[RetrievalExample] | None = None,
    *,
    conditions: Sequence[str] = CONDITIONS,
    background: Any = None,
    amounts: Sequence[int] = DEFAULT_AMOUNTS,
    ns: Sequence[int] = DEFAULT_NS,
    rank_by: str | Sequence[str] = "attention",
    renormalize: bool = False,
    tolerance: float = DEFAULT_TOLERANCE,
    top: int = DEFAULT_TOP,
    seed: int = 0,
    out_dir: str | Path | None = None,
    resume: bool = True,
    notes: Mapping[str, Any] | None = None,
    progress: bool = True,
    world: Any = None,
) -> Retrieval:
    """The support keys' rank, mass and recall at the answer query, and the candidate answer loss, against background.

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer with eager attention and a tokenizer.
    examples : :class:`~tl_geometry.competition.babi.RetrievalExample` list; None: ``babi_examples(16, seed=0)``.
        The candidates' first tokens must differ under the model's tokenizer (checked).
    conditions : ``"neutral"`` (background from ``background``) and/or ``"competitors"`` (each
        example's competitor facts).
    background : the neutral background: None (the Python-docs corpus), a string, strings, a corpus or token ids.
    amounts : background sizes ``m`` (tokens), nested: ``G_m`` is a prefix of ``G_m'``.
    ns : sizes ``N`` of the top-``N`` restriction (a size at least the sequence length equals full attention).
    rank_by : one ranking or several (definitions §7); ``"sink_window"`` (the sink and the ``N - 1``
        most recent keys) is the follow-up's positional control.
    renormalize, seed : the restriction (definitions §8).
    tolerance : ``N*``'s tolerance on the mean answer-loss increase, in nats.
    top : the cut-off of ``recall_at_top``.
    out_dir : tables and progress are saved there as measured, and resumed from.
    resume : False starts over even if ``out_dir`` holds a run.
    notes : extra entries recorded in the identity (e.g. the command's options), compared on resume.
    progress : a progress bar over the (condition, amount, example) units.
    world : a started :class:`tl_geometry.pipeline.torchrun.World` under torchrun, or None: the
        units are dealt to the ranks a round at a time, every rank gets every unit's rows after each
        round (rank 0 saves them), and every rank returns the same tables as one process.
    """
    example_list = babi_examples(16, seed=0) if examples is None else check_examples(examples)
    condition_list = check_conditions(conditions)
    sizes = check_amounts(amounts)
    n_list = check_sizes(ns)
    rankings = check_rankings(rank_by)
    if not isinstance(renormalize, bool):
        raise InputError(f"renormalize must be True or False, got {renormalize!r}")
    tau, top, seed = check_tolerance(tolerance), check_top(top), check_seed(seed)
    info = describe_model(model)
    bos = [] if info.bos_token_id is None else [int(info.bos_token_id)]
    sep = encode_text(model, SEPARATOR)
    encoded = []
    for i, example in enumerate(example_list):
        firsts = []
        for candidate in example.candidates:
            ids = encode_text(model, candidate)
            if not ids:
                raise InputError(f"example {i}: the candidate {candidate!r} has no tokens")
            firsts.append(ids[0])
        if len(set(firsts)) != len(firsts):
            raise InputError(
                f"example {i}: two candidates of {list(example.candidates)} share their first token under this "
                "model's tokenizer; scoring by the first token needs them distinct (e.g. a leading space)"
            )
        encoded.append(
            (
                encode_text(model, example.fact),
                encode_text(model, example.question),
                firsts,
                example.candidates.index(example.answer),
            )
        )
    longest = max(len(bos) + len(f) + 2 * len(sep) + len(q) for f, q, _, _ in encoded) + sizes[-1]
    if longest > info.n_ctx:
        raise InputError(
            f"the longest sequence (fact, {sizes[-1]} background tokens, question) is {longest} tokens, more than "
            f"the model's context of {info.n_ctx}: lower the amounts"
        )
    fillers: dict[tuple[str, int], list[int]] = {}
    if "neutral" in condition_list:
        neutral = background_tokens(model, background, sizes[-1])
        fillers |= {("neutral", i): neutral for i in range(len(example_list))}
    if "competitors" in condition_list:
        fillers |= {("competitors", i): competitor_tokens(model, e, sizes[-1]) for i, e in enumerate(example_list)}
    vocab = int(getattr(model.cfg, "d_vocab", 0) or 0)
    if vocab and any(t >= vocab for filler in fillers.values() for t in filler):
        raise InputError(f"a background token id is outside the model's vocabulary of {vocab}")
    settings = retrieval_settings(example_list, condition_list, sizes, n_list, rankings, renormalize, tau, top, seed)
    digest = hashlib.sha256(json.dumps(sorted((f"{c}/{i}", t) for (c, i), t in fillers.items())).encode())
    identity = {
        "model": info.name,
        "model weights": model_fingerprint(model),
        "background tokens": digest.hexdigest(),
        **settings,
        **dict(notes or {}),
    }
    identity = json.loads(json.dumps(identity, default=str))
    with top_n_attention(
        model, n=1, rank_by=rankings[0]
    ):  # refuses a model that ignores pattern edits, before any pass
        pass
    main = world is None or world.is_main
    refused, store = None, RetrievalStore(None, identity, False)
    if main:
        try:
            store = RetrievalStore(out_dir, identity, resume)
        except StoreError as exc:  # said on every rank, not only on rank 0
            refused = str(exc)
    if world is not None:
        refused = world.share(refused)
    if refused is not None:
        raise StoreError(refused)
    if world is not None:  # rank 0 read the saved units; every rank measures the rest
        store.done, store.heads, store.answers = world.share((store.done, store.heads, store.answers))
    device = model_device(model)
    # every condition of one amount before the next amount: an interrupted run holds comparable points
    units = [(c, m, i) for m in sizes for c in condition_list for i in range(len(example_list))]
    pending = [u for u in units if not store.is_done(*u)]
    bar = tqdm(
        total=len(units),
        initial=len(units) - len(pending),
        desc="retrieval",
        unit="example",
        disable=not progress or not main,
    )
    size, rank = (1, 0) if world is None else (world.size, world.rank)
    for start in range(0, len(pending), size):  # one round: a unit per rank, then every rank's rows saved
        mine = pending[start + rank] if start + rank < len(pending) else None
        rows: tuple[list[dict], list[dict]] | None = None
        if mine is not None:
            condition, m, i = mine
            fact, question, firsts, answer = encoded[i]
            ids = bos + fact + sep + fillers[(condition, i)][:m] + sep + question
            unit = RetrievalUnit(condition, m, i, ids, range(len(bos), len(bos) + len(fact)), firsts, answer)
            rows = measure_unit(model, info, unit, device, rankings, n_list, renormalize, seed, top)
        measured = [(mine, rows)] if world is None else world.all_gather((mine, rows))
        for done, unit_rows in measured:
            if done is not None and unit_rows is not None:
                store.add(*done, *unit_rows)
                bar.update()
    bar.close()
    examples_table = pd.DataFrame(
        [
            {**asdict(e), "example_id": i, "candidates": list(e.candidates), "n_competitors": len(e.competitors)}
            for i, e in enumerate(example_list)
        ]
    )[["example_id", "fact", "question", "answer", "candidates", "n_competitors"]]
    order = {c: k for k, c in enumerate(CONDITIONS)}
    heads, answers = store.tables()
    heads = heads.sort_values(
        ["condition", "amount", "example_id", "layer", "head"],
        key=lambda s: s.map(order) if s.name == "condition" else s,
        ignore_index=True,
    )
    answers = answers.sort_values(
        ["condition", "amount", "example_id", "rank_by", "n"],
        key=lambda s: s.map(order) if s.name == "condition" else s,
        ignore_index=True,
    )
    return Retrieval(heads=heads, answers=answers, examples=examples_table, config=identity)


@dataclass(frozen=True)
class RetrievalUnit:
    """One (condition, amount, example): its token ids ``BOS, F, sep, G_m, sep, Q``, the fact's
    positions, the candidates' first tokens and the answer's index among them."""

    condition: str
    amount: int
    example_id: int
    ids: list[int]
    support: range
    first_tokens: list[int]
    answer: int


def measure_unit(
    model: Any,
    info: Any,
    unit: RetrievalUnit,
    device: Any,
    rankings: Sequence[str],
    n_list: Sequence[int],
    renormalize: bool,
    seed: int,
    top: int,
) -> tuple[list[dict], list[dict]]:
    """The head rows (support measures at the answer query) and answer rows (candidate loss per
    ranking and ``N``) of one unit: one pass of the full model, one per (ranking, ``N < L``)."""
    tokens = torch.tensor([unit.ids], dtype=torch.int64, device=device)
    q, first_tokens, answer = len(unit.ids) - 1, torch.tensor(unit.first_tokens), unit.answer
    support = torch.arange(unit.support.start, unit.support.stop)
    keys = {"condition": unit.condition, "amount": unit.amount, "example_id": unit.example_id}
    rows: dict[int, torch.Tensor] = {}
    keep_rows = query_rows_hook(rows, torch.tensor([q]))
    head_rows, answer_rows = [], []
    with torch.inference_mode():
        hooks = [(hook_pattern_name(layer), keep_rows) for layer in range(info.n_layers)]
        logits = last_logits(model, tokens, 1, hooks)[0, -1].cpu()
        loss_full, correct_full = candidate_scores(logits, first_tokens, answer)
        for layer in range(info.n_layers):  # over the keys the query sees (a sliding window may hide the fact)
            first = info.first_visible_key(layer, q)
            seen = support[support >= first] - first
            row = rows[layer][0][:, first : q + 1]  # [head, key]
            measures = support_measures(row, seen, top) if seen.numel() else hidden_support(row)
            for head in range(info.n_heads):
                head_rows.append(
                    {
                        **keys,
                        "layer": layer,
                        "head": head,
                        **{name: float(value[head]) for name, value in measures.items()},
                        "n_support": len(support),
                        "n_support_visible": int(seen.numel()),
                        "n_keys": q + 1 - first,
                        "top": top,
                    }
                )
        for rank_by, n in ((r, n) for r in rankings for n in n_list):
            if n >= len(unit.ids):  # every query keeps all its keys
                loss, correct = loss_full, correct_full
            else:
                with top_n_attention(model, n=n, rank_by=rank_by, renormalize=renormalize, seed=seed):
                    loss, correct = candidate_scores(last_logits(model, tokens, 1)[0, -1].cpu(), first_tokens, answer)
            answer_rows.append(
                {
                    **keys,
                    "rank_by": rank_by,
                    "renormalize": renormalize,
                    "n": n,
                    "answer_loss": loss,
                    "correct": correct,
                    "answer_loss_full": loss_full,
                    "correct_full": correct_full,
                    "delta_loss": loss - loss_full,
                    "n_keys": q + 1,
                }
            )
    return head_rows, answer_rows


class RetrievalStore:
    """``out_dir``: ``heads.parquet`` and ``answers.parquet`` rewritten after every unit (their
    SHA-256 recorded, :mod:`tl_geometry.io.checksums`, and checked on resume), then
    :data:`PROGRESS_FILE` (identity and the units done); rows of a unit not listed there are dropped on resume."""

    def __init__(self, out_dir: str | Path | None, identity: dict, resume: bool) -> None:
        self.dir = None if out_dir is None else Path(out_dir)
        self.identity = identity
        self.done: list[str] = []
        self.heads = pd.DataFrame(columns=HEAD_COLUMNS)
        self.answers = pd.DataFrame(columns=ANSWER_COLUMNS)
        if self.dir is None or not resume:
            return
        saved = read_progress(self.dir)
        if saved is None:
            return
        check_saved_identity(self.dir, identity)
        self.done = [str(u) for u in saved["done"]]
        try:
            verify_checksums(self.dir, ["heads.parquet", "answers.parquet"], advice="start over")
        except ChecksumError as exc:
            raise StoreError(str(exc)) from None
        try:
            heads = pd.read_parquet(self.dir / "heads.parquet") if self.done else self.heads
            answers = pd.read_parquet(self.dir / "answers.parquet") if self.done else self.answers
        except (OSError, ValueError) as exc:
            raise StoreError(f"{self.dir}: a saved table cannot be read ({type(exc).__name__})") from None
        self.heads = heads[self.unit_keys(heads).isin(self.done)]
        self.answers = answers[self.unit_keys(answers).isin(self.done)]

    @staticmethod
    def unit(condition: str, m: int, i: int) -> str:
        return f"{condition}/{m}/{i}"

    def unit_keys(self, table: pd.DataFrame) -> pd.Series:
        return table.condition.astype(str) + "/" + table.amount.astype(str) + "/" + table.example_id.astype(str)

    def is_done(self, condition: str, m: int, i: int) -> bool:
        return self.unit(condition, m, i) in self.done

    def add(self, condition: str, m: int, i: int, heads: list[dict], answers: list[dict]) -> None:
        new_heads, new_answers = (
            pd.DataFrame(heads, columns=HEAD_COLUMNS),
            pd.DataFrame(answers, columns=ANSWER_COLUMNS),
        )
        self.heads = new_heads if self.heads.empty else pd.concat([self.heads, new_heads], ignore_index=True)
        self.answers = new_answers if self.answers.empty else pd.concat([self.answers, new_answers], ignore_index=True)
        self.done.append(self.unit(condition, m, i))
        if self.dir is None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        write_checked(self.dir / "heads.parquet", lambda p: self.heads.to_parquet(p, index=False))
        write_checked(self.dir / "answers.parquet", lambda p: self.answers.to_parquet(p, index=False))
        write_json_atomic(self.dir / PROGRESS_FILE, {"format": 1, "identity": self.identity, "done": self.done})

    def tables(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        return self.heads.reset_index(drop=True), self.answers.reset_index(drop=True)


__all__ = [
    "ANSWER_COLUMNS",
    "CONDITIONS",
    "DEFAULT_AMOUNTS",
    "DEFAULT_NS",
    "DEFAULT_TOLERANCE",
    "DEFAULT_TOP",
    "HEAD_COLUMNS",
    "PROGRESS_FILE",
    "Retrieval",
    "RetrievalStore",
    "RetrievalUnit",
    "check_conditions",
    "check_saved_identity",
    "check_top",
    "competitor_tokens",
    "measure_unit",
    "read_progress",
    "retrieval_settings",
    "retrieval_under_competition",
]
