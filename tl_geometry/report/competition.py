"""Report sections of selection under competition (definitions §9), and the pages of ``tl-geometry context`` and ``fact``.

Context scaling: ``N*_tau`` and ``N*_tau / L`` per context length with the full loss, and the
figure :func:`tl_geometry.plot.n_star_by_context`. The supporting fact: the fact's mass and rank
at the answer query against background, the answer's loss for each ``N``, and the figures
:func:`tl_geometry.plot.fact_attention` and :func:`tl_geometry.plot.fact_loss`.

Examples
--------
>>> import tempfile, pandas as pd
>>> table = pd.DataFrame({"context": [128, 256], "rank_by": "attention", "renormalize": False, "n": 16, "delta_nll_rel": 0.01,
...                       "nll_full": [3.0, 2.9], "n_star": pd.array([16, 32], dtype="Int64"),
...                       "n_star_over_context": [0.125, 0.125], "tolerance": 0.05, "n_docs": 8, "targets": 32})
>>> page = write_context_report(tempfile.mkdtemp(), table)
>>> "N*_tau / L" in page.read_text()
True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from tl_geometry.report.figures import ReportFigure
from tl_geometry.report.page import write_section_page
from tl_geometry.report.sections import Summary

CONTEXT_SECTION = "context"
FACT_SECTION = "fact"
RETRIEVAL_SECTION = "retrieval"


def context_summary(table: pd.DataFrame) -> Summary:
    """``N*_tau`` and ``N*_tau / L`` per context, ranking and renormalisation, with the full loss."""
    shown = ["n_star_text", "censored"] if "n_star_text" in table else ["n_star"]  # older tables: no censoring columns
    stars = table.drop_duplicates(["context", "rank_by", "renormalize"])[
        ["context", "rank_by", "renormalize", "nll_full", *shown, "n_star_over_context"]
    ]
    first = table.iloc[0]
    lead = (
        f"The same last {int(first.targets)} tokens of each of {int(first.n_docs)} documents, predicted from contexts "
        f"of L tokens (definitions §9); N*_tau (tau = {float(first.tolerance):g}) is the smallest size measured whose "
        "relative loss increase over those targets is at most tau. The follow-up paper finds N* growing with L while "
        "N*/L falls."
    )
    by_n = table.pivot_table(index="n", columns=["context", "renormalize"], values="delta_nll_rel")
    by_n.columns = [f"L={c} ({'renorm' if f else 'del'})" for c, f in by_n.columns]
    return Summary(
        available=True,
        lead=lead,
        tables=[("N*_tau and N*_tau / L per context", stars), ("delta_nll_rel by N", by_n.reset_index())],
    )


def context_figures(table: pd.DataFrame) -> list[ReportFigure]:
    from tl_geometry.plot.competition import n_star_by_context

    return [
        ReportFigure(
            "N* against context",
            "N*_tau and N*_tau / L against L, log-log; dotted: renormalised",
            n_star_by_context(table),
            CONTEXT_SECTION,
            source="tl_geometry.plot.n_star_by_context",
        )
    ]


def fact_summary(result: Any) -> Summary:
    """Median over heads of the fact's mass and ranks per background size, and the answer's loss per ``N``."""
    per_head = result.heads.groupby(["amount", "layer", "head"])[["mass", "best_rank", "median_rank"]].median()
    attention = per_head.groupby("amount").median().reset_index()
    loss = result.loss.pivot_table(index="amount", columns="n", values="nll", aggfunc="mean")
    loss.columns = [f"top-{n}" for n in loss.columns]
    loss.insert(0, "full", result.loss.drop_duplicates(["amount", "fact_id"]).groupby("amount").nll_full.mean())
    lead = (
        f"{len(result.facts) or result.config.get('n_facts', '')} facts, each followed by m tokens of background and "
        "a question whose answer needs it (definitions §9). At the query predicting the answer, per head: the fact "
        "tokens' attention mass, best and median rank (1 = highest weight). The follow-up paper finds background "
        "lowering the fact's rank and mass."
    )
    return Summary(
        available=True,
        lead=lead,
        tables=[
            ("Fact attention at the answer query (median over heads of each head's median over facts)", attention),
            ("Answer NLL (mean over facts)", loss.reset_index()),
        ],
    )


def fact_figures(result: Any, head: tuple[int, int] | None = None) -> list[ReportFigure]:
    from tl_geometry.plot.competition import fact_attention, fact_loss

    return [
        ReportFigure(
            "Fact mass and rank against background",
            "median and quartiles over heads",
            fact_attention(result, head),
            FACT_SECTION,
            source="tl_geometry.plot.fact_attention",
        ),
        ReportFigure(
            "Answer loss against background",
            "full attention and top-N",
            fact_loss(result),
            FACT_SECTION,
            source="tl_geometry.plot.fact_loss",
        ),
    ]


def retrieval_summary(result: Any) -> Summary:
    """``N*`` per condition and background (censored ones as "> max"), accuracy with Wilson
    intervals, and the support measures at the answer query."""
    stars = result.n_star()[
        [
            "condition",
            "amount",
            "rank_by",
            "renormalize",
            "n_star_text",
            "censored",
            "answer_loss_full",
            "accuracy_full",
        ]
    ]
    summary = result.summary()
    full = summary.drop_duplicates(["condition", "amount"])[
        [
            "condition",
            "amount",
            "n_examples",
            "answer_loss_full",
            "accuracy_full",
            "accuracy_full_low",
            "accuracy_full_high",
        ]
    ]
    config = result.config
    lead = (
        f"{config.get('n_examples', '')} examples: a supporting fact, m tokens of background (neutral text, or "
        "same-format facts about other people: competitors) and a question; the candidates are scored by the "
        "logit of their first token at the query that predicts the answer (definitions §9). N* is the smallest "
        f"N whose mean answer loss is within {config.get('tolerance', '')} nats of full attention's; '> max': "
        "no size tried was."
    )
    return Summary(
        available=True,
        lead=lead,
        tables=[
            ("N* per condition and background", stars),
            ("Full attention: answer loss and candidate accuracy (95 % Wilson interval)", full),
            ("Support keys at the answer query (means over examples, layers, heads)", result.support()),
            ("Answer loss and accuracy per N", summary),
        ],
    )


def retrieval_figures(result: Any) -> list[ReportFigure]:
    from tl_geometry.plot.competition import retrieval_loss, retrieval_n_star, retrieval_support

    return [
        ReportFigure(
            "N* against background",
            "open markers: censored (no size within the tolerance)",
            retrieval_n_star(result),
            RETRIEVAL_SECTION,
            source="tl_geometry.plot.retrieval_n_star",
        ),
        ReportFigure(
            "Answer-loss increase against N",
            "",
            retrieval_loss(result),
            RETRIEVAL_SECTION,
            source="tl_geometry.plot.retrieval_loss",
        ),
        ReportFigure(
            "Support keys against background",
            "",
            retrieval_support(result),
            RETRIEVAL_SECTION,
            source="tl_geometry.plot.retrieval_support",
        ),
    ]


def write_retrieval_report(out_dir: str | Path, result: Any) -> Path:
    """Write ``out_dir/index.html`` with the retrieval-under-competition section; self-contained."""
    return write_section_page(
        out_dir,
        RETRIEVAL_SECTION,
        "tl_geometry retrieval under competition",
        retrieval_summary(result),
        retrieval_figures(result),
        ("Settings", result.config.items()),
    )


def write_context_report(out_dir: str | Path, table: pd.DataFrame, config: dict | None = None) -> Path:
    """Write ``out_dir/index.html`` with the context-scaling section; self-contained."""
    return write_section_page(
        out_dir,
        CONTEXT_SECTION,
        "tl_geometry context scaling",
        context_summary(table),
        context_figures(table),
        ("Settings", (config or {}).items()),
    )


def write_fact_report(out_dir: str | Path, result: Any, head: tuple[int, int] | None = None) -> Path:
    """Write ``out_dir/index.html`` with the supporting-fact section; self-contained."""
    return write_section_page(
        out_dir,
        FACT_SECTION,
        "tl_geometry supporting fact",
        fact_summary(result),
        fact_figures(result, head),
        ("Settings", result.config.items()),
    )


__all__ = [
    "context_figures",
    "context_summary",
    "fact_figures",
    "fact_summary",
    "retrieval_figures",
    "retrieval_summary",
    "write_retrieval_report",
    "write_context_report",
    "write_fact_report",
]
