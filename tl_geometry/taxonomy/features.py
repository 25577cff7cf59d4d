"""Regime features of one attention row (definitions §5; paper §4.2, Figures 7 and 10).

With contributions ``y_i = alpha_i v_i`` over keys ``0..L`` and ``s(N) = sum_{i in I_N} y_i``:
``c_sink = ||y_0||``, ``c_last = ||y_L||``, ``c_rest = ||sum_{i not in {0, L}} y_i||``,
``cos(s(N), v_0)``, ``cos(s(N), v_L)``, ``||s(N)||`` with its leave-one-out variants, and
``rho_0``. A cosine with a zero vector counts as 0. Details: docs/taxonomy.md §1.

Columns: docs/columns.md#regime_features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry.core.checks import check_row_inputs, typechecked
from tl_geometry.core.engine.fused import grid_sums
from tl_geometry.core.layouts import causal_rows, pack_rows
from tl_geometry.core.numerics import sink_cosine_sums, unit_vectors
from tl_geometry.core.rankings import selection_order
from tl_geometry.core.sizes import DEFAULT_NS, NsLike, resolve_ns

#: Per-row scalar features (one value per row).
SCALAR_FEATURES = ("c_sink", "c_last", "c_rest", "rho_0")
#: Per-row curves over the selection sizes ``N`` (one value per row and ``N``); the two
#: leave-one-out norms are NaN where the removed key is not in ``I_N``.
CURVE_FEATURES = ("cos_s_v0", "cos_s_vL", "norm_s", "norm_s_minus_sink", "norm_s_minus_last")


@dataclass(frozen=True)
class RegimeFeatures:
    """definitions §5 features of every row; ``*batch`` are the batch dimensions of the weights given.

    Attributes
    ----------
    ns : [n] int64, the selection sizes ``N``.
    c_sink, c_last, c_rest : [*batch], ``||y_0||``, ``||y_L||``, ``||sum_{i not in {0, L}} y_i||``.
    rho_0 : [*batch], ``mean_{j>0} cos(v_0, v_j)`` over the row's keys (NaN when ``K = 1``).
    cos_s_v0, cos_s_vL : [*batch, n], ``cos(s(N), v_0)`` and ``cos(s(N), v_L)``.
    norm_s : [*batch, n], ``||s(N)||``.
    norm_s_minus_sink : [*batch, n], ``||s(N) - y_0||`` where ``sink_in``, else NaN.
    norm_s_minus_last : [*batch, n], ``||s(N) - y_L||`` where ``last_in``, else NaN.
    sink_in, last_in : [*batch, n] bool, ``0 in I_N`` and ``L in I_N``.
    """

    ns: Int[Tensor, " n"]
    c_sink: Float[Tensor, "*batch"]
    c_last: Float[Tensor, "*batch"]
    c_rest: Float[Tensor, "*batch"]
    rho_0: Float[Tensor, "*batch"]
    cos_s_v0: Float[Tensor, "*batch n"]
    cos_s_vL: Float[Tensor, "*batch n"]
    norm_s: Float[Tensor, "*batch n"]
    norm_s_minus_sink: Float[Tensor, "*batch n"]
    norm_s_minus_last: Float[Tensor, "*batch n"]
    sink_in: Bool[Tensor, "*batch n"]
    last_in: Bool[Tensor, "*batch n"]


def cosine(a: Tensor, b: Tensor) -> Tensor:
    """``<a, b> / (||a|| ||b||)`` along the last axis; 0 where either vector is zero."""
    dot = (a * b).sum(dim=-1)
    norms = torch.linalg.vector_norm(a, dim=-1) * torch.linalg.vector_norm(b, dim=-1)
    return torch.where(norms > 0, dot / norms.clamp_min(torch.finfo(dot.dtype).tiny), torch.zeros_like(dot))


@typechecked
def sink_similarity(values: Float[Tensor, "*batch k d"]) -> Float[Tensor, "*batch"]:
    """``rho_0 = mean_{j=1..K-1} cos(v_0, v_j)`` (definitions §3) of each set of ``K`` value vectors.

    Zero vectors count as cosine 0; NaN when ``K = 1`` (no ``j > 0``).
    """
    n_keys = values.shape[-2]
    if n_keys < 2:
        return torch.full(values.shape[:-2], torch.nan, dtype=values.dtype, device=values.device)
    return sink_cosine_sums(unit_vectors(values)) / (n_keys - 1)


@typechecked
def regime_features(
    weights: Float[Tensor, "*batch k"],
    values: Float[Tensor, "*batch k d"],
    ns: NsLike = DEFAULT_NS,
    *,
    dtype: torch.dtype = torch.float64,
    query_positions: Any = None,
) -> RegimeFeatures:
    """The definitions §5 regime features of every attention row, for every selection size ``N``.

    Parameters
    ----------
    weights : Tensor of shape [*batch, K]
        Attention weights of each row over its keys ``0..L`` (``L = K - 1`` is the query position:
        key ``0`` is the sink, key ``L`` the last token). Non-negative and finite.
    values : Tensor of shape [*batch, K, d]
        Value vectors of the same keys, already mapped to the query head's key/value head.
    ns : None, "all", "log", sequence of int or 1-D int tensor, default "log"
        Selection sizes (see :func:`tl_geometry.core.sizes.resolve_ns`); None is every ``N``.
    dtype : torch.dtype, default torch.float64
        Precision of the computation.
    query_positions : int, optional
        The position ``q`` of every row's query: the rows are cut to their causal keys ``0..q``
        (negative counts from ``K``). None: the rows are taken as they are, and a row whose last
        weight is exactly 0 (the full causal row of an earlier query) is refused, as in
        :func:`tl_geometry.separability`; pass ``-1`` if such zeros are real weights.

    Returns
    -------
    RegimeFeatures
        Per-row scalars ``[*batch]`` and per-row curves ``[*batch, len(ns)]``.

    Examples
    --------
    >>> import torch
    >>> f = regime_features(torch.softmax(torch.randn(2, 9, 16), -1), torch.randn(2, 9, 16, 8), ns=[1, 4, 16])
    >>> f.cos_s_vL.shape
    torch.Size([2, 9, 3])
    """
    check_row_inputs(weights, values)
    weights, values = causal_rows(weights, values, query_positions)
    ns_t = resolve_ns(ns, weights.shape[-1], device=weights.device)
    w, packing = pack_rows(weights.to(dtype), 1)
    v, _ = pack_rows(values.to(dtype), 2)
    scalars, curves, masks = row_features(w, v, ns_t)
    rho = sink_similarity(v)

    def unpack(x: Tensor, pattern: str) -> Tensor:
        return einops.unpack(x, packing, pattern)[0]

    return RegimeFeatures(
        ns=ns_t,
        **{name: unpack(x, "*") for name, x in scalars.items()},
        rho_0=unpack(rho, "*"),
        **{name: unpack(x, "* n") for name, x in curves.items()},
        **{name: unpack(x, "* n") for name, x in masks.items()},
    )


def row_features(
    weights: Tensor, values: Tensor, ns: Tensor
) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
    """The engine on flat rows: weights [R, K], values [R, K, d], ns [G] (already checked).

    Returns ``({c_sink, c_last, c_rest}: [R], {curve features}: [R, G], {sink_in, last_in}: [R, G])``.
    ``rho_0`` is not computed here (the observer computes it once per key/value head).
    """
    n_keys = weights.shape[-1]
    order = selection_order(weights)
    rank = torch.arange(n_keys, device=weights.device).expand_as(order)
    rank_of_key = torch.empty_like(order).scatter_(-1, order, rank)  # position of key i in the order
    # s(N) = sum_{i in I_N} alpha_i v_i, no sorted copy of the values
    centers = grid_sums(values, torch.gather(weights, -1, order), ns, order)  # [R, G, d]
    sink_in = rank_of_key[:, :1] < ns[None, :]  # [R, G]
    last_in = rank_of_key[:, -1:] < ns[None, :]
    y_sink, y_last = weights[:, :1] * values[:, 0], weights[:, -1:] * values[:, -1]  # [R, d]
    v_sink, v_last = values[:, :1], values[:, -1:]  # [R, 1, d], broadcast against [R, G, d]
    rest_end = max(n_keys - 1, 1)  # the keys between the sink and the last one: 1..K-2
    y_rest = torch.matmul(weights[:, None, 1:rest_end], values[:, 1:rest_end])[:, 0]  # [R, d]
    nan = torch.tensor(torch.nan, dtype=values.dtype, device=values.device)
    scalars = {
        "c_sink": torch.linalg.vector_norm(y_sink, dim=-1),
        "c_last": torch.linalg.vector_norm(y_last, dim=-1),
        "c_rest": torch.linalg.vector_norm(y_rest, dim=-1),
    }
    curves = {
        "cos_s_v0": cosine(centers, v_sink),
        "cos_s_vL": cosine(centers, v_last),
        "norm_s": torch.linalg.vector_norm(centers, dim=-1),
        "norm_s_minus_sink": torch.where(sink_in, torch.linalg.vector_norm(centers - y_sink[:, None], dim=-1), nan),
        "norm_s_minus_last": torch.where(last_in, torch.linalg.vector_norm(centers - y_last[:, None], dim=-1), nan),
    }
    return scalars, curves, {"sink_in": sink_in, "last_in": last_in}
