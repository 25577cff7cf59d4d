"""Figure 7 of the paper: the geometry of one example head per regime, over the selection size N."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tl_geometry.capture.tables import check_heads
from tl_geometry.errors import InputError
from tl_geometry.plot.base import N_AXIS, TAXONOMY, as_array, full_log_ticks, get_table, one_query
from tl_geometry.plot.colors import REGIME_COLORS, REGIME_ORDER

if TYPE_CHECKING:
    from tl_geometry.pipeline.result import AnalysisResult


#: (column of the features table, legend name, dash, row) of the five curves.
CURVES = (
    ("norm_s", "||s(N)||", "solid", 1),
    ("norm_s_minus_sink", "||s(N) − α_0 v_0|| (sink left out)", "dashdot", 1),
    ("norm_s_minus_last", "||s(N) − α_L v_L|| (last token left out)", "dash", 1),
    ("cos_s_v0", "cos(s(N), v_0)", "solid", 2),
    ("cos_s_vL", "cos(s(N), v_L)", "dash", 2),
)
FEATURE_COLUMNS = ["layer", "head", "n", *(c for c, *_ in CURVES)]


def example_heads(heads: pd.DataFrame, regimes: Sequence[str] = REGIME_ORDER[:3]) -> list[tuple[int, int]]:
    """For each regime that has heads, the head with the largest ``margin`` (the clearest example)."""
    out = []
    for regime in regimes:
        part = heads[heads["regime"].astype(str) == regime]
        if len(part):
            best = (
                part.sort_values(["margin", "layer", "head"], ascending=[False, True, True]).iloc[0]
                if "margin" in part.columns
                else part.iloc[0]
            )
            out.append((int(best["layer"]), int(best["head"])))
    return out


def regime_diagnostics(
    result: AnalysisResult | pd.DataFrame,
    heads: pd.DataFrame | None,
    layer_heads: Mapping[str, tuple[int, int]] | Sequence[tuple[int, int]] | None = None,
    *,
    query_pos: int | None = None,
) -> go.Figure:
    """Norms and alignments of ``s(N)`` for one example head per regime (Fig. 7).

    Parameters
    ----------
    result : AnalysisResult or DataFrame
        A result holding the per-(layer, head, query_pos, n) regime features table as
        ``regime_features`` (``tlg.analyze(..., taxonomy=True)``), or that table itself
        (:meth:`tl_geometry.taxonomy.TaxonomyObserver.features`, sequence means).
    heads : DataFrame or None
        :func:`tl_geometry.taxonomy.classify_heads` of the same features: gives each column's
        regime (its title and colour) and, without ``layer_heads``, the examples. May be None
        only with ``layer_heads`` (columns are then titled by head only, in grey).
    layer_heads : mapping regime -> (layer, head), or list of (layer, head), optional
        The heads to show, one column each, in the order given. Default: for Retriever, Mixer
        and Reset in that order (the paper's), the head of that regime with the largest
        ``margin``; regimes without heads are left out.
    query_pos : int, optional
        The query position, when the features table holds several.

    Returns
    -------
    plotly.graph_objects.Figure
        Two rows, one column per head. Top: ``||s(N)||`` (solid), ``||s(N) − α_0 v_0||``
        (dash-dot) and ``||s(N) − α_L v_L||`` (dashed); bottom: ``cos(s(N), v_0)`` (solid) and
        ``cos(s(N), v_L)`` (dashed); log ``N`` axes. Each column is drawn in its regime's colour
        (:data:`REGIME_COLORS`): five data traces per column named ``"<curve> — L{layer} H{head}"``
        (legend hidden), followed by five black legend-only keys for the line styles.

    Notes
    -----
    How to read it (paper §4.2): a *Retriever* keeps ``cos(s, v_L)`` high at every ``N`` and
    ``||s||`` drops sharply when the last token is left out; a *Mixer* starts aligned with
    ``v_0`` and turns towards ``v_L`` as ``N`` grows, the two leave-one-out norms converging; a
    *Reset* stays sink-aligned with low ``cos(s, v_L)`` and loses more norm without the sink than
    without the last token. The leave-one-out norms are sequence means over the sequences where
    the left-out key is selected (gaps where it never is).
    """
    features = get_table(result, "regime_features", TAXONOMY, "regime_diagnostics", FEATURE_COLUMNS)
    features = one_query(features, query_pos, "regime_diagnostics")
    if heads is not None:
        heads = check_heads(heads, "regime_diagnostics")
    if layer_heads is None:
        if heads is None:
            raise InputError("regime_diagnostics() needs `heads` (classify_heads) or `layer_heads`")
        chosen = example_heads(heads)
        if not chosen:
            raise InputError(
                "regime_diagnostics(): no head is labelled Retriever, Mixer or Reset; pass layer_heads=[(layer, head), ...]"
            )
    else:
        items = layer_heads.values() if isinstance(layer_heads, Mapping) else layer_heads
        chosen = [(int(a), int(b)) for a, b in items]
        if not chosen:
            raise InputError("regime_diagnostics(): layer_heads is empty")
    regime_of = (
        {}
        if heads is None
        else {(int(a), int(b)): str(r) for a, b, r in zip(heads["layer"], heads["head"], heads["regime"])}
    )
    titles = [f"{regime_of.get(lh, '?')}: layer {lh[0]}, head {lh[1]}" for lh in chosen]
    fig = make_subplots(rows=2, cols=len(chosen), shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.1)
    for col, (layer, head) in enumerate(chosen, start=1):
        part = features[(features["layer"] == layer) & (features["head"] == head)].sort_values("n")
        if part.empty:
            raise InputError(f"regime_diagnostics(): (layer {layer}, head {head}) is not in the features table")
        color = REGIME_COLORS.get(regime_of.get((layer, head), "Unclassified"), REGIME_COLORS["Unclassified"])
        for column, name, dash, row in CURVES:
            fig.add_trace(
                go.Scatter(
                    x=part["n"].to_numpy(),
                    y=as_array(part[column]),
                    mode="lines",
                    name=f"{name} — L{layer} H{head}",
                    line=dict(color=color, dash=dash),
                    showlegend=False,
                ),
                row=row,
                col=col,
            )
    for _column, name, dash, row in CURVES:  # legend keys for the line styles
        fig.add_trace(
            go.Scatter(x=[None], y=[None], mode="lines", name=name, line=dict(color="black", dash=dash)), row=row, col=1
        )
    fig.update_xaxes(type="log")
    fig.update_xaxes(title_text=N_AXIS, row=2)
    fig.update_yaxes(title_text="norm (value-space units)", row=1, col=1)
    fig.update_yaxes(title_text="cosine (−1 to 1)", row=2, col=1)
    fig.update_layout(title=dict(text="Geometry of s(N) by head regime (Fig. 7)"), template="plotly_white")
    return full_log_ticks(fig)
