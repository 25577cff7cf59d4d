"""A write that fails (a full disk) removes its temporary file and names the file (issue 23, item 4).

Fault injection: the write itself raises ``OSError(ENOSPC)``, in each writer that goes through a
temporary file: :func:`write_atomic`, the rows merged on disk, the run store's batches, the curve.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pandas as pd
import pytest

import tl_geometry as tlg
from tl_geometry.io.files import write_atomic, write_json_atomic
from tl_geometry.io.rows_on_disk import merge_parts
from tl_geometry.io.store import RunStore

TEXT = ["The quick brown fox jumps over the lazy dog. " * 12]


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def half_then_full(path: Path) -> None:
    path.write_bytes(b"half a file")
    disk_full()


def assert_full_disk_reported(caught: pytest.ExceptionInfo, path: Path) -> None:
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    assert not list(path.parent.rglob("*.tmp"))


def test_write_atomic_removes_its_temporary_file(tmp_path) -> None:
    target = tmp_path / "table.parquet"
    target.write_text("the old file")
    with pytest.raises(OSError) as caught:
        write_atomic(target, half_then_full)
    assert_full_disk_reported(caught, target)
    assert target.read_text() == "the old file"
    with pytest.raises(ZeroDivisionError):  # any failure of the writer, not only the disk's
        write_atomic(target, lambda p: (p.write_text("half"), 1 / 0))
    assert not list(tmp_path.glob("*.tmp"))


def test_a_failed_rename_removes_the_temporary_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(Path, "replace", disk_full)
    with pytest.raises(OSError) as caught:
        write_json_atomic(tmp_path / "run.json", {"a": 1})
    assert_full_disk_reported(caught, tmp_path / "run.json")


def test_merged_rows_on_a_full_disk(tmp_path, monkeypatch) -> None:
    import pyarrow.parquet as pq

    pd.DataFrame({"seq": [0, 1], "n": [1, 1], "rank_by": "attention"}).to_parquet(
        tmp_path / "part-000000-000001.parquet"
    )
    monkeypatch.setattr(pq.ParquetWriter, "write_table", disk_full)
    with pytest.raises(OSError) as caught:
        merge_parts(sorted(tmp_path.glob("part-*")), tmp_path / "all.parquet", ["seq", "n"], ["attention"])
    assert_full_disk_reported(caught, tmp_path / "all.parquet")


def test_a_batch_of_the_store_on_a_full_disk(tmp_path, monkeypatch) -> None:
    store = RunStore(tmp_path / "store", {"run": 1})
    monkeypatch.setattr(pd.DataFrame, "to_parquet", lambda self, path, **kw: half_then_full(Path(path)))
    with pytest.raises(OSError) as caught:
        store.write([0], pd.DataFrame({"seq": [0]}), {})
    assert_full_disk_reported(caught, tmp_path / "store" / "separability" / "part-000000-000000.parquet")
    assert not (tmp_path / "store" / "progress.json").exists()


def test_the_curve_on_a_full_disk(tmp_path, monkeypatch, llama_bridge) -> None:
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=1, seq_len=16)
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        return half_then_full(self) if self.name == "curve.json.tmp" else real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(OSError) as caught:
        tlg.sparsification_curve(llama_bridge, corpus, ns=[1], rank_by="attention", out_dir=tmp_path, progress=False)
    assert_full_disk_reported(caught, tmp_path / "curve.json")
