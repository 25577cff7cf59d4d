"""A supporting fact under competition: the fact's rank and mass as background grows (definitions §9).

The sequence is ``BOS, F, "\\n", G_m, "\\n", Q, A``: a fact sentence ``F``, the first ``m`` tokens
of background ``G_m`` (nested: ``G_m`` is a prefix of ``G_m'`` for ``m < m'``), a question ``Q``
and its answer ``A``. At the query that predicts the first answer token (the last token of ``Q``),
per (layer, head), with ``alpha`` that query's attention row over its ``q + 1`` visible keys::

    mass        = sum_{i in F} alpha_i
    rank(i)     = 1 + #{j: alpha_j > alpha_i} + #{j < i: alpha_j = alpha_i}   (1 = highest weight)
    best_rank   = min_{i in F} rank(i),   median_rank = median_{i in F} rank(i)

and the answer's NLL (mean over its tokens) under full attention and under the top-``N``
restriction of definitions §8. The shipped facts come from one template (:func:`template_facts`);
columns: docs/columns.md#supporting-fact.

Examples
--------
>>> from tl_geometry.testing import tiny_llama_bridge
>>> facts = [Fact("The code is 7.", "Question: the code? Answer:", " 7")]
>>> result = supporting_fact(tiny_llama_bridge(), facts, background="lorem ipsum " * 20,
...                          amounts=(0, 32), ns=(2,), progress=False)
>>> result.heads.groupby("amount").size().tolist()   # 2 layers x 4 heads, per amount
[8, 8]
>>> int(result.heads.best_rank.min()) >= 1
True
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from tl_geometry.capture.hooks import model_device
from tl_geometry.core.progress import tqdm
from tl_geometry.core.rankings import check_rank_by
from tl_geometry.corpus import TokenCorpus, as_corpus, encode_text, python_docs
from tl_geometry.errors import InputError
from tl_geometry.intervention.context import check_n, top_n_attention
from tl_geometry.models import describe_model, hook_pattern_name
from tl_geometry.runtime.threads import runs_model

DEFAULT_AMOUNTS = (0, 64, 256, 1024)
DEFAULT_NS = (1, 4, 16, 64)
SEPARATOR = "\n"
COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white")
CODE_WORDS = ("apple", "tiger", "piano", "river", "lemon", "garden", "candle", "mirror")
FACT_TEMPLATE = "The code of the {colour} box is {word}."
QUESTION_TEMPLATE = "Question: what is the code of the {colour} box? Answer: the code is"
HEAD_COLUMNS = ["amount", "fact_id", "layer", "head", "best_rank", "median_rank", "mass", "n_fact_tokens", "n_keys"]
LOSS_COLUMNS = ["amount", "fact_id", "rank_by", "renormalize", "n", "nll", "nll_full", "delta_nll_rel", "n_keys"]


@dataclass(frozen=True)
class Fact:
    """A fact sentence, a question whose answer needs it, and the answer (its first token is the one predicted)."""

    fact: str
    question: str
    answer: str


def template_facts(n_facts: int = 8) -> list[Fact]:
    """The shipped facts: colour ``i`` of :data:`COLOURS` gets code word ``(i + 3) mod 8`` of :data:`CODE_WORDS`.

    ``FACT_TEMPLATE`` and ``QUESTION_TEMPLATE`` are filled in; the answer is ``" " + word``, one
    token for SmolLM2's tokenizer (:func:`supporting_fact` checks this for the model at hand). The
    shift by 3 keeps colour and word unrelated in the order of the lists.

    >>> template_facts(1)[0]
    Fact(fact='The code of the red box is river.', question='Question: what is the code of the red box? Answer: the code is', answer=' river')
    """
    if isinstance(n_facts, bool) or not isinstance(n_facts, numbers.Integral) or not 1 <= n_facts <= len(COLOURS):
        raise InputError(f"n_facts must be an integer in 1..{len(COLOURS)}, got {n_facts!r}")
    facts = []
    for i, colour in enumerate(COLOURS[:n_facts]):
        word = CODE_WORDS[(i + 3) % len(CODE_WORDS)]
        facts.append(
            Fact(FACT_TEMPLATE.format(colour=colour, word=word), QUESTION_TEMPLATE.format(colour=colour), f" {word}")
        )
    return facts


@dataclass
class SupportingFact:
    """What :func:`supporting_fact` measured.

    Attributes
    ----------
    heads : one row per (amount, fact, layer, head): ``best_rank``, ``median_rank``, ``mass`` of the
        fact's tokens at the answer query, ``n_fact_tokens``, ``n_keys`` (keys the query sees).
    loss : one row per (amount, fact, N): the answer's ``nll`` under top-``N``, ``nll_full`` under
        full attention, ``delta_nll_rel``.
    facts : the facts (``fact_id``, ``fact``, ``question``, ``answer``, ``n_fact_tokens``).
    config : model and settings.
    """

    heads: pd.DataFrame
    loss: pd.DataFrame
    facts: pd.DataFrame
    config: dict


def as_facts(facts: Any) -> list[Fact]:
    """``facts`` as a list of :class:`Fact` (None: :func:`template_facts`; tuples ``(fact, question, answer)`` accepted)."""
    if facts is None:
        return template_facts()
    items = [facts] if isinstance(facts, Fact) else facts
    try:
        items = list(items)
    except TypeError:
        raise InputError(f"facts must be a list of Fact(fact, question, answer), got {facts!r}") from None
    if not items:
        raise InputError("facts is empty: pass at least one Fact(fact, question, answer), or None for the shipped ones")
    out = []
    for item in items:
        if isinstance(item, (tuple, list)) and len(item) == 3:
            item = Fact(*item)
        if not isinstance(item, Fact) or not all(isinstance(s, str) and s.strip() for s in asdict(item).values()):
            raise InputError(f"every fact must be a Fact(fact, question, answer) of non-empty strings, got {item!r}")
        out.append(item)
    return out


def check_sizes(ns: Any) -> list[int]:
    """Sorted unique selection sizes ``N >= 1``, from one size or a list of them."""
    n_list = sorted({check_n(n) for n in ([ns] if isinstance(ns, numbers.Integral) else list(ns))})
    if not n_list:
        raise InputError("ns is empty: give at least one size N")
    return n_list


def check_amounts(amounts: Any) -> list[int]:
    """Sorted unique background sizes ``m >= 0``."""
    items = [amounts] if isinstance(amounts, numbers.Integral) else amounts
    try:
        items = list(items)
    except TypeError:
        raise InputError(f"amounts must be a list of ints >= 0 like (0, 64, 256), got {amounts!r}") from None
    if not items:
        raise InputError("amounts is empty: give at least one amount of background m")
    for m in items:
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 0:
            raise InputError(f"every amount of background must be an integer >= 0, got {m!r}")
    return sorted({int(m) for m in items})


def background_tokens(model: Any, background: Any, needed: int) -> list[int]:
    """The first ``needed`` tokens of the background (documents joined by the separator); refused if shorter."""
    if needed == 0:
        return []
    source = python_docs(n_seqs=None) if background is None else as_corpus(background, 512)
    if isinstance(source, TokenCorpus):
        stream = source.tokens.reshape(-1).tolist()
    else:
        sep, stream = encode_text(model, SEPARATOR + SEPARATOR), []
        for text in source.texts():
            if isinstance(text, str) and text.strip():
                stream.extend((sep if stream else []) + encode_text(model, text))
                if len(stream) >= needed:
                    break
    if len(stream) < needed:
        raise InputError(
            f"the background has {len(stream)} tokens, fewer than the largest amount {needed}: "
            "lower the amounts or pass more background"
        )
    return stream[:needed]


def fact_rank_stats(row: Float[Tensor, "*units key"], fact_positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``best_rank``, ``median_rank`` (mean of the middle two for an even count) and ``mass`` of the fact keys in ``row``.

    ``row`` holds one query's weights over its visible keys only; rank 1 is the highest weight,
    ties to the lower key index.
    """
    order = torch.argsort(-row.to(torch.float64), dim=-1, stable=True)
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(1, row.shape[-1] + 1).expand_as(order).clone())
    fact_ranks = ranks[..., fact_positions].to(torch.float64)
    mass = row[..., fact_positions].to(torch.float64).sum(-1)
    return fact_ranks.min(-1).values, fact_ranks.quantile(0.5, dim=-1), mass


