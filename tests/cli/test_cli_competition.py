"""``tl-geometry context`` and ``tl-geometry fact``: files written, resume, one-line errors before the model loads."""

from __future__ import annotations

import json
import re

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
    stars = pd.read_parquet(out / "context_n_star.parquet")
    assert len(stars) == 2 and stars.n_boot.eq(1000).all() and (stars.n_star_low <= stars.n_star_high).all()
    assert len(pd.read_parquet(out / "context_slopes.parquet")) == 1
    assert main([*argv, "--resume"]) == 0
    assert pd.read_parquet(out / "context.parquet").equals(table)
    assert main([*argv, "--force", "--absolute-tolerance", "0.2", "--bootstrap", "50"]) == 0
    stars = pd.read_parquet(out / "context_n_star.parquet")
    assert sorted(set(stars.tolerance_kind)) == ["absolute", "relative"] and stars.n_boot.eq(50).all()
    assert "log-log slope" in capsys.readouterr().out


def test_context_reads_a_corpus_file_whose_name_holds_a_comma(tiny, tmp_path) -> None:
    doc = tmp_path / "notes, part 1.txt"
    doc.write_text("the quick brown fox jumps over the lazy dog; " * 3)
    argv = ["context", "--corpus", str(doc), "--n-docs", "1", "--contexts", "8,16", "--targets", "4", "--ns", "2",
            "--renormalize", "deletion", "--bootstrap", "0", "--no-progress", "--out", str(tmp_path / "ctx")]  # fmt: skip
    assert main(argv) == 0
    assert sorted(set(pd.read_parquet(tmp_path / "ctx" / "context.parquet").context)) == [8, 16]


FACTS = [
    {"fact": "Bo moved to the den.", "question": "Where is Bo? In the ", "answer": "den"},
    {"fact": "Al moved to the hall.", "question": "Where is Al? In the ", "answer": "hall",
     "candidates": ["hall", "den", "attic"], "competitors": ["Bo moved to the attic."]},
]  # fmt: skip


def fact_argv(tmp_path, *extra):
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(FACTS))
    background = tmp_path / "bg.txt"
    background.write_text("lorem ipsum dolor sit amet " * 5)
    return ["fact", "--facts", str(facts), "--background", str(background), "--amounts", "0,16", "--ns", "2,4",
            "--no-progress", "--out", str(tmp_path / "fact"), *extra]  # fmt: skip


def context_argv(tmp_path):
    """A small context run on one document (the output folder given by the caller)."""
    doc = tmp_path / "doc.txt"
    doc.write_text("the quick brown fox jumps over the lazy dog; " * 3)
    return ["context", "--corpus", str(doc), "--n-docs", "1", "--contexts", "8,16", "--targets", "4", "--ns", "2",
            "--renormalize", "deletion", "--bootstrap", "0", "--no-progress"]  # fmt: skip


def test_context_prints_and_keeps_a_censored_n_star(tiny, tmp_path, capsys) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text("the quick brown fox jumps over the lazy dog; " * 3)
    argv = ["context", "--corpus", str(doc), "--n-docs", "1", "--contexts", "8,16", "--targets", "4", "--ns", "1",
            "--tolerance", "0", "--renormalize", "deletion", "--no-progress", "--out", str(tmp_path / "ctx")]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    table = pd.read_parquet(tmp_path / "ctx" / "context.parquet")
    censored = table[table.censored]
    assert len(censored) and (censored.n_star_text == "> 1").all() and (censored.n_max == 1).all()
    assert "<NA>" not in printed and printed.count("N* = > 1  N*/L = > ") == len(censored)


def test_fact_writes_tables_and_page_and_keeps_a_censored_n_star(tiny, tmp_path, capsys) -> None:
    assert main(fact_argv(tmp_path, "--tolerance", "0")) == 0
    out = tmp_path / "fact"
    heads, stars = pd.read_parquet(out / "heads.parquet"), pd.read_parquet(out / "n_star.parquet")
    assert sorted(set(heads.amount)) == [0, 16] and (out / "index.html").exists()
    assert len(stars) == 2 * 2 and stars.censored.any()  # conditions x amounts, censored ones included
    printed = capsys.readouterr().out
    for row in stars.itertuples():
        assert row.n_star_text == ("> 4" if row.censored else str(row.n_star))
    assert "n_star_text" in printed


