"""Sums of a row table per group: every mean over rows from sums streamed out of parquet.

The reference is the obvious one: ``groupby(by).mean()`` over the rows in memory. The sums of a
file read a few rows at a time must give the same means (to 1e-12) and the same counts (exactly),
missing values included, for any coarser grouping and any batch size.
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pandas as pd
from hypothesis import given, settings

from tl_geometry.io.row_sums import group_sums, is_sums_table, means_of_sums

GROUPS = ["layer", "head", "rank_by", "n"]


def _rows(seed: int, n_seqs: int = 5, nan_share: float = 0.2) -> pd.DataFrame:
    """A separability-like row table: every (seq, layer, head, rank_by, n), two values, some NaN."""
    rng = np.random.default_rng(seed)
    index = pd.MultiIndex.from_product(
        [range(n_seqs), range(2), range(3), ["attention", "random"], [1, 2, 4]], names=["seq", *GROUPS]
    )
    rows = index.to_frame(index=False)
    rows["recall"] = rng.uniform(size=len(rows))
    rows["local_error_del"] = np.where(rng.uniform(size=len(rows)) < nan_share, np.nan, rng.normal(size=len(rows)))
    rows["n_draws"] = rng.integers(0, 4, size=len(rows))
    rows["distance"] = "euclidean"  # text columns are not summed
    return rows


def _reference(rows: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Means over the rows as pandas computes them, and the number of rows, per group of ``by``."""
    grouped = rows.groupby(by, sort=True)
    out = grouped[["recall", "local_error_del", "n_draws"]].mean()
    out.insert(0, "n_rows", grouped.size())
    return out.reset_index()


def _check(means: pd.DataFrame, reference: pd.DataFrame) -> None:
    means = means[reference.columns]
    pd.testing.assert_frame_equal(means, reference, check_exact=False, rtol=1e-12, atol=0, check_dtype=False)
    assert (means["n_rows"].to_numpy() == reference["n_rows"].to_numpy()).all()  # counts exact


def test_means_of_file_sums_equal_the_means_of_the_rows(tmp_path: Path) -> None:
    rows = _rows(0)
    rows.to_parquet(tmp_path / "rows.parquet", index=False)
    sums = group_sums(tmp_path / "rows.parquet", GROUPS, batch_rows=7)  # many batches, groups split across them
    assert is_sums_table(sums) and not is_sums_table(rows)
    assert sums.attrs["n_seqs"] == 5 and "distance" not in sums.columns
    for k in range(len(GROUPS) + 1):
        for by in combinations(GROUPS, k):
            if by:
                _check(means_of_sums(sums, list(by)), _reference(rows, list(by)))
    everything = means_of_sums(sums, [])
    assert everything["n_rows"].item() == len(rows)
    assert np.isclose(everything["local_error_del"].item(), rows["local_error_del"].mean(), rtol=1e-12, atol=0)


def test_a_group_without_values_has_a_nan_mean_as_pandas_gives_it() -> None:
    rows = _rows(1, nan_share=0.0)
    rows.loc[rows["n"] == 4, "local_error_del"] = np.nan
    means = means_of_sums(group_sums(rows, GROUPS), ["n"])
    _check(means, _reference(rows, ["n"]))
    assert means.set_index("n")["local_error_del"].isna().tolist() == [False, False, True]


def test_sums_keep_the_order_in_which_groups_first_appear() -> None:
    rows = _rows(2)
    rows = rows[rows["seq"] >= 0].iloc[::-1]  # rank_by random first
    sums = group_sums(rows, GROUPS, batch_rows=5)
    assert list(dict.fromkeys(sums["rank_by"])) == ["random", "attention"]
    assert means_of_sums(sums, ["rank_by"], sort=False)["rank_by"].tolist() == ["random", "attention"]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n_seqs=st.integers(1, 6), batch_rows=st.integers(1, 200))
def test_any_batching_gives_the_same_sums(tmp_path_factory, seed: int, n_seqs: int, batch_rows: int) -> None:
    rows = _rows(seed, n_seqs)
    path = tmp_path_factory.mktemp("sums") / "rows.parquet"
    rows.to_parquet(path, index=False)
    whole, streamed = group_sums(rows, GROUPS), group_sums(path, GROUPS, batch_rows=batch_rows)
    count_columns = ["n_rows", *[c for c in whole.columns if c.endswith("__count")]]
    pd.testing.assert_frame_equal(streamed[count_columns], whole[count_columns], check_exact=True)
    for by in (["n"], ["layer", "head"], GROUPS):
        _check(means_of_sums(streamed, by), _reference(rows, by))