@runs_model
def supporting_fact(
    model: Any,
    facts: Any = None,
    background: Any = None,
    amounts: Sequence[int] = DEFAULT_AMOUNTS,
    ns: Sequence[int] = DEFAULT_NS,
    rank_by: str = "attention",
    renormalize: bool = False,
    *,
    progress: bool = True,
) -> SupportingFact:
    """The fact's rank and attention mass at the answer query, and the answer's loss, against background ``m``.

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer with eager attention and a tokenizer.
    facts : list of :class:`Fact` (or ``(fact, question, answer)`` tuples); None: :func:`template_facts`
        (their answers must be single tokens under the model's tokenizer, which is checked).
    background : None (the Python-docs corpus), a string, a list of strings, a corpus, or token ids.
        Its first ``m`` tokens are ``G_m``.
    amounts : the background sizes ``m`` (tokens).
    ns : the sizes ``N`` of the top-``N`` restriction for the answer's loss.
    rank_by : the ranking of the restriction (definitions §7).
    renormalize : renormalise the kept weights.
    progress : show a progress bar over the amounts.

    Returns
    -------
    :class:`SupportingFact` (tables ``heads`` and ``loss``).
    """
    fact_list = as_facts(facts)
    sizes = check_amounts(amounts)
    n_list = check_sizes(ns)
    rank_by = check_rank_by(rank_by)
    if not isinstance(renormalize, bool):
        raise InputError(f"renormalize must be True or False, got {renormalize!r}")
    info = describe_model(model)
    bos = [] if info.bos_token_id is None else [int(info.bos_token_id)]
    sep = encode_text(model, SEPARATOR)
    encoded = [
        (encode_text(model, f.fact), encode_text(model, f.question), encode_text(model, f.answer)) for f in fact_list
    ]
    if facts is None:
        for f, (_, _, answer) in zip(fact_list, encoded):
            if len(answer) != 1:
                raise InputError(
                    f"the shipped answer {f.answer!r} is {len(answer)} tokens under this model's tokenizer, not one: "
                    "pass your own facts=[Fact(fact, question, answer), ...]"
                )
    longest = max(len(bos) + len(fi) + 2 * len(sep) + len(qi) + len(ai) for fi, qi, ai in encoded) + sizes[-1]
    if longest > info.n_ctx:
        raise InputError(
            f"the longest sequence (fact, {sizes[-1]} background tokens, question, answer) is {longest} tokens, more "
            f"than the model's context of {info.n_ctx}: lower the amounts or shorten the facts"
        )
    bg = background_tokens(model, background, sizes[-1])
    vocab = int(getattr(model.cfg, "d_vocab", 0) or 0)
    if bg and vocab and max(bg) >= vocab:
        raise InputError(f"background token id {max(bg)} is outside the model's vocabulary of {vocab}")
    with top_n_attention(model, n=1, rank_by=rank_by):  # refuses a model that ignores pattern edits, before any pass
        pass
    device = model_device(model)
    head_rows: list[dict] = []
    loss_rows: list[dict] = []
    bar = tqdm(sizes, desc="background", unit="m", disable=not progress)
    for m in bar:
        seqs, queries, fact_spans, answers = [], [], [], []
        for fi, qi, ai in encoded:
            ids = bos + fi + sep + bg[:m] + sep + qi + ai
            seqs.append(ids)
            queries.append(len(ids) - len(ai) - 1)
            fact_spans.append(torch.arange(len(bos), len(bos) + len(fi)))
            answers.append(ai)
        width = max(len(s) for s in seqs)
        pad = info.bos_token_id if info.bos_token_id is not None else 0
        tokens = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], dtype=torch.int64)  # right-padded: causal
        rows: dict[int, Tensor] = {}
        keep_rows = query_rows_hook(rows, torch.tensor(queries))
        with torch.inference_mode():
            hooks = [(hook_pattern_name(layer), keep_rows) for layer in range(info.n_layers)]
            full_nll = answer_nll(model.run_with_hooks(tokens.to(device), fwd_hooks=hooks), tokens, queries, answers)
            stacked = torch.stack([rows[layer] for layer in range(info.n_layers)], dim=1)  # [fact, layer, head, key]
            for b, (q, span) in enumerate(zip(queries, fact_spans)):
                best, median, mass = fact_rank_stats(stacked[b, :, :, : q + 1], span)
                for layer in range(info.n_layers):
                    for head in range(info.n_heads):
                        head_rows.append(
                            {
                                "amount": m,
                                "fact_id": b,
                                "layer": layer,
                                "head": head,
                                "best_rank": int(best[layer, head]),
                                "median_rank": float(median[layer, head]),
                                "mass": float(mass[layer, head]),
                                "n_fact_tokens": len(span),
                                "n_keys": q + 1,
                            }
                        )
            for n in n_list:
                with top_n_attention(model, n=n, rank_by=rank_by, renormalize=renormalize):
                    nll = answer_nll(model(tokens.to(device)), tokens, queries, answers)
                for b, q in enumerate(queries):
                    loss_rows.append(
                        {
                            "amount": m,
                            "fact_id": b,
                            "rank_by": rank_by,
                            "renormalize": renormalize,
                            "n": n,
                            "nll": float(nll[b]),
                            "nll_full": float(full_nll[b]),
                            "delta_nll_rel": float((nll[b] - full_nll[b]) / full_nll[b]),
                            "n_keys": q + 1,
                        }
                    )
    bar.close()
    fact_table = pd.DataFrame(
        [{"fact_id": i, **asdict(f), "n_fact_tokens": len(e[0])} for i, (f, e) in enumerate(zip(fact_list, encoded))]
    )
    config = {
        "model": info.name,
        "amounts": sizes,
        "ns": n_list,
        "rank_by": rank_by,
        "renormalize": renormalize,
        "background": "python-docs" if background is None else type(background).__name__,
        "n_facts": len(fact_list),
    }
    return SupportingFact(
        heads=pd.DataFrame(head_rows, columns=HEAD_COLUMNS),
        loss=pd.DataFrame(loss_rows, columns=LOSS_COLUMNS),
        facts=fact_table,
        config=config,
    )


