"""A run's means, summaries, figures and report from rows kept on disk: equal to the rows in memory,
and the rows are never read whole (definitions §2, §4, §5; docs/architecture.md "Memory").

References are the obvious pandas computations over ``separability`` in memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import torch

import tl_geometry as tlg
from tl_geometry.capture.observers import LOCAL_ERROR_METRICS, SEPARABILITY_METRICS
from tl_geometry.io.rows_on_disk import RowsOnDisk
from tl_geometry.report import build_report

KWARGS = dict(
    batch_size=2,
    progress=False,
    bounds=True,
    taxonomy=True,
    rank_by=("attention", "random"),
    query_positions=[7, 15],
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[tlg.AnalysisResult, tlg.AnalysisResult, Path]:
    model = tlg.testing.tiny_llama_bridge()
    tokens = torch.randint(3, 259, (5, 16), generator=torch.Generator().manual_seed(3))
    out = tmp_path_factory.mktemp("streamed")
    memory = tlg.analyze(model, tokens, **KWARGS)
    disk = tlg.analyze(model, tokens, out_dir=out / "run", **KWARGS)
    return memory, disk, out


def _close(got: pd.DataFrame, want: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(
        got.reset_index(drop=True), want.reset_index(drop=True), check_exact=False, rtol=1e-12, atol=0
    )


def test_means_from_disk_equal_pandas_over_the_rows_in_memory(runs) -> None:
    memory, disk, _ = runs
    rows = memory.separability
    attention = rows[rows.rank_by == "attention"]
    want = attention.groupby("n")[SEPARABILITY_METRICS].mean().reset_index()
    _close(disk.mean_by_n(), want)
    _close(memory.mean_by_n(), want)

    grouped = rows.groupby(["rank_by", "n"], sort=False)
    want = grouped[[*SEPARABILITY_METRICS, *LOCAL_ERROR_METRICS]].mean()
    want["n_rows"] = grouped.size()
    want = want.reset_index().sort_values(["rank_by", "n"])  # attention before random, as given
    _close(disk.mean_by_ranking(), want)

    inside = attention.assign(
        precision_inside=(
            (attention.precision >= attention.precision_lower - 1e-12)
            & (attention.precision <= attention.precision_upper + 1e-12)
        ).astype(float),
        recall_below=(attention.recall < attention.recall_lower - 1e-12).astype(float),
    )
    env = disk.envelopes()
    by_n = inside.groupby("n")
    assert env["rows"].tolist() == by_n.size().tolist()
    for column in ("precision", "precision_upper", "recall_lower", "precision_inside", "recall_below"):
        np.testing.assert_allclose(env[column], by_n[column].mean(), rtol=1e-12, atol=0)
    assert isinstance(disk.rows, RowsOnDisk)  # every mean above came from batches of the file


def test_sink_effect_and_regime_curves_from_disk_equal_the_rows(runs) -> None:
    memory, disk, _ = runs
    rows = memory.separability
    rows = rows[(rows.rank_by == "attention") & (rows.query_pos == 15)]
    rho = tlg.taxonomy.rho0_table(memory.regime_features)
    rho = rho[rho.query_pos == 15][["layer", "head", "rho_0"]]
    recall = rows.groupby(["layer", "head", "n"])["recall"].mean().reset_index().merge(rho, on=["layer", "head"])
    table = disk.sink_effect(query_pos=15).set_index("n")
    for n, part in recall.groupby("n"):
        if part.recall.nunique() > 1:
            assert table.loc[n, "pearson"] == pytest.approx(scipy.stats.pearsonr(part.recall, part.rho_0)[0], rel=1e-9)
            tied = part.recall.round(12)  # means equal up to rounding are ties
            assert table.loc[n, "spearman"] == pytest.approx(scipy.stats.spearmanr(tied, part.rho_0)[0], rel=1e-9)

    heads = disk.classify_heads(query_pos=15, mode="nearest")
    curves = tlg.taxonomy.regime_pr_curves(disk.separability_sums(), heads, query_pos=15)
    per_head = rows.groupby(["layer", "head", "n"])[["precision", "recall"]].mean().reset_index()
    per_head = per_head.merge(heads[["layer", "head", "regime"]].astype({"regime": str}), on=["layer", "head"])
    want = per_head.groupby(["regime", "n"])[["precision", "recall"]].mean().reset_index()
    got = curves.astype({"regime": str}).sort_values(["regime", "n"])
    _close(got[["regime", "n", "precision", "recall"]], want)
    assert got["n_rows"].tolist() == [5 * c for c in per_head.groupby(["regime", "n"]).size().tolist()]
    assert isinstance(disk.rows, RowsOnDisk)


def test_figures_from_disk_draw_the_means_of_the_rows(runs) -> None:
    memory, disk, _ = runs
    rows = memory.separability
    attention = rows[rows.rank_by == "attention"]
    fig = tlg.plot.separability_by_n(disk)
    want = attention.groupby("n")["precision"].mean()
    assert fig.data[0].x.tolist() == want.index.tolist()
    np.testing.assert_allclose(fig.data[0].y, want, rtol=1e-12, atol=0)
    assert f"over {len(attention)} rows" in fig.layout.title.text
    fig = tlg.plot.separability_by_ranking(disk, ["recall"])
    np.testing.assert_allclose(
        fig.data[1].y, rows[rows.rank_by == "random"].groupby("n")["recall"].mean(), rtol=1e-12, atol=0
    )
    tlg.plot.envelopes_by_n(disk)
    assert isinstance(disk.rows, RowsOnDisk)


def test_the_report_of_a_saved_run_never_reads_its_rows_whole(runs, monkeypatch) -> None:
    """The report of a run directory reads the separability rows in batches only: no
    ``pandas.read_parquet`` of ``separability.parquet`` (the whole table) anywhere."""
    _, disk, out = runs
    saved = disk.save(out / "saved")
    real = pd.read_parquet

    def read_parquet(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        assert Path(path).name != "separability.parquet", "the separability rows were read whole"
        return real(path, *args, **kwargs)

    monkeypatch.setattr(pd, "read_parquet", read_parquet)
    page = build_report(saved, out / "report").read_text(encoding="utf-8")
    rows = disk.separability_sums()
    n_attention = int(rows[rows.rank_by == "attention"].n_rows.sum())
    assert f"{n_attention:,} rows: 5 windows" in page and "Envelopes by N" in page
