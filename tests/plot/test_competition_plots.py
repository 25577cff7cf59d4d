"""Figures of context scaling, the supporting fact and per-head budgets: what the traces hold, from small tables;
log axes labelled in full."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import tl_geometry as tlg
from tl_geometry.competition.fact import HEAD_COLUMNS, LOSS_COLUMNS, SupportingFact
from tl_geometry.errors import InputError
from tl_geometry.plot.base import log_tick_values


def context_table():
    rows = []
    for context, star in ((128, 16), (256, 32), (512, None)):
        for n in (4, 16, 64):
            rows.append({"context": context, "rank_by": "attention", "renormalize": False, "n": n,
                         "n_star": star, "n_star_over_context": None if star is None else star / context,
                         "n_max": 64})  # fmt: skip
    table = pd.DataFrame(rows)
    table["n_star"] = table["n_star"].astype("Int64")
    return table


def test_n_star_by_context_draws_n_star_and_its_fraction_log_log() -> None:
    fig = tlg.plot.n_star_by_context(context_table())
    left, right = fig.data
    assert list(left.x) == [128, 256, 512] and list(left.y) == [16, 32, 64]  # none passed at 512: "> 64", open
    assert list(left.marker.symbol) == ["circle", "circle", "circle-open"] and list(left.text) == ["", "", "> 64"]
    assert list(right.y) == [16 / 128, 32 / 256, 64 / 512]
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log" and fig.layout.yaxis2.type == "log"
    with pytest.raises(InputError, match="context_scaling"):
        tlg.plot.n_star_by_context(pd.DataFrame())


def fact_result():
    rng = np.random.default_rng(0)
    heads = [
        {
            "amount": m,
            "fact_id": f,
            "layer": layer,
            "head": h,
            "best_rank": int(rng.integers(1, 9)),
            "median_rank": 3.0,
            "mass": float(rng.random()),
            "n_fact_tokens": 5,
            "n_keys": 20 + m,
        }  # fmt: skip
        for m in (0, 8)
        for f in (0, 1, 2)
        for layer in (0, 1)
        for h in (0, 1, 2)
    ]
    loss = [
        {
            "amount": m,
            "fact_id": f,
            "rank_by": "attention",
            "renormalize": False,
            "n": n,
            "nll": 1.0 + m / n + f,
            "nll_full": 1.0 + f,
            "delta_nll_rel": 0.0,
            "n_keys": 20 + m,
        }  # fmt: skip
        for m in (0, 8)
        for f in (0, 1, 2)
        for n in (2, 4)
    ]
    return SupportingFact(pd.DataFrame(heads, columns=HEAD_COLUMNS), pd.DataFrame(loss, columns=LOSS_COLUMNS),
                          pd.DataFrame(), {})  # fmt: skip


def test_fact_attention_is_the_median_and_quartiles_over_heads_of_each_heads_median_over_facts() -> None:
    result = fact_result()
    fig = tlg.plot.fact_attention(result, head=(1, 2))
    per_head = result.heads.groupby(["amount", "layer", "head"]).mass.median()
    for i, m in enumerate((0, 8)):
        values = per_head.loc[m].to_numpy()
        assert fig.data[0].y[i] == pytest.approx(np.quantile(values, 0.75))
        assert fig.data[1].y[i] == pytest.approx(np.quantile(values, 0.25))
        assert fig.data[2].y[i] == pytest.approx(np.median(values))
        assert fig.data[3].y[i] == pytest.approx(per_head.loc[(m, 1, 2)])
    assert fig.data[3].name == "L1H2"
    with pytest.raises(InputError, match="not a \\(layer, head\\)"):
        tlg.plot.fact_attention(result, head=(5, 0))


def test_fact_loss_draws_full_attention_and_each_n_averaged_over_facts() -> None:
    fig = tlg.plot.fact_loss(fact_result())
    assert [t.name for t in fig.data] == ["full attention", "top-2", "top-4"]
    assert fig.data[0].y.tolist() == [2.0, 2.0]
    assert fig.data[1].y.tolist() == [2.0, 6.0]  # 1 + m / 2 + mean(f)


# ----------------------------------------------------------------------------- log axes read as numbers


def log_axes(fig) -> dict:
    layout = fig.to_plotly_json()["layout"]
    return {name: axis for name, axis in layout.items() if isinstance(axis, dict) and axis.get("type") == "log"}


def assert_full_labels(fig) -> None:
    axes = log_axes(fig)
    assert axes
    for name, axis in axes.items():
        values, labels = axis.get("tickvals"), axis.get("ticktext")
        assert values and labels and len(values) == len(labels), name
        assert [float(label) for label in labels] == pytest.approx(list(values)), name  # "20" for 20


def budget_table() -> pd.DataFrame:
    rows = []
    for b in (2, 4, 8, 16, 32):
        rows += [
            {"rule": "uniform", "mean_budget": b, "delta_nll_rel": 0.5 / b},
            {"rule": "geometry", "mean_budget": b, "delta_nll_rel": 0.4 / b},  # 20 % below uniform
            {"rule": "streaming", "mean_budget": b, "delta_nll_rel": 20.0 / b},
        ]
    return pd.DataFrame(rows)


def test_log_tick_values_cover_the_data_with_whole_numbers() -> None:
    assert log_tick_values(1, 64) == [1, 2, 5, 10, 20, 50, 100]
    assert log_tick_values(3, 30) == [2, 5, 10, 20, 50]
    assert log_tick_values(1, 1e6) == [1, 10, 100, 1000, 1e4, 1e5, 1e6]  # 1-2-5 would be 19 ticks


def test_budget_pareto_is_readable_where_the_rules_differ_by_20_percent() -> None:
    fig = budget_table().pipe(tlg.plot.budget_pareto)
    assert_full_labels(fig)
    assert fig.layout.yaxis.type == "log"  # a 20 % gap is a constant distance, whatever streaming does
    assert "delta_nll_rel" not in fig.layout.yaxis.title.text and "loss" in fig.layout.yaxis.title.text
    with_zero = budget_table().assign(delta_nll_rel=lambda t: t.delta_nll_rel - 0.1)
    assert tlg.plot.budget_pareto(with_zero).layout.yaxis.type == "linear"  # a point at or below 0


def test_fact_attention_ranks_start_at_1_with_full_labels() -> None:
    fig = tlg.plot.fact_attention(fact_result())
    assert_full_labels(fig)
    assert fig.layout.yaxis2.range[0] == 0  # log10(1): the axis starts at rank 1
    assert fig.layout.yaxis2.tickvals[0] == 1


def test_n_star_by_context_labels_both_log_log_panels_in_full() -> None:
    fig = tlg.plot.n_star_by_context(context_table())
    assert {"xaxis", "xaxis2", "yaxis", "yaxis2"} <= set(log_axes(fig))
    assert_full_labels(fig)


def retrieval_result():
    from tl_geometry.competition.retrieval import ANSWER_COLUMNS, Retrieval

    rows = []
    for condition, amount, deltas in (("neutral", 0, (0.5, 0.05)), ("neutral", 512, (0.9, 0.3))):
        for example in range(3):
            for n, delta in zip((8, 64), deltas):
                rows.append({"condition": condition, "amount": amount, "example_id": example, "rank_by": "attention",
                             "renormalize": False, "n": n, "answer_loss": 1.0 + delta, "correct": example > 0,
                             "answer_loss_full": 1.0, "correct_full": example != 1, "delta_loss": delta,
                             "n_keys": 40 + amount})  # fmt: skip
    return Retrieval(pd.DataFrame(), pd.DataFrame(rows, columns=ANSWER_COLUMNS), pd.DataFrame(), {"tolerance": 0.1})


def test_retrieval_n_star_draws_a_censored_point_open_at_the_largest_size() -> None:
    result = retrieval_result()
    stars = result.n_star()
    assert stars.n_star_text.tolist() == ["64", "> 64"] and stars.censored.tolist() == [False, True]
    fig = tlg.plot.retrieval_n_star(result)
    points, accuracy = fig.data
    assert points.x.tolist() == [0, 512] and list(points.y) == [64, 64]
    assert list(points.marker.symbol) == ["circle", "circle-open"] and list(points.text) == ["", "> 64"]
    assert accuracy.y.tolist() == pytest.approx([2 / 3, 2 / 3])
