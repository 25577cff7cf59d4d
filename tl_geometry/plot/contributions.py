"""Figure 10 of the paper: the contributions ``||alpha_i v_i||`` of one head, coloured by alignment with ``v_L``."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go
import torch

from tl_geometry.capture.hooks import LayerBatch, run_streaming
from tl_geometry.core.layouts import resolve_query_positions
from tl_geometry.errors import InputError
from tl_geometry.models import describe_model
from tl_geometry.plot.base import base_layout

#: Diverging scale for cosines in [-1, 1].
COSINE_COLORSCALE = "RdBu"


def _as_float64(x: Any, name: str) -> np.ndarray:
    arr = x.detach().cpu().to(torch.float64).numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)
    if not np.isfinite(arr).all():
        raise InputError(f"contributions_scatter(): {name} contain NaN or inf")
    return arr


def contribution_points(
    weights: Any, values: Any, query_positions: Sequence[int] | None = None
) -> dict[str, np.ndarray]:
    """The points of :func:`contributions_scatter` as flat arrays (``query_pos``, ``position``,
    ``alpha``, ``contribution = ||alpha_i v_i||``, ``cos_vL = cos(v_i, v_L)``, ``kind``).

    See :func:`contributions_scatter` for the arguments. A zero vector has cosine 0.
    """
    w = _as_float64(weights, "weights")
    v = _as_float64(values, "values")
    if w.ndim == 1:
        w = w[None]
    if w.ndim != 2:
        raise InputError(f"contributions_scatter(): weights must be [K] or [rows, K], got shape {w.shape}")
    rows, k = w.shape
    if v.ndim == 2:
        v = np.broadcast_to(v, (rows, *v.shape))
    if v.ndim != 3 or v.shape[:2] != (rows, k):
        raise InputError(
            f"contributions_scatter(): values must be [K, d] or [rows, K, d] matching weights {w.shape}, got {v.shape}"
        )
    if (w < 0).any():
        raise InputError("contributions_scatter(): attention weights must be non-negative")
    qs = [k - 1] * rows if query_positions is None else [int(q) for q in query_positions]
    if len(qs) != rows or any(not 0 <= q < k for q in qs):
        raise InputError(
            f"contributions_scatter(): query_positions must give one position in 0..{k - 1} per row, got {qs}"
        )
    norms = np.linalg.norm(v, axis=-1)  # [rows, K]
    out: dict[str, list] = {key: [] for key in ("query_pos", "position", "alpha", "contribution", "cos_vL", "kind")}
    for r, q in enumerate(qs):
        keys = np.arange(q + 1)
        last = v[r, q]
        dots = v[r, : q + 1] @ last
        denom = norms[r, : q + 1] * norms[r, q]
        cos = np.where(denom > 0, dots / np.where(denom > 0, denom, 1.0), 0.0)
        out["query_pos"].append(np.full(q + 1, q))
        out["position"].append(keys)
        out["alpha"].append(w[r, : q + 1])
        out["contribution"].append(w[r, : q + 1] * norms[r, : q + 1])
        out["cos_vL"].append(np.clip(cos, -1.0, 1.0))
        out["kind"].append(np.where(keys == 0, "sink", np.where(keys == q, "last", "other")))
    return {key: np.concatenate(parts) for key, parts in out.items()}


def contributions_scatter(
    weights: Any,
    values: Any,
    *,
    query_positions: Sequence[int] | None = None,
    title: str | None = None,
    log_y: bool = True,
) -> go.Figure:
    """Scatter of the contributions ``||alpha_i v_i||`` of one head by key position, coloured by
    ``cos(v_i, v_L)`` (Fig. 10).

    Parameters
    ----------
    weights : Tensor or array, [K] or [rows, K]
        Attention rows of one head (e.g. several query positions, "context sizes", of one
        sequence). Row ``r`` uses keys ``0..q_r``; weights after ``q_r`` are ignored.
    values : Tensor or array, [K, d] or [rows, K, d]
        The value vectors that head reads (its key/value head's), shared by every row when 2-D.
    query_positions : list of int, optional
        ``q_r`` for each row (default ``K - 1`` for every row): key ``q_r`` is that row's last
        token ``L``.
    title : str, optional
        Added to the figure title (e.g. ``"Retriever: layer 3, head 2"``).
    log_y : bool, default True
        Logarithmic contribution axis (contributions span orders of magnitude).

    Returns
    -------
    plotly.graph_objects.Figure
        Three marker traces sharing one colour axis (``cos(v_i, v_L)`` from −1 to 1): ``"other
        keys"`` (circles), ``"sink (i = 0)"`` (diamonds) and ``"last token (i = L)"`` (stars);
        ``x`` the key position, ``y`` ``||alpha_i v_i||``; the query position is on hover.

    Notes
    -----
    The paper colours by "``cos(v_i, v_j)``" without naming ``j``; here ``j = L``, the last token
    of the row, the direction the taxonomy is built on. How to read it: in a *Retriever* the star
    (the last token) stands above every other point; in a *Mixer* it lies between the sink and the
    content tokens; in a *Reset* the mass is spread, often with a dominant sink and no dominant
    last token. Blue points lie along ``v_L``, red ones against it.
    """
    pts = contribution_points(weights, values, query_positions)
    fig = go.Figure()
    styles = (
        ("other", "other keys", "circle", 6),
        ("sink", "sink (i = 0)", "diamond", 11),
        ("last", "last token (i = L)", "star", 14),
    )
    for kind, name, symbol, size in styles:
        m = pts["kind"] == kind
        fig.add_trace(
            go.Scatter(
                x=pts["position"][m],
                y=pts["contribution"][m],
                mode="markers",
                name=name,
                marker=dict(
                    color=pts["cos_vL"][m],
                    coloraxis="coloraxis",
                    symbol=symbol,
                    size=size,
                    line=dict(width=0.5, color="black"),
                ),
                customdata=np.stack([pts["query_pos"][m], pts["alpha"][m]], axis=-1),
                hovertemplate="i = %{x}, query %{customdata[0]}<br>||α_i v_i|| = %{y:.3g}<br>α_i = %{customdata[1]:.3g}"
                "<br>cos(v_i, v_L) = %{marker.color:.2f}<extra></extra>",
            )
        )
    fig.update_layout(
        coloraxis=dict(colorscale=COSINE_COLORSCALE, cmin=-1, cmax=1, colorbar=dict(title=dict(text="cos(v_i, v_L)")))
    )
    n_rows = len(np.unique(pts["query_pos"]))
    full = "Contributions ||α_i v_i|| by position (Fig. 10)" + (f": {title}" if title else "")
    full += f", {n_rows} query position{'s' if n_rows > 1 else ''}"
    return base_layout(fig, full, "key position i", "||α_i v_i|| (value-space units)", log_y=log_y)


class _Collect:
    def __init__(self) -> None:
        self.batch: LayerBatch | None = None

    def observe(self, batch: LayerBatch) -> None:
        self.batch = batch


def contributions_from_model(
    model: Any,
    tokens: torch.Tensor,
    layer: int,
    head: int,
    *,
    seq: int = 0,
    query_positions: Any = "last",
    title: str | None = None,
    log_y: bool = True,
) -> go.Figure:
    """:func:`contributions_scatter` of one head of a model on one token window (Fig. 10).

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer
        The model (see :func:`tl_geometry.load_model`).
    tokens : int Tensor [n_seqs, L] or [L]
        Token windows, e.g. ``result.tokens`` of an :class:`~tl_geometry.AnalysisResult`.
    layer, head : int
        The query head; its values are those of its key/value head (definitions §1).
    seq : int, default 0
        Which window of ``tokens``.
    query_positions : "last", int, list of int or range, default "last"
        The query rows to plot, as for :func:`tl_geometry.analyze` (a range gives several
        "context sizes").
    title, log_y
        As for :func:`contributions_scatter`; the title defaults to ``"layer {layer}, head {head}"``.

    Returns
    -------
    plotly.graph_objects.Figure
        See :func:`contributions_scatter`. Runs one forward pass, stopped after ``layer``.
    """
    info = describe_model(model)
    tokens = torch.as_tensor(tokens)
    if tokens.ndim == 1:
        tokens = tokens[None]
    if not 0 <= layer < info.n_layers or not 0 <= head < info.n_heads:
        raise InputError(
            f"contributions_from_model(): (layer {layer}, head {head}) does not exist: the model has layers "
            f"0..{info.n_layers - 1} and heads 0..{info.n_heads - 1}"
        )
    if not 0 <= seq < tokens.shape[0]:
        raise InputError(f"contributions_from_model(): seq={seq} is outside the {tokens.shape[0]} windows given")
    qs = resolve_query_positions(query_positions, tokens.shape[1])
    collect = _Collect()
    run_streaming(model, info, tokens[seq : seq + 1], torch.tensor([seq]), [layer], qs, [collect])
    batch = collect.batch
    assert batch is not None  # run_streaming raises if the layer did not fire
    g = int(info.kv_head_of()[head])
    weights = batch.weights[0, head]  # [len(qs), L]
    values = batch.values[0, :, g]  # [L, d]
    return contributions_scatter(
        weights, values, query_positions=qs, title=title or f"layer {layer}, head {head}", log_y=log_y
    )
