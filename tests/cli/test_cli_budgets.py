"""``tl-geometry budgets`` and the Pareto figure."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import tiny_llama_bridge

import tl_geometry as tlg
from tl_geometry.cli.app import main
from tl_geometry.competition.evaluate import EVALUATION_COLUMNS
from tl_geometry.errors import InputError


@pytest.fixture()
def tiny(monkeypatch):
    model = tiny_llama_bridge()
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: model)
    return model


ARGS = ["budgets", "--n-seqs", "2", "--seq-len", "16", "--budgets", "2,4", "--rules", "uniform,geometry,streaming",
        "--grid", "1,4", "--no-progress"]  # fmt: skip


def test_budgets_writes_the_tables_and_the_figure_and_resumes(tmp_path, tiny, capsys) -> None:
    out = tmp_path / "b"
    assert main([*ARGS, "--out", str(out)]) == 0
    table = pd.read_parquet(out / "budgets.parquet")
    assert list(table.columns) == EVALUATION_COLUMNS and len(table) == 2 * 3
    assert (table.realised_mean == table.mean_budget).all()
    heads = pd.read_parquet(out / "head_budgets.parquet")
    assert len(heads) == 6 * 2 * 4  # every (layer, head) of every point
    assert "B = 2: delta_nll_rel" in capsys.readouterr().out and "Per-head budgets" in (out / "index.html").read_text()
    assert main([*ARGS, "--out", str(out)]) == 2  # exists: --resume or --force
    assert main([*ARGS, "--out", str(out), "--resume"]) == 0
    pd.testing.assert_frame_equal(pd.read_parquet(out / "budgets.parquet"), table)


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--budgets", "0.5"], "outside [1, 8.5]"),
        (["--budgets", "x"], "comma lists of numbers"),
        (["--rules", "greedy"], "not a budget rule"),
        (["--grid", "32"], "no size below the window length"),
        (["--error-tolerance", "-1"], "--error-tolerance must be"),
    ],
)
def test_bad_options_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch, extra, words) -> None:
    monkeypatch.setattr(tlg, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main([*ARGS, *extra, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


def test_pareto_refuses_a_table_without_the_columns() -> None:
    with pytest.raises(InputError, match="evaluate_budgets"):
        tlg.plot.budget_pareto(pd.DataFrame({"rule": ["uniform"]}))
