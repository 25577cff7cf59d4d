"""``RunStore``: a damaged part is listed for repair (``repair=True``) or refused, never read."""

from __future__ import annotations

import pandas as pd
import pytest

from tl_geometry.io.store import RunStore, StoreError

IDENTITY = {"model": "tiny", "seed": 0}


def table(seqs: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"seq": seqs, "value": [float(i) * 0.5 for i in seqs]})


def saved_store(tmp_path) -> RunStore:
    store = RunStore(tmp_path / "s", IDENTITY)
    store.write([0, 2], table([0, 2]), {})
    store.write([4], table([4]), {})
    return store


def test_a_part_changed_inside_is_refused_without_repair(tmp_path) -> None:
    store = saved_store(tmp_path)
    path = store.part_paths()[0]
    table([0, 3]).to_parquet(path, index=False)  # readable, but not what was written
    with pytest.raises(StoreError, match="SHA-256 differs"):
        RunStore(tmp_path / "s", IDENTITY)


def test_repair_lists_the_damaged_part_with_its_windows_and_replaces_it(tmp_path) -> None:
    store = saved_store(tmp_path)
    first, second = store.part_paths()
    first.write_bytes(first.read_bytes()[:50])
    repaired = RunStore(tmp_path / "s", IDENTITY, repair=True)
    assert repaired.damaged == {first.name: [0, 2]} and repaired.done_seqs() == {0, 2, 4}
    repaired.replace_part(first.name, table([0, 2]))
    again = RunStore(tmp_path / "s", IDENTITY)  # nothing damaged now
    assert again.damaged == {}
    pd.testing.assert_frame_equal(again.read(table([])), table([0, 2, 4]))


def test_a_store_without_the_windows_of_its_parts_is_still_refused(tmp_path) -> None:
    import json

    store = saved_store(tmp_path)
    progress = json.loads(store.progress_file.read_text())
    del progress["part_seqs"]  # as a store of an earlier version
    store.progress_file.write_text(json.dumps(progress))
    store.part_paths()[1].unlink()
    with pytest.raises(StoreError, match="missing"):
        RunStore(tmp_path / "s", IDENTITY, repair=True)