def test_fact_resume_refuses_other_settings_before_the_model_loads(tiny, tmp_path, capsys, monkeypatch) -> None:
    assert main(fact_argv(tmp_path)) == 0
    answers = pd.read_parquet(tmp_path / "fact" / "answers.parquet")
    capsys.readouterr()
    monkeypatch.setattr(tlg, "load_model", lambda *a, **k: pytest.fail("the model must not be loaded"))
    for extra, message in [
        (["--model", "gpt2-xl"], "gpt2-xl vs smollm2-135m"),
        (["--amounts", "0,8"], "--amounts (0,8 vs 0,16)"),
        (["--tolerance", "0.5"], "0.5 vs 0.1"),
        (["--rank-by", "random"], "random vs attention"),
    ]:
        argv = fact_argv(tmp_path, "--resume")
        if extra[0] == "--amounts":
            argv[argv.index("--amounts") + 1] = extra[1]
            extra = []
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    monkeypatch.setattr(tlg, "load_model", lambda name, **kw: tiny)
    assert main(fact_argv(tmp_path, "--resume")) == 0  # the same settings: nothing left, the same tables
    assert pd.read_parquet(tmp_path / "fact" / "answers.parquet").equals(answers)


def test_an_interrupted_fact_resumes_to_the_uninterrupted_tables(tiny, tmp_path, capsys, monkeypatch) -> None:
    from tl_geometry.competition import retrieval

    original, calls = retrieval.candidate_scores, {"n": 0}

    def interrupt(*a, **k):
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt
        return original(*a, **k)

    monkeypatch.setattr(retrieval, "candidate_scores", interrupt)
    assert main(fact_argv(tmp_path)) == 130
    assert "continue with" in capsys.readouterr().err and (tmp_path / "fact" / "retrieval.json").exists()
    monkeypatch.setattr(retrieval, "candidate_scores", original)
    assert main(fact_argv(tmp_path, "--resume")) == 0
    resumed = pd.read_parquet(tmp_path / "fact" / "answers.parquet")
    assert main(fact_argv(tmp_path, "--force")) == 0
    pd.testing.assert_frame_equal(resumed, pd.read_parquet(tmp_path / "fact" / "answers.parquet"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["context", "--contexts", "64,128", "--targets", "64"], "--targets must be in 1..63"),
        (["context", "--contexts", "1,128"], "integer >= 2"),
        (["context", "--ns", "0"], "--ns sizes must be integers >= 1"),
        (["context", "--bootstrap", "-1"], "--bootstrap must be an integer in 0..100000"),
        (["context", "--absolute-tolerance", "nan"], "--absolute-tolerance must be a finite number"),
        (["context", "--contexts", "128,100000"], "--contexts 100000 is longer than the context of smollm2-135m"),
        (["fact", "--amounts", "-1"], "integer >= 0"),
        (["fact", "--ns", "0"], "--ns: n must be an integer >= 1"),
        (["fact", "--conditions", "noise"], "conditions must be"),
        (["fact", "--model", "/nonexistent/model"], "is a path, but no such file"),
        (["fact", "--amounts", "0,1e3"], "--amounts must be a comma-separated list of integers, got '0,1e3'"),
        (["fact", "--amounts", ","], "--amounts: amounts is empty"),
        (["fact", "--seed", "-1"], "--seed must be an integer >= 0"),
        (["fact", "--tolerance", "nan"], "--tolerance must be a finite number of nats"),
        (["fact", "--top", "0"], "--top"),
        (["fact", "--facts", "/nonexistent.json"], "cannot read a JSON list"),
        (["fact", "--amounts", "0,9000"], "--amounts 9000 leaves no room in the context of smollm2-135m (8192"),
        (["fact", "--amounts", f"0,{10**30}"], "leaves no room in the context of smollm2-135m"),
        (["fact", "--ns", f"1,{10**30}"], "is more keys than the context of smollm2-135m holds (8192)"),
        (["fact", "--n-examples", str(10**30)], "--n-examples must be in 1..100000"),
        (["context", "--bootstrap", str(10**9)], "--bootstrap must be an integer in 0..100000"),
        (["context", "--seed", "-1"], "--seed must be an integer in 0..2**64 - 1"),
        (["context", "--seed", str(2**64)], "--seed must be an integer in 0..2**64 - 1"),
        (
            ["context", "--contexts", "64,128", "--targets", "4", "--ns", f"2,{10**30}"],
            "more keys than the longest context holds (128)",
        ),
    ],
)
def test_bad_options_are_one_line_before_the_model_loads(monkeypatch, tmp_path, capsys, argv, message) -> None:
    monkeypatch.setattr(tlg, "load_model", lambda *a, **k: pytest.fail("the model must not be loaded"))
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "facts, message",
    [
        (["abc"], 'item 0 is "abc", not an object with fact, question, answer'),
        ([["fact", "question", "answer"]], "not an object"),
        ([{"fact": "f", "question": "q", "answer": "a", "hint": "h"}], "unknown keys ['hint']"),
        (
            [{"fact": "f", "question": "q", "answer": "a", "candidates": ["a", "b"]}],
            "--conditions competitors: the example 'f' has no competitor facts",
        ),
    ],
)
def test_a_facts_file_is_read_by_its_schema_before_the_model_loads(monkeypatch, tmp_path, capsys, facts, message):
    monkeypatch.setattr(tlg, "load_model", lambda *a, **k: pytest.fail("the model must not be loaded"))
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(facts))
    assert main(["fact", "--facts", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def damage(path) -> None:
    """64 zero bytes written into the middle of ``path``, its size unchanged."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("table", ["answers.parquet", "heads.parquet", "summary.parquet"])
def test_fact_resume_refuses_a_damaged_table_naming_it(tiny, tmp_path, capsys, monkeypatch, table) -> None:
    assert main(fact_argv(tmp_path)) == 0
    damage(tmp_path / "fact" / table)
    capsys.readouterr()
    monkeypatch.setattr(tlg, "load_model", lambda *a, **k: pytest.fail("the model must not be loaded"))
    assert main(fact_argv(tmp_path, "--resume")) == 2
    err = capsys.readouterr().err
    assert f"{table} is damaged" in err and "--force" in err and err.count("\n") == 1, err


def test_context_resume_refuses_a_damaged_table_naming_it(tiny, tmp_path, capsys, monkeypatch) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text("the quick brown fox jumps over the lazy dog; " * 3)
    argv = ["context", "--corpus", str(doc), "--n-docs", "1", "--contexts", "8,16", "--targets", "4", "--ns", "2",
            "--renormalize", "deletion", "--bootstrap", "0", "--no-progress", "--out", str(tmp_path / "ctx")]  # fmt: skip
    assert main(argv) == 0
    damage(tmp_path / "ctx" / "context.parquet")
    capsys.readouterr()
    monkeypatch.setattr(tlg, "load_model", lambda *a, **k: pytest.fail("the model must not be loaded"))
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "context.parquet is damaged" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("command", ["fact", "context"])
@pytest.mark.parametrize("mode", ["--resume", "--force", None])
def test_a_foreign_folder_is_refused_before_its_lock_is_made(tiny, tmp_path, capsys, command, mode) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    argv = fact_argv(tmp_path) if command == "fact" else context_argv(tmp_path)
    argv = [*argv, "--out", str(folder), *([mode] if mode else [])]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "written by tl-geometry" in err and "choose another --out" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("command", ["fact", "context"])
def test_report_rebuilds_the_page_of_a_finished_fact_or_context(tiny, tmp_path, capsys, monkeypatch, command) -> None:
    out = tmp_path / "out"
    argv = fact_argv(tmp_path) if command == "fact" else context_argv(tmp_path)
    assert main([*argv, "--out", str(out)]) == 0
    written = (out / "index.html").read_text()
    (out / "index.html").unlink()
    capsys.readouterr()
    monkeypatch.setattr(tlg, "load_model", lambda *a, **k: pytest.fail("report loads no model"))
    assert main(["report", str(out)]) == 0
    assert "holds no result" not in capsys.readouterr().err

    def undated(page: str) -> str:  # the page says when it was written
        return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "DATE", page)

    assert undated((out / "index.html").read_text()) == undated(written) and "DATE" in undated(written)
    table = "answers.parquet" if command == "fact" else "context.parquet"
    damage(out / table)
    capsys.readouterr()
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{table} is damaged" in err and "--force" in err and err.count("\n") == 1, err


def test_report_on_an_interrupted_fact_names_the_command_that_finishes_it(tiny, tmp_path, capsys, monkeypatch) -> None:
    from tl_geometry.competition import retrieval

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    original = retrieval.candidate_scores
    calls = {"n": 0}

    def once_then_interrupt(*a, **k):
        calls["n"] += 1
        return original(*a, **k) if calls["n"] < 7 else interrupt()  # after the first units are saved

    monkeypatch.setattr(retrieval, "candidate_scores", once_then_interrupt)
    assert main(fact_argv(tmp_path)) == 130
    capsys.readouterr()
    assert (tmp_path / "fact" / "retrieval.json").exists()
    assert main(["report", str(tmp_path / "fact")]) == 2
    err = capsys.readouterr().err
    assert "interrupted `tl-geometry fact` run" in err and "--resume" in err and err.count("\n") == 1, err
    assert not (tmp_path / "fact" / "index.html").exists()
