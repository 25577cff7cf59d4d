"""Figure 6 of the paper: does the sink similarity ``rho_0`` predict recall across heads?"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go

from tl_geometry.errors import InputError
from tl_geometry.plot.base import DIAGNOSTICS, N_AXIS, as_array, base_layout, get_table, separability_sums
from tl_geometry.plot.colors import PEARSON_COLOR, SPEARMAN_COLOR
from tl_geometry.taxonomy import rho0_table, sink_effect

if TYPE_CHECKING:
    from tl_geometry.pipeline.result import AnalysisResult


_EFFECT_COLUMNS = {"n", "pearson", "spearman"}


def sink_correlation(
    result_or_table: AnalysisResult | pd.DataFrame, *, rho0: pd.DataFrame | None = None, query_pos: int | None = None
) -> go.Figure:
    """Pearson and Spearman correlation of mean ``recall(N)`` with ``rho_0`` across heads, per ``N`` (Fig. 6).

    Parameters
    ----------
    result_or_table : AnalysisResult or DataFrame
        Either a :func:`tl_geometry.taxonomy.sink_effect` table (``n, pearson, spearman``), drawn
        as it is, or a result whose ``separability`` table is correlated with ``rho_0`` here.
    rho0 : DataFrame, optional
        ``rho_0`` per ``(layer, head)`` or per ``(layer, kv_head)``. Default, as
        :meth:`AnalysisResult.sink_effect`: the result's ``regime_features``
        (``tlg.analyze(..., taxonomy=True)``, ``rho_0`` over the keys of each analysed query row),
        else its ``similarity`` table (``diagnostics=True``, ``rho_0`` per key/value head over the
        whole window; the same numbers for the default last query).
    query_pos : int, optional
        The query position, when the separability table holds several.

    Returns
    -------
    plotly.graph_objects.Figure
        Traces ``"Pearson r"`` and ``"Spearman ρ"``: ``y`` are the ``pearson`` / ``spearman``
        columns of the sink-effect table at each ``N`` (NaN where recall is constant across heads,
        e.g. ``N = 1`` and ``N = K``, so the lines have gaps there). A zero line is drawn.

    Notes
    -----
    How to read it: per ``N``, each (layer, head) contributes one point (its recall averaged over
    sequences, its ``rho_0``); a positive correlation means heads whose sink points along the
    other values separate better. The paper finds it strongest at small ``N`` (about 0.6 near
    ``N = 3`` for Gemma and Mistral). With few heads the correlations are noisy: ``n_heads`` of
    the table says how many entered each point (shown on hover).
    """
    obj = result_or_table
    if isinstance(obj, pd.DataFrame) and _EFFECT_COLUMNS <= set(obj.columns):
        table = obj
    else:
        sep = separability_sums(obj, "run tlg.analyze(...)", "sink_correlation", ["layer", "head", "n", "recall"])
        if rho0 is None:  # the same order as AnalysisResult.sink_effect
            if isinstance(getattr(obj, "regime_features", None), pd.DataFrame):
                rho0 = rho0_table(obj.regime_features)
            elif isinstance(getattr(obj, "similarity", None), pd.DataFrame):
                rho0 = get_table(obj, "similarity", DIAGNOSTICS, "sink_correlation", ["layer", "kv_head", "rho_0"])
            else:
                raise InputError(
                    "sink_correlation() needs rho_0 per head: pass rho0=, or a result that holds the `regime_features` "
                    f"table (run tlg.analyze(..., taxonomy=True)) or the `similarity` table ({DIAGNOSTICS})"
                )
        table = sink_effect(sep, rho0, query_pos=query_pos)
    if table.empty:
        raise InputError("sink_correlation(): the sink-effect table has no rows")
    x = table["n"].to_numpy()
    custom = table["n_heads"].to_numpy() if "n_heads" in table.columns else None
    hover = "N = %{x}<br>%{y:.3f}" + ("<br>heads: %{customdata}" if custom is not None else "")
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=x,
            y=as_array(table["pearson"]),
            mode="lines+markers",
            name="Pearson r",
            line=dict(color=PEARSON_COLOR),
            customdata=custom,
            hovertemplate=hover,
        )
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=as_array(table["spearman"]),
            mode="lines+markers",
            name="Spearman ρ",
            line=dict(color=SPEARMAN_COLOR, dash="dash"),
            customdata=custom,
            hovertemplate=hover,
        )
    )
    fig.add_hline(y=0, line_color="grey", line_width=1)
    heads = f" across {int(table['n_heads'].max())} heads" if "n_heads" in table.columns else ""
    title = f"Sink effect (Fig. 6): correlation of mean recall(N) with ρ_0{heads}"
    fig = base_layout(fig, title, N_AXIS, "corr(mean recall R(r_min, N), ρ_0) (−1 to 1)", log_x=True)
    fig.update_yaxes(range=[-1.05, 1.05])
    return fig
