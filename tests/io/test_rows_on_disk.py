"""Rows of a run with an output directory: merged from the parts on disk, read when first used.

The merged table must equal the in-memory assembly (a run without ``out_dir``) row for row, and
parts whose window ranges overlap (a resumed run, shards) must still come out in key order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

import tl_geometry as tlg
from tl_geometry.io.rows_on_disk import RowsOnDisk, merge_parts

KEY = ["seq", "layer", "rank_by", "n"]


def _part(seqs: list[int], seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [(s, layer, r, n) for s in seqs for layer in (1, 0) for r in ("random", "attention") for n in (3, 1, 2)]
    table = pd.DataFrame(rows, columns=KEY).sample(frac=1.0, random_state=seed).reset_index(drop=True)
    table["value"] = rng.normal(size=len(table))
    return table


def test_merge_of_overlapping_and_separate_parts_is_in_key_order(tmp_path: Path) -> None:
    parts = {"part-000000-000004.parquet": [0, 2, 4], "part-000001-000003.parquet": [1, 3],
             "part-000005-000006.parquet": [5, 6]}  # fmt: skip
    frames = []
    for i, (name, seqs) in enumerate(parts.items()):
        frames.append(_part(seqs, i))
        frames[-1].to_parquet(tmp_path / name, index=False)
    rows = merge_parts(sorted(tmp_path.glob("part-*")), tmp_path / "all.parquet", KEY, ["attention", "random"])
    rank = {"attention": 0, "random": 1}
    expected = (
        pd.concat(frames, ignore_index=True)
        .sort_values(KEY, key=lambda c: c.map(rank) if c.name == "rank_by" else c)
        .reset_index(drop=True)
    )
    assert (rows.n_rows, rows.n_layers) == (len(expected), 2)
    pd.testing.assert_frame_equal(rows.load(), expected, check_exact=True)


def test_a_run_with_out_dir_keeps_its_rows_on_disk_until_used(tmp_path: Path) -> None:
    model = tlg.testing.tiny_llama_bridge()
    tokens = torch.randint(3, 259, (5, 16), generator=torch.Generator().manual_seed(1))
    kwargs = dict(batch_size=2, progress=False, bounds=True, rank_by=("attention", "random"), query_positions=[7, 15])
    memory = tlg.analyze(model, tokens, **kwargs)
    disk = tlg.analyze(model, tokens, out_dir=tmp_path / "run", **kwargs)
    raw = disk.rows
    assert isinstance(raw, RowsOnDisk) and raw.n_rows == len(memory.separability)
    assert repr(disk) == repr(memory)
    disk.save(tmp_path / "saved")  # copied, still not read
    assert isinstance(disk.rows, RowsOnDisk)
    pd.testing.assert_frame_equal(disk.separability, memory.separability, check_exact=True)
    assert disk.separability.attrs == memory.separability.attrs
    saved = tlg.load_result(tmp_path / "saved")
    pd.testing.assert_frame_equal(saved.separability, memory.separability, check_exact=True)


def test_interleaved_shards_merge_one_range_of_windows_at_a_time(tmp_path: Path, monkeypatch) -> None:
    """torchrun's ranks hold windows r, r + W, ...: each part of one rank overlaps parts of the
    others. The merge holds at most one part's width of windows at a time (it used to sort every
    chain of overlapping parts together: two parts here, unbounded where part ranges chain)."""
    import pyarrow.parquet as pq

    world, batch, n_windows = 2, 2, 24
    frames = []
    for rank in range(world):
        mine = list(range(rank, n_windows, world))
        for i in range(0, len(mine), batch):
            seqs = mine[i : i + batch]
            frames.append(_part(seqs, len(frames)))
            frames[-1].to_parquet(tmp_path / f"part-{seqs[0]:06d}-{seqs[-1]:06d}.parquet", index=False)
    written: list[int] = []
    real = pq.ParquetWriter.write_table
    monkeypatch.setattr(
        pq.ParquetWriter,
        "write_table",
        lambda self, t, *a, **k: (written.append(t.num_rows), real(self, t, *a, **k))[1],
    )
    rows = merge_parts(sorted(tmp_path.glob("part-*")), tmp_path / "all.parquet", KEY, ["attention", "random"])
    rank = {"attention": 0, "random": 1}
    expected = (
        pd.concat(frames, ignore_index=True)
        .sort_values(KEY, key=lambda c: c.map(rank) if c.name == "rank_by" else c)
        .reset_index(drop=True)
    )
    pd.testing.assert_frame_equal(rows.load(), expected, check_exact=True)
    per_window = len(frames[0]) // batch
    width = batch * world - 1  # a part spans windows first .. first + (batch - 1) * world
    assert sum(written) == len(expected) and max(written) <= width * per_window < len(expected) // 4
