"""``tl-geometry context`` and ``tl-geometry fact``: files written, resume, one-line errors before the model loads."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import tl_geometry as tlg
from tl_geometry.cli.app import main


@pytest.fixture
def tiny(monkeypatch):
    model = tlg.testing.tiny_llama_bridge()
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: model)
    return model


def test_context_writes_curves_table_and_page_and_resumes(tiny, tmp_path, capsys) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text("the quick brown fox jumps over the lazy dog; " * 3)
    out = tmp_path / "ctx"
    argv = ["context", "--corpus", str(doc), "--n-docs", "1", "--contexts", "8,16", "--targets", "4", "--ns", "2,4",
            "--renormalize", "deletion", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    table = pd.read_parquet(out / "context.parquet")
    assert sorted(set(table.context)) == [8, 16] and (out / "context_16" / "curve.json").exists()
    assert (out / "index.html").exists() and "N* = " in capsys.readouterr().out
    assert main([*argv, "--resume"]) == 0
    assert pd.read_parquet(out / "context.parquet").equals(table)


def test_fact_writes_tables_and_page(tiny, tmp_path) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps([["Bob lives in Oslo.", "Where does Bob live? In", " Oslo"]]))
    background = tmp_path / "bg.txt"
    background.write_text("lorem ipsum dolor sit amet " * 5)
    out = tmp_path / "fact"
    argv = ["fact", "--facts", str(facts), "--background", str(background), "--amounts", "0,16", "--ns", "2",
            "--head", "1,0", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    heads = pd.read_parquet(out / "heads.parquet")
    assert sorted(set(heads.amount)) == [0, 16] and (out / "index.html").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["context", "--contexts", "64,128", "--targets", "64"], "--targets must be in 1..63"),
        (["context", "--contexts", "1,128"], "integer >= 2"),
        (["context", "--ns", "0"], "--ns sizes must be integers >= 1"),
        (["fact", "--amounts", "-1"], "integer >= 0"),
        (["fact", "--ns", "0"], "n must be an integer >= 1"),
        (["fact", "--head", "1"], "--head must be LAYER,HEAD"),
        (["fact", "--facts", "/nonexistent.json"], "not a JSON list"),
    ],
)
def test_bad_options_are_one_line_before_the_model_loads(monkeypatch, tmp_path, capsys, argv, message) -> None:
    monkeypatch.setattr(tlg, "load_model", lambda *a, **k: pytest.fail("the model must not be loaded"))
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
