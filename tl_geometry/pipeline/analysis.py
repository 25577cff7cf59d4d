"""``analyze``: run a model over a corpus and measure separability for every layer and head.

Four steps: the settings are checked on their own (:class:`~tl_geometry.pipeline.settings.AnalysisSettings`),
the model is placed (:func:`~tl_geometry.pipeline.plan.place_model`), the settings are checked
against the model and the windows (:func:`~tl_geometry.pipeline.plan.plan_analysis`), and
:func:`~tl_geometry.pipeline.loop.run_analysis` runs the batches and assembles the result. With
``out_dir`` the per-batch results are written as they are produced and a later call with the same
model, windows and settings resumes where an interrupted one stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from tl_geometry.core.sizes import NsLike
from tl_geometry.corpus import Corpus, TokenCorpus
from tl_geometry.pipeline.loop import run_analysis
from tl_geometry.pipeline.plan import place_model, plan_analysis
from tl_geometry.pipeline.result import AnalysisResult
from tl_geometry.pipeline.settings import AnalysisSettings
from tl_geometry.theory.bounds import RhoLike


def analyze(
    model: Any,
    corpus: Corpus | TokenCorpus | str | Sequence[str] | Tensor,
    *,
    ns: NsLike = "log",
    query_positions: Any = "last",
    layers: Sequence[int] | None = None,
    batch_size: int = 4,
    dtype: torch.dtype = torch.float64,
    diagnostics: bool = False,
    taxonomy: bool = True,
    k_max: int | None = 64,
    bounds: bool = False,
    kappa: float = 0.5,
    rho: RhoLike = "measured",
    rank_by: str | Sequence[str] = ("attention",),
    distance: str = "euclidean",
    n_random: int = 16,
    seed: int = 0,
    out_dir: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
    device: str | torch.device | None = None,
) -> AnalysisResult:
    """Measure top-N separability of every attention head of ``model`` over ``corpus``.

    Parameters
    ----------
    model : TransformerBridge, HookedTransformer or str
        A TransformerLens model, or a name for :func:`tl_geometry.load_model`.
    corpus : Corpus, TokenCorpus, str, list of str, or int tensor [n_seqs, seq_len]
        The windows to analyse (see :mod:`tl_geometry.corpus`). Plain text is cut into windows
        of ``min(512, n_ctx)`` tokens; a tensor is taken as token ids.
    ns : None, "all", "log" or list of int, default "log"
        Selection sizes ``N``: "log" is a log-spaced grid (every ``N <= 8``, then 4 per
        doubling, and ``N = K``); None or "all" is every ``N`` from 1 to ``K``.
    query_positions : "last", "all", int, list of int, range or slice, default "last"
        Which query rows to analyse: ``"all"`` is every position; a ``range(start, stop, stride)``
        or ``slice(stride - 1, None, stride)`` takes every ``stride``-th.
        Negative positions count from the end.
    layers : list of int, optional
        Layers to analyse (default all). The forward pass stops after the last one.
    batch_size : int, default 4
        Windows per forward pass. Results do not depend on it.
    dtype : torch.float64 or torch.float32, default torch.float64
        Precision of the separability computation.
    diagnostics : bool, default False
        Also accumulate the assumption diagnostics of definitions §3 (value norms and the sink,
        similarity decay, the attention-weight profile of the largest query position) into
        ``result.value_norms``, ``result.similarity``, ``result.attention_profile`` and their
        curves (see :mod:`tl_geometry.diagnostics`).
    taxonomy : bool, default True
        Also accumulate the definitions §5 regime features of every head (mean and std over sequences,
        per ``N``) into ``result.regime_features``; then ``result.sink_effect()`` and
        ``result.classify_heads()`` (see :mod:`tl_geometry.taxonomy`).
    k_max : int or None, default 64
        Largest lag of the cosine-by-lag curve ``c(k)`` (with ``diagnostics=True``).
    bounds : bool, default False
        Also compute the envelopes of Theorems 1-2 and Corollary 1 (definitions §4) for every row and
        add their columns (``precision_lower``, ``precision_upper``, ``recall_lower``,
        ``recall_upper``, the four ``f_*`` bounds, ``delta``, ``delta0``, ``scale``) to
        ``result.separability``; compare with :meth:`AnalysisResult.envelopes`.
    kappa : float, default 0.5
        The theorems' unnamed concentration constant (used with ``bounds=True``).
    rho : "measured", SimilarityModel or ("model", beta, rho_0), default "measured"
        Source of the cosines in the bounds: the values' own cosines, or the assumption model
        ``exp(-beta |j-k|)`` with ``rho_0`` to the sink (see :func:`tl_geometry.theory.bounds.bounds`).
    rank_by : str or sequence of str, default ("attention",)
        The rankings that define ``I_N`` (definitions §7), one block of rows each in
        ``result.separability`` (column ``rank_by``): ``"attention"`` (definitions §2),
        ``"contribution"`` (``alpha_i ||v_i||``), ``"random"`` (the control: ``n_random`` uniform
        permutations per row, each measured around its own ``s(N)``, averaged) and
        ``"sink_window"`` (the sink and the most recent keys). Everything that reads one
        ranking (taxonomy, bounds, figures, report) reads the attention rows.
    distance : "euclidean" or "cosine", default "euclidean"
        The distance of the balls (definitions §7).
    n_random : int, default 16
        Random draws per row of the random control.
    seed : int, default 0
        Seed of the random control; a row's draws are keyed by (seq, layer, head, query_pos), so
        they do not depend on ``batch_size`` or on resuming.
    out_dir : str or Path, optional
        If given, results are appended to ``out_dir/separability/`` after every batch, and an
        interrupted run with the same arguments resumes from what was written (``resume=True``).
    resume : bool, default True
        With ``out_dir``: continue a previous run instead of refusing to overwrite it.
    progress : bool, default True
        Show a progress bar over sequences.
    device : str or torch.device, optional
        Where the model runs and the analysis computes (the analysis always computes on the
        model's device). A model given by name is loaded there; a model object must already be
        there (``model.to(device)``), else :class:`InputError` says so before any work.

    Returns
    -------
    AnalysisResult
    """
    settings = AnalysisSettings(
        ns=ns, query_positions=query_positions, layers=layers, batch_size=batch_size, dtype=dtype,
        diagnostics=diagnostics, k_max=k_max, taxonomy=taxonomy, bounds=bounds, kappa=kappa, rho=rho,
        rank_by=rank_by, distance=distance, n_random=n_random, seed=seed,
    )  # fmt: skip
    model = place_model(model, device)
    plan = plan_analysis(model, corpus, settings)
    return run_analysis(plan, out_dir=out_dir, resume=resume, progress=progress)
