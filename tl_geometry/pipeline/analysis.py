"""``analyze``: run a model over a corpus and measure separability for every layer and head.

Four steps: the settings are checked on their own (:class:`~tl_geometry.pipeline.settings.AnalysisSettings`),
the model is placed (:func:`~tl_geometry.pipeline.plan.place_model`), the settings are checked
against the model and the windows (:func:`~tl_geometry.pipeline.plan.plan_analysis`), and
:func:`~tl_geometry.pipeline.loop.run_analysis` runs the batches and assembles the result. With
``out_dir`` the per-batch results are written as they are produced and a later call with the same
model, windows and settings resumes where an interrupted one stopped.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from tl_geometry.corpus import Corpus, TokenCorpus
from tl_geometry.io.lock import RunLock
from tl_geometry.pipeline.loop import run_analysis
from tl_geometry.pipeline.plan import place_model, plan_analysis
from tl_geometry.pipeline.result import AnalysisResult
from tl_geometry.pipeline.settings import (
    AnalysisSettings,
    combine_settings,
    fill_settings_doc,
    signature_with_settings,
)


def analyze(
    model: Any,
    corpus: Corpus | TokenCorpus | str | Sequence[str] | Tensor,
    settings: AnalysisSettings | None = None,
    *,
    out_dir: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
    device: str | torch.device | None = None,
    **overrides: Any,
) -> AnalysisResult:
    """Measure top-N separability of every attention head of ``model`` over ``corpus``.

    Parameters
    ----------
    model : TransformerBridge, HookedTransformer or str
        A TransformerLens model, or a name for :func:`tl_geometry.load_model`.
    corpus : Corpus, TokenCorpus, str, list of str, or int tensor [n_seqs, seq_len]
        The windows to analyse (see :mod:`tl_geometry.corpus`). Plain text is cut into windows
        of ``min(512, n_ctx)`` tokens; a tensor is taken as token ids.
    settings : AnalysisSettings, optional
        The settings below as one object (default ``AnalysisSettings()``); a setting also given
        as a keyword replaces that field.
    {settings}
    out_dir : str or Path, optional
        If given, results are appended to ``out_dir/separability/`` after every batch, and an
        interrupted run with the same arguments resumes from what was written (``resume=True``);
        the rows stay on disk, merged one range of windows at a time, until first read (the
        result's means, figures and report read them in batches, never whole). Without
        it the rows are kept in memory, about 160 bytes a row (250 with ``bounds``) for
        ``n_seqs x layers x heads x query positions x |ns| x rankings`` rows: 3.5 MB for 8 windows
        of SmolLM2 with the defaults, 512 times that with every query position of 512 tokens.
        Give ``out_dir`` for runs beyond memory. The directory is locked while the call runs: one that another process is using is refused
        (:class:`~tl_geometry.io.lock.RunLock`).
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
    settings = combine_settings(settings, overrides, "analyze(model, corpus, ns=...)")
    with RunLock(out_dir) if out_dir is not None else nullcontext():
        model = place_model(model, device)
        plan = plan_analysis(model, corpus, settings)
        return run_analysis(plan, out_dir=out_dir, resume=resume, progress=progress)


analyze.__doc__ = fill_settings_doc(analyze.__doc__)
analyze.__signature__ = signature_with_settings(analyze)  # type: ignore[attr-defined]