def query_rows_hook(rows: dict[int, Tensor], queries: Tensor) -> Any:
    """A ``hook_pattern`` hook storing, per layer, sequence ``b``'s attention row at query ``queries[b]``: ``[b, head, key]``."""

    def hook(pattern: Tensor, hook: Any) -> None:
        layer = int(hook.name.split(".")[1])
        rows[layer] = pattern.detach()[torch.arange(pattern.shape[0]), :, queries.to(pattern.device)].cpu()

    return hook


def answer_nll(logits: Tensor, tokens: Tensor, queries: Sequence[int], answers: Sequence[Sequence[int]]) -> Tensor:
    """Per sequence, the mean float64 NLL of its answer tokens (position ``q + 1 + j`` predicted at ``q + j``)."""
    out = []
    for b, (q, answer) in enumerate(zip(queries, answers)):
        log_probs = F.log_softmax(logits[b, q : q + len(answer)].to(torch.float64), dim=-1)
        ids = torch.tensor(answer, dtype=torch.int64, device=log_probs.device)
        out.append(-log_probs.gather(-1, ids[:, None]).mean())
    return torch.stack(out).cpu()


__all__ = [
    "CODE_WORDS",
    "COLOURS",
    "DEFAULT_AMOUNTS",
    "Fact",
    "SupportingFact",
    "answer_nll",
    "as_facts",
    "check_amounts",
    "check_sizes",
    "fact_rank_stats",
    "supporting_fact",
    "template_facts",
]
