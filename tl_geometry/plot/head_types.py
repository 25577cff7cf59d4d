"""Regimes against circuit head types: how many heads of each regime are induction, previous-token... heads."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tl_geometry.errors import InputError
from tl_geometry.taxonomy.head_types import head_type_crosstab


def regimes_vs_head_types(table: pd.DataFrame, mode: str = "strict") -> go.Figure:
    """Heads per regime (rows) and circuit head type (columns), the heads named on hover.

    Parameters
    ----------
    table : DataFrame
        :func:`tl_geometry.head_types` joined to the regimes (``head_types(model, regimes=result)``).
    mode : {"strict", "nearest"}, default "strict"
        Which regime label to count.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"layer": [0, 1], "head": [2, 3], "regime_strict": ["Reset", "Mixer"],
    ...                   "head_type": ["induction", "none"]})
    >>> fig = regimes_vs_head_types(t)
    >>> int(fig.data[0].z[1][2])   # Reset x induction
    1
    """
    if mode not in ("strict", "nearest"):
        raise InputError(f"mode must be 'strict' or 'nearest', got {mode!r}")
    counts = head_type_crosstab(table, mode)
    names: list[list[list[str]]] = [[[] for _ in counts.columns] for _ in counts.index]
    rows, cols = list(counts.index), list(counts.columns)
    for layer, head, regime, kind in zip(
        table["layer"], table["head"], table[f"regime_{mode}"].astype(str), table["head_type"].astype(str)
    ):
        names[rows.index(regime)][cols.index(kind)].append(f"L{layer}H{head}")
    hover = [[", ".join(cell[:24]) + (" ..." if len(cell) > 24 else "") for cell in row] for row in names]
    z = counts.to_numpy()
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[c.replace("_", "-") for c in cols],
            y=rows,
            text=z.astype(str),
            texttemplate="%{text}",
            customdata=np.array(hover, dtype=object),
            hovertemplate="%{y} x %{x}: %{z} heads<br>%{customdata}<extra></extra>",
            colorscale="Blues",
            showscale=False,
        )
    )
    threshold = table.attrs.get("threshold")
    suffix = f", type score >= {threshold:g}" if threshold is not None else ""
    fig.update_layout(
        title=f"Regimes ({mode}) against circuit head types{suffix}",
        xaxis_title="head type (TransformerLens head_detector, repeated random tokens)",
        yaxis_title=f"regime ({mode})",
        yaxis_autorange="reversed",
        template="plotly_white",
    )
    return fig
