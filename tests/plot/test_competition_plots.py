"""Figures of context scaling and the supporting fact: what the traces hold, from small tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import tl_geometry as tlg
from tl_geometry.competition.fact import HEAD_COLUMNS, LOSS_COLUMNS, SupportingFact
from tl_geometry.errors import InputError


def context_table():
    rows = []
    for context, star in ((128, 16), (256, 32), (512, None)):
        for n in (4, 16, 64):
            rows.append({"context": context, "rank_by": "attention", "renormalize": False, "n": n,
                         "n_star": star, "n_star_over_context": None if star is None else star / context})  # fmt: skip
    table = pd.DataFrame(rows)
    table["n_star"] = table["n_star"].astype("Int64")
    return table


def test_n_star_by_context_draws_n_star_and_its_fraction_log_log() -> None:
    fig = tlg.plot.n_star_by_context(context_table())
    left, right = fig.data
    assert left.x.tolist() == [128, 256] and left.y.tolist() == [16, 32]  # no size passed at 512: left out
    assert right.y.tolist() == [16 / 128, 32 / 256]
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
