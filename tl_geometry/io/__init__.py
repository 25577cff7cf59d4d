"""What a run writes and reads back: the resumable run store, rows on disk, atomic writes, the lock.

* :mod:`~tl_geometry.io.store` — :class:`RunStore` (per-batch parts, states, the run's identity);
* :mod:`~tl_geometry.io.rows_on_disk` — row tables merged and read from parquet parts;
* :mod:`~tl_geometry.io.row_sums` — sums per group streamed from parquet: every mean over rows;
* :mod:`~tl_geometry.io.files` — writes that leave either the old file or the new one;
* :mod:`~tl_geometry.io.checksums` — the SHA-256 of each file a run writes, checked when read;
* :mod:`~tl_geometry.io.lock` — one process per run directory;
* :mod:`~tl_geometry.io.environment` — the package versions a run records.

The names load their modules on first use: the command line's lock and atomic writes import
neither pandas nor torch.
"""

from typing import TYPE_CHECKING

from tl_geometry.lazy import lazy_names

if TYPE_CHECKING:
    from tl_geometry.io.files import write_atomic, write_json_atomic
    from tl_geometry.io.rows_on_disk import RowsOnDisk
    from tl_geometry.io.store import RunStore, StoreError

#: The module that holds each name of ``__all__`` (imported on first use).
HOMES = {
    "RowsOnDisk": "tl_geometry.io.rows_on_disk",
    "RunStore": "tl_geometry.io.store",
    "StoreError": "tl_geometry.io.store",
    "write_atomic": "tl_geometry.io.files",
    "write_json_atomic": "tl_geometry.io.files",
}


__getattr__ = lazy_names(globals(), HOMES)


__all__ = ["RowsOnDisk", "RunStore", "StoreError", "write_atomic", "write_json_atomic"]
