"""Figure 4 of the paper: attention mass by key position, with the fitted piecewise profile."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tl_geometry.errors import InputError
from tl_geometry.plot.base import DIAGNOSTICS, as_array, base_layout, get_table

if TYPE_CHECKING:
    from tl_geometry.pipeline.result import AnalysisResult


def attention_mass(result: AnalysisResult | pd.DataFrame, layer_head: tuple[int, int] | None = None) -> go.Figure:
    """Mean attention weight ``alpha_i`` of the last analysed query by key position, log y (Fig. 4).

    Parameters
    ----------
    result : AnalysisResult or DataFrame
        A result of ``tlg.analyze(..., diagnostics=True)`` or its ``attention_profile_curve``
        table (per ``(layer, head, position)``: ``alpha``, the mean over sequences of the weight
        of the largest analysed query on key ``i``, and ``fitted``, the fitted Assumption 3 law).
    layer_head : (layer, head), optional
        One head: its mean profile and its own fit, with dotted vertical lines at the fitted
        phase boundaries ``T1`` and ``T2`` (read from ``result.attention_profile`` when the
        result holds it). Default: the mean over every analysed (layer, head).

    Returns
    -------
    plotly.graph_objects.Figure
        Traces: ``"mean α_i"`` (markers) and, when the fit is present (finite ``fitted``),
        ``"fitted profile"`` — for one head its piecewise law; over all heads the mean of the
        per-head fits (itself not a single piecewise law).

    Notes
    -----
    How to read it: Assumption 3's four phases are a sink at ``i = 0`` well above the rest, a flat
    plateau, an oscillating middle and an exponential rise of the last keys (recency). The log y
    axis shows the orders of magnitude between the sink and the plateau (``~1e-5`` on LLaMA-2 at
    1024 tokens). Per-head parameters (``p_sink, p_base, eta_osc, omega, eta_exp, T1, T2,
    fit_error``) are in ``result.attention_profile``.
    """
    curve = get_table(
        result,
        "attention_profile_curve",
        DIAGNOSTICS,
        "attention_mass",
        ["layer", "head", "position", "alpha", "fitted"],
    )
    bounds: tuple[float, float] | None = None
    if layer_head is not None:
        layer, head = (int(v) for v in layer_head)
        curve = curve[(curve["layer"] == layer) & (curve["head"] == head)]
        if curve.empty:
            raise InputError(
                f"attention_mass(): (layer {layer}, head {head}) is not in the attention_profile_curve table"
            )
        profile = getattr(result, "attention_profile", None)
        if profile is not None and {"T1", "T2"} <= set(profile.columns):
            row = profile[(profile["layer"] == layer) & (profile["head"] == head)]
            if len(row):
                bounds = (float(row["T1"].iloc[0]), float(row["T2"].iloc[0]))
        what = f"layer {layer}, head {head}"
    else:
        what = f"mean over {len(curve.groupby(['layer', 'head']))} (layer, head) pairs"
    by_pos = curve.groupby("position")[["alpha", "fitted"]].mean()
    x = by_pos.index.to_numpy()
    fig = go.Figure(
        go.Scatter(
            x=x, y=as_array(by_pos["alpha"]), mode="markers", name="mean α_i", marker=dict(size=4, color="#1f77b4")
        )
    )
    fitted = as_array(by_pos["fitted"])
    if np.isfinite(fitted).any():
        fig.add_trace(go.Scatter(x=x, y=fitted, mode="lines", name="fitted profile", line=dict(color="#d62728")))
    if bounds is not None:
        for name, t in zip(("T1", "T2"), bounds):
            if np.isfinite(t):
                fig.add_vline(x=t, line_dash="dot", line_color="grey", annotation_text=name)
    q = curve["query_pos"].unique() if "query_pos" in curve.columns else []
    at = f" at query {int(q[0])}" if len(q) == 1 else ""
    title = f"Attention mass by position (Fig. 4): {what}{at}"
    return base_layout(
        fig, title, "key position i", "attention weight α_i (mean over sequences, log scale)", log_y=True
    )
