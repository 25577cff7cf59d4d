"""What a run writes and reads back: the resumable run store, rows on disk, atomic writes.

* :mod:`~tl_geometry.io.store` — :class:`RunStore` (per-batch parts, states, the run's identity);
* :mod:`~tl_geometry.io.rows_on_disk` — row tables merged and read from parquet parts;
* :mod:`~tl_geometry.io.files` — writes that leave either the old file or the new one;
* :mod:`~tl_geometry.io.environment` — the package versions a run records.
"""

from tl_geometry.io.files import write_atomic, write_json_atomic
from tl_geometry.io.rows_on_disk import RowsOnDisk
from tl_geometry.io.store import RunStore, StoreError

__all__ = ["RowsOnDisk", "RunStore", "StoreError", "write_atomic", "write_json_atomic"]
