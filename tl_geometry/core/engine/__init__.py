"""The separability engine: every count and radius of definitions §2 and §7, exact and fast.

* :mod:`~tl_geometry.core.engine.dispatch` — the one place that decides: the route (compiled CPU
  screen or batched tensor route) from the device and the kernel, and which rows of a layer go
  to the block pipeline together;
* :mod:`~tl_geometry.core.engine.layer` — the one door for a layer of a forward pass (the observers');
* :mod:`~tl_geometry.core.engine.rows` — the per-row pipeline (one query position per row);
* :mod:`~tl_geometry.core.engine.query_engine` — the block pipeline (every query position of a window);
* :mod:`~tl_geometry.core.engine.screening` — the float32 screen with its exact float64 re-check;
* :mod:`~tl_geometry.core.engine.fused_rows`, :mod:`~tl_geometry.core.engine.fused` — their compiled passes;
* :mod:`~tl_geometry.core.engine.batched` — the device route: a layer in a fixed number of tensor operations.

The derivations and the table of which route runs where: docs/engine.md.
"""
