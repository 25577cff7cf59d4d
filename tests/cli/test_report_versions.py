"""``tl-geometry report`` on what another version wrote (issue 47): a ``result.json`` without
``config``, with a ``model`` key this version does not know, or an odd ``run.json`` — read, or
refused in one line naming the version that wrote it; never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_llama_bridge

import tl_geometry as tlg
from tl_geometry.cli.app import main

SMALL = ["--n-seqs", "2", "--seq-len", "16", "--batch-size", "1", "--no-progress", "--no-diagnostics", "--no-bounds"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "done"
    model = tiny_llama_bridge()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tlg, "load_model", lambda name, **kw: model)
        assert main(["run", "--out", str(out), *SMALL]) == 0
    return out


@pytest.fixture()
def meta(finished):
    """``result.json`` as a dict; the test's edits are written back by ``write``, undone after it."""
    path = finished / "result.json"
    saved = path.read_text()
    yield json.loads(saved)
    path.write_text(saved)


def write(finished: Path, meta: dict) -> None:
    (finished / "result.json").write_text(json.dumps(meta))


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("tl-geometry: error: "), err
    return lines[0]


def test_result_json_records_the_version_that_wrote_it(finished, meta) -> None:
    assert meta["version"] == tlg.__version__


def test_report_refuses_a_result_without_config_naming_the_version(finished, meta, capsys) -> None:
    del meta["config"]
    meta["version"] = "0.9.1"
    write(finished, meta)
    assert main(["report", str(finished)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "result.json" in line and "no 'config' entry" in line and "tl_geometry 0.9.1" in line


def test_report_refuses_a_model_key_it_does_not_know_naming_the_version(finished, meta, capsys) -> None:
    meta["model"]["n_experts"] = 8
    meta["version"] = "9.0"
    write(finished, meta)
    assert main(["report", str(finished)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "['n_experts']" in line and "read it with tl_geometry 9.0" in line


def test_report_refuses_a_result_of_no_recorded_version_missing_a_model_key(finished, meta, capsys) -> None:
    del meta["model"]["n_ctx"]
    meta.pop("version", None)
    write(finished, meta)
    assert main(["report", str(finished)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "['n_ctx']" in line and "did not record its version" in line


def test_report_reads_a_run_json_of_odd_shape(finished, capsys) -> None:
    path = finished / "run.json"
    saved = path.read_text()
    try:
        for odd in ({"timings": 5, "versions": "x", "python": 3}, [1, 2], {"versions": {"torch": [1]}}):
            path.write_text(json.dumps(odd))
            assert main(["report", str(finished)]) == 0, capsys.readouterr().err
            assert "Traceback" not in capsys.readouterr().err
    finally:
        path.write_text(saved)


# ----------------------------------------------------------------------------- checksums of what a run wrote


def overwrite_middle(path: Path) -> bytes:
    """Overwrite up to 4 KB in the middle of ``path`` (the footer intact: the file still parses); the old bytes."""
    data = path.read_bytes()
    n = min(4096, len(data) // 4)
    start = len(data) // 2 - n // 2
    path.write_bytes(data[:start] + bytes(255 - b for b in data[start : start + n]) + data[start + n :])
    return data


@pytest.mark.parametrize("name", ["separability.parquet", "heads.parquet", "tokens.npy"])
def test_report_names_a_file_changed_after_it_was_written(finished, capsys, name) -> None:
    """Issue 47: 4 KB overwritten in the middle of a finished table went unnoticed (report exit 0)."""
    path = finished / name
    saved = overwrite_middle(path)
    try:
        assert main(["report", str(finished)]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert f"{path} is damaged: its SHA-256 differs" in line
    finally:
        path.write_bytes(saved)
    assert main(["report", str(finished)]) == 0


def test_load_result_refuses_a_changed_table(finished) -> None:
    path = finished / "separability.parquet"
    saved = overwrite_middle(path)
    try:
        with pytest.raises(tlg.InputError, match="SHA-256"):
            tlg.load_result(finished)
    finally:
        path.write_bytes(saved)
    assert tlg.load_result(finished).model.name


def test_a_result_without_checksums_still_reads(finished) -> None:
    """A directory written before checksums were recorded: nothing to compare, read as before."""
    manifest = finished / "checksums.json"
    saved = manifest.read_bytes()
    manifest.unlink()
    try:
        assert tlg.load_result(finished).model.name
    finally:
        manifest.write_bytes(saved)
