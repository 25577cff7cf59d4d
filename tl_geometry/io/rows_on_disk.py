"""The row table of a long run kept on disk: merged from the batch parts without holding it in memory.

A run with an output directory saves every batch's rows as a parquet part (:mod:`tl_geometry.io.store`).
:func:`merge_parts` writes them into one parquet file in the table's key order, one range of
windows at a time: the range is as wide as the widest part, and only the rows of that range are read
from the parts that reach into it. The peak memory of the merge is that of about two batches,
whatever the number of windows, also for the interleaved parts of torchrun's ranks
(rank ``r`` of ``W`` holds windows ``r, r + W, ...``), which rank 0 merges straight from their stores. :class:`RowsOnDisk` stands for that file in an
:class:`~tl_geometry.pipeline.result.AnalysisResult` until the table is first used.

Examples
--------
>>> import tempfile, pathlib, pandas as pd
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> pd.DataFrame({"seq": [2, 2], "n": [2, 1], "rank_by": "attention"}).to_parquet(d / "part-000002-000002.parquet")
>>> pd.DataFrame({"seq": [0, 1], "n": [1, 1], "rank_by": "attention"}).to_parquet(d / "part-000000-000001.parquet")
>>> rows = merge_parts(sorted(d.glob("part-*")), d / "all.parquet", ["seq", "n"], rank_order=["attention"])
>>> rows.n_rows, rows.load()[["seq", "n"]].values.tolist()
(4, [[0, 1], [1, 1], [2, 1], [2, 2]])
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import pandas as pd

from tl_geometry.io.files import write_atomic

_PART_RE = re.compile(r"part-(\d+)-(\d+)\.parquet")


@dataclass(frozen=True)
class RowsOnDisk:
    """A row table saved as one parquet file, read when first needed (``load``).

    Attributes
    ----------
    path : the parquet file.
    n_rows : number of rows.
    n_layers : number of distinct layers (for a short description without reading the file).
    """

    path: Path
    n_rows: int
    n_layers: int

    @classmethod
    def of(cls, path: Path) -> "RowsOnDisk":
        """The row table saved in ``path``, described from its metadata and its ``layer`` column
        (read in batches): nothing else is read."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        layers: set[int] = set()
        with pq.ParquetFile(path) as file:
            n_rows = file.metadata.num_rows
            if "layer" in file.schema_arrow.names:
                for batch in file.iter_batches(columns=["layer"]):
                    layers.update(pc.unique(batch.column(0)).to_pylist())
        return cls(Path(path), n_rows, len(layers))

    def load(self) -> pd.DataFrame:
        """The table, as :func:`pandas.read_parquet` reads it."""
        return pd.read_parquet(self.path)

    def column_names(self) -> list[str]:
        """The table's columns, from the file's schema."""
        import pyarrow.parquet as pq

        return list(pq.read_schema(self.path).names)


def part_windows(path: Path) -> tuple[int, int]:
    """First and last window of a part, from its name ``part-FIRST-LAST.parquet``."""
    match = _PART_RE.fullmatch(path.name)
    if match is None:
        raise ValueError(f"{path} is not named part-FIRST-LAST.parquet")
    return int(match.group(1)), int(match.group(2))


def merge_parts(
    parts: Sequence[Path], path: Path, key: Sequence[str], rank_order: Sequence[str], empty: pd.DataFrame | None = None
) -> RowsOnDisk:
    """Write the rows of ``parts`` to ``path`` sorted by ``key`` (``rank_by`` in ``rank_order``).

    The windows are taken in ranges as wide as the widest part (``last - first + 1``); for each
    range, the rows of that range are read from every part that reaches into it and sorted, so at
    most one range's rows are in memory. ``key`` must start with the window column (``seq``).
    ``empty`` is written when there are no parts.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    spans = sorted((part_windows(p), p) for p in parts)
    if not spans:
        frame = empty if empty is not None else pd.DataFrame()
        write_atomic(path, lambda p: frame.to_parquet(p, index=False))
        return RowsOnDisk(path, 0, 0)
    order = pa.array(list(rank_order))
    n_rows, layers = 0, set()
    width = max(end - first + 1 for (first, end), _ in spans)
    start, stop = spans[0][0][0], max(end for (_, end), _ in spans)

    def ranges() -> Iterator[pa.Table]:
        """The rows of windows ``[a, a + width)``, for every ``a`` from the first window to the last."""
        window, following, reaching = key[0], 0, []
        for a in range(start, stop + 1, width):
            b = a + width
            while following < len(spans) and spans[following][0][0] < b:
                reaching.append(spans[following])
                following += 1
            reaching = [(windows, p) for windows, p in reaching if windows[1] >= a]
            if reaching:
                filters = [(window, ">=", a), (window, "<", b)]
                yield pa.concat_tables([pq.read_table(p, filters=filters) for _, p in reaching])

    def write(target: Path) -> None:
        nonlocal n_rows
        writer = None
        try:
            for table in ranges():
                sort_keys = []
                for column in key:
                    if column == "rank_by":
                        table = table.append_column("__rank", pc.index_in(table["rank_by"], value_set=order))
                        column = "__rank"
                    sort_keys.append((column, "ascending"))
                table = table.sort_by(sort_keys)
                if "__rank" in table.column_names:
                    table = table.drop_columns(["__rank"])
                if writer is None:
                    writer = pq.ParquetWriter(target, table.schema)
                writer.write_table(table.cast(writer.schema))
                n_rows += table.num_rows
                if "layer" in table.column_names:
                    layers.update(pc.unique(table["layer"]).to_pylist())
        finally:
            if writer is not None:
                writer.close()

    write_atomic(path, write)
    return RowsOnDisk(path, n_rows, len(layers))


__all__ = ["RowsOnDisk", "merge_parts", "part_windows"]
