"""A layer x head heatmap of any per-head quantity, with the regime on hover."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tl_geometry.capture.tables import attention_rows
from tl_geometry.errors import InputError
from tl_geometry.plot.base import as_array, base_layout
from tl_geometry.plot.regime_curves import check_heads


def _kv_map(heads: pd.DataFrame | None, model: Any) -> pd.DataFrame:
    """(layer, head, kv_head) rows to spread a per-key/value-head table over the query heads."""
    if heads is not None and "kv_head" in heads.columns:
        return heads[["layer", "head", "kv_head"]]
    info = getattr(model, "model", model)  # an AnalysisResult holds its ModelInfo as .model
    if info is None or not hasattr(info, "kv_head_of"):
        raise InputError(
            "head_heatmap(): the table is per (layer, kv_head); pass model=result.model (or a heads table with "
            "kv_head) to map key/value heads to query heads"
        )
    kv = info.kv_head_of().numpy()
    return pd.DataFrame(
        {
            "layer": np.repeat(np.arange(info.n_layers), info.n_heads),
            "head": np.tile(np.arange(info.n_heads), info.n_layers),
            "kv_head": np.tile(kv, info.n_layers),
        }
    )


def head_values(
    table: pd.DataFrame, column: str, *, n: int | None = None, heads: pd.DataFrame | None = None, model: Any = None
) -> pd.DataFrame:
    """The per-(layer, head) values :func:`head_heatmap` draws: a ``layers x heads`` DataFrame.

    See :func:`head_heatmap` for the arguments and how rows are aggregated.
    """
    if not isinstance(table, pd.DataFrame):
        raise InputError(f"head_heatmap() needs a DataFrame, got {type(table).__name__}")
    if column not in table.columns:
        raise InputError(f"head_heatmap(): the table has no column {column!r} (it has {list(table.columns)})")
    if "layer" not in table.columns:
        raise InputError("head_heatmap(): the table has no `layer` column")
    table = attention_rows(table)  # a separability table: its attention rows (definitions §2)
    if "n" in table.columns:
        held = sorted(table["n"].unique().tolist())
        if n is None and len(held) > 1:
            raise InputError(f"head_heatmap(): the table holds several N ({held[:8]}...); pass n= one of them")
        if n is not None:
            table = table[table["n"] == n]
            if table.empty:
                raise InputError(f"head_heatmap(): n={n} is not in the table (it holds {held[:8]}...)")
    elif n is not None:
        raise InputError("head_heatmap(): n= was given but the table has no `n` column")
    if "head" not in table.columns:
        if "kv_head" not in table.columns:
            raise InputError("head_heatmap(): the table has neither a `head` nor a `kv_head` column")
        per_kv = table.groupby(["layer", "kv_head"])[column].mean().reset_index()
        table = _kv_map(heads, model).merge(per_kv, on=["layer", "kv_head"], how="inner")
    values = table.groupby(["layer", "head"])[column].mean()
    return values.unstack("head").sort_index().sort_index(axis=1)


def head_heatmap(
    table: pd.DataFrame,
    column: str,
    heads: pd.DataFrame | None = None,
    *,
    n: int | None = None,
    model: Any = None,
    title: str | None = None,
) -> go.Figure:
    """Layer x head heatmap of one column of any per-head table; the regime on hover when known.

    Parameters
    ----------
    table : DataFrame
        Any table with ``layer`` and ``head`` columns (``result.separability``,
        ``result.attention_profile``, a :func:`~tl_geometry.taxonomy.classify_heads` table...), or
        with ``layer`` and ``kv_head`` (``result.value_norms``, ``result.similarity``): those values
        are shown on every query head that reads the key/value head (needs ``heads`` with a
        ``kv_head`` column, or ``model``).
    column : str
        The column to draw (e.g. ``"recall"``, ``"sink_ratio"``, ``"rho_0"``, ``"margin"``).
    heads : DataFrame, optional
        :func:`tl_geometry.taxonomy.classify_heads` output: each cell's regime is shown on hover.
    n : int, optional
        For a table with an ``n`` column (separability): the selection size to show. Required
        when the table holds several ``N``.
    model : ModelInfo or AnalysisResult, optional
        The query head -> key/value head mapping, for per-key/value-head tables.
    title : str, optional
        Figure title (default names the column, and ``N``).

    Returns
    -------
    plotly.graph_objects.Figure
        One ``go.Heatmap``: ``y`` the layers (layer 0 at the top), ``x`` the heads, ``z`` the mean
        of ``column`` over the table's rows of that (layer, head) — for the separability table,
        over sequences and query positions. ``customdata`` holds the regimes when ``heads`` is
        given. A column with values of both signs gets a diverging scale centred on 0.

    Notes
    -----
    How to read it: look for structure across depth (rows) and within a layer (columns), e.g.
    compressed sinks (``sink_ratio << 1``) by layer, or heads whose recall at small ``N`` stands
    out, then hover to see their regime. Empty cells are heads the table does not cover.
    """
    if heads is not None:
        check_heads(heads, "head_heatmap")
    grid = head_values(table, column, n=n, heads=heads, model=model)
    z = as_array(grid.to_numpy())
    finite = z[np.isfinite(z)]
    diverging = finite.size > 0 and finite.min() < 0 < finite.max()
    custom = None
    hover = "layer %{y}, head %{x}<br>" + column + " = %{z:.4g}"
    if heads is not None:
        regime = heads.assign(regime=heads["regime"].astype(str)).set_index(["layer", "head"])["regime"]
        custom = np.array(
            [[regime.get((layer, head), "—") for head in grid.columns] for layer in grid.index], dtype=object
        )
        hover += "<br>regime: %{customdata}"
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=grid.columns.to_numpy(),
            y=grid.index.to_numpy(),
            customdata=custom,
            name=column,
            colorscale="RdBu_r" if diverging else "Viridis",
            zmid=0 if diverging else None,
            colorbar=dict(title=dict(text=column)),
            hovertemplate=hover + "<extra></extra>",
        )
    )
    default = f"{column} by layer and head" + (f" at N = {n}" if n is not None else "")
    fig = base_layout(fig, title or default, "head", "layer")
    fig.update_yaxes(autorange="reversed", dtick=1)
    fig.update_xaxes(dtick=1)
    return fig
