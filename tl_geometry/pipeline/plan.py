"""``plan_analysis``: a model, its windows and the settings checked against both, before any forward pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor

from tl_geometry.capture.cached import CachedActivations
from tl_geometry.capture.hooks import model_device
from tl_geometry.capture.padding import find_padding
from tl_geometry.core.engine.rows import ORDER_BYTES_PER_KEY
from tl_geometry.corpus import as_corpus, corpus_tokens
from tl_geometry.errors import InputError
from tl_geometry.io.store import run_identity
from tl_geometry.models import ModelInfo, check_device, describe_model, load_model
from tl_geometry.pipeline.settings import AnalysisSettings
from tl_geometry.runtime.budget import check_memory


def place_model(model: Any, device: str | torch.device | None) -> Any:
    """``model`` loaded on ``device`` when given by name; a model object checked to be on ``device``.

    Examples
    --------
    >>> place_model("smollm2-135m", "nowhere")
    Traceback (most recent call last):
    ...
    tl_geometry.errors.InputError: device 'nowhere' is not a torch device: use 'cpu', 'cuda', 'cuda:1' or 'mps'
    """
    if device is None:
        return model
    target = check_device(device)
    if isinstance(model, str):
        return load_model(model, device=target)
    here = model_device(model)
    if here.type != target.type or (target.index is not None and here.index != target.index):
        raise InputError(
            f"the model is on {here} but device={str(target)!r}: move it first (model.to({str(target)!r})) "
            "or pass the model by name to load it there"
        )
    return model


@dataclass(frozen=True)
class AnalysisPlan:
    """A checked analysis, ready to run: the model, its windows and the settings resolved against them.

    Made by :func:`plan_analysis`; :func:`run_analysis` runs it.

    Attributes
    ----------
    model : the TransformerLens model.
    info : its :class:`ModelInfo`.
    settings : the :class:`~tl_geometry.pipeline.settings.AnalysisSettings`.
    corpus_name : the corpus's name (recorded in ``config``).
    tokens : int64 tensor [n_seqs, seq_len], the windows (None for a cache given without them).
    layers : the layers to analyse, sorted.
    queries : the query positions, sorted, non-negative.
    cached : the activations to read instead of running the model (:func:`tl_geometry.analyze_cache`).
    """

    model: Any
    info: ModelInfo
    settings: AnalysisSettings
    corpus_name: str
    tokens: Tensor | None = field(repr=False)
    layers: list[int]
    queries: tuple[int, ...]
    cached: CachedActivations | None = field(default=None, repr=False)

    @property
    def n_seqs(self) -> int:
        """The number of windows."""
        return self.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        """(number of windows, window length)."""
        if self.tokens is not None:
            return int(self.tokens.shape[0]), int(self.tokens.shape[1])
        if self.cached is None:
            raise ValueError("an AnalysisPlan needs tokens or cached activations")
        return self.cached.shape(self.layers[0])

    def config(self) -> dict:
        """``AnalysisResult.config``: corpus, geometry of the windows and the settings as used."""
        s = self.settings
        source = {"source": "ActivationCache", "tokens": self.tokens is not None} if self.cached is not None else {}
        if self.cached is not None and self.cached.real_spans is not None:  # a padded batch: rows cut to their tokens
            source["real_tokens"] = [length for _, length in self.cached.real_spans]
        return {
            **source,
            "corpus": self.corpus_name,
            "n_seqs": self.shape[0],
            "seq_len": self.shape[1],
            "ns": s.ns if isinstance(s.ns, str) else list(s.ns),
            "query_positions": list(self.queries),
            "layers": list(self.layers),
            "dtype": str(s.dtype),
            "bounds": {"kappa": s.kappa, "rho": str(s.rho)} if s.bounds else None,
            "diagnostics": {"k_max": s.k_max} if s.diagnostics else None,
            "taxonomy": s.taxonomy,
            "rank_by": list(s.rank_by),
            "distance": s.distance,
            "n_random": s.n_random if s.random_control else None,
            "seed": s.seed if s.random_control else None,
        }

    def identity(self) -> dict[str, Any]:
        """What a saved run must share to be resumed (see :func:`tl_geometry.io.store.run_identity`)."""
        if self.tokens is None:
            raise ValueError("a run from a cache is not saved as it goes: it has no identity to resume")
        return run_identity(self.model, self.info, self.tokens, self.settings.identity())


def plan_analysis(model: Any, corpus: Any, settings: AnalysisSettings) -> AnalysisPlan:
    """Load the model (when given by name), cut the corpus into windows and check every setting
    against both; raises :class:`InputError` / :class:`ModelError` before any forward pass.

    Parameters
    ----------
    model : TransformerBridge, HookedTransformer or str
        As for :func:`analyze`.
    corpus : Corpus, TokenCorpus, str, list of str, or int tensor [n_seqs, seq_len]
        As for :func:`analyze`.
    settings : AnalysisSettings
        Already checked on their own (at construction).
    """
    model = load_model(model) if isinstance(model, str) else model
    info = describe_model(model)
    if isinstance(corpus, Tensor) and not corpus.is_floating_point():
        refuse_padding(corpus if corpus.ndim == 2 else corpus[None], model)
    corpus = as_corpus(corpus, default_seq_len=min(512, info.n_ctx))
    if corpus.seq_len > info.n_ctx:
        raise InputError(
            f"seq_len={corpus.seq_len} is longer than the model's context of {info.n_ctx} tokens; "
            f"use seq_len <= {info.n_ctx}"
        )
    layers, queries = settings.resolve(info.n_layers, corpus.seq_len, info.sliding_windows)
    d_vocab = int(getattr(model.cfg, "d_vocab", 0) or 0)
    check_run_memory(info.n_heads, d_vocab, len(layers), queries, settings, corpus.seq_len, corpus.n_seqs)
    tokens = corpus_tokens(model, corpus, info)
    return AnalysisPlan(model, info, settings, corpus.name, tokens, layers, queries)


def refuse_padding(tokens: Tensor, model: Any) -> None:
    """Refuse token windows padded by the model's tokenizer: ``analyze`` measures every position."""
    padded = find_padding(tokens, getattr(model, "tokenizer", None))
    if padded is not None:
        rows, side = padded
        raise InputError(
            f"rows {rows[:8]}{' ...' if len(rows) > 8 else ''} of the token windows are padded on the {side} (the pad "
            f"token {model.tokenizer.pad_token_id}), and analyze would measure the pads: pass the texts as a list of "
            "strings (cut into windows of equal length), or run_with_cache and analyze_cache(cache, tokens, "
            "attention_mask=...)"
        )


#: Bytes any run holds beyond the loaded model whatever its size: the libraries the analysis and
#: the report import, and their buffers (measured 180 MiB at ``--seq-len 64``).
BASE_BYTES = 256 << 20
#: Bytes one result row takes at the peak of its batch: the observers' tables, their join and
#: its conversion for the store (calibrated with ``benchmarks/bench_memory.py --query-all``).
ROW_BYTES = 512
#: Bytes per (layer, head, query position, ``N``, ranking) of the tables over every window that
#: follow the batches: the sums behind every mean, the regime features, the head labels and the
#: report (calibrated with the same benchmark).
GROUP_BYTES = 1536


def rows_per_window(n_layers: int, n_heads: int, queries: Sequence[int], settings: AnalysisSettings) -> int:
    """The rows one window adds to the results: per layer, head, query position, ``N`` and ranking."""
    from tl_geometry.core.sizes import clip_ns, resolve_ns

    sizes = sum(int(resolve_ns(clip_ns(settings.ns, q + 1), q + 1).numel()) for q in queries)
    return n_layers * n_heads * sizes * len(settings.rank_by)


def run_memory(
    n_heads: int,
    d_vocab: int,
    n_layers: int,
    queries: Sequence[int],
    settings: AnalysisSettings,
    seq_len: int,
    n_seqs: int | None,
) -> tuple[int, str]:
    """The bytes a run holds at its peak beyond the loaded model, and the run in words.

    Needs only the model's shape (``n_heads``, ``d_vocab``, the ``n_layers`` analysed), so it is
    known before the model loads. Counted: :data:`BASE_BYTES`, one layer's attention scores and pattern and the logits
    of the forward pass (float32), the captured weights of every query position, the random
    draws of one query position (the engine works through the rest in blocks), the rows of one
    batch (:data:`ROW_BYTES` each) and the tables over every window that follow
    (:data:`GROUP_BYTES` per row of one window: they grow with the query positions, not the windows).
    """
    batch = min(settings.batch_size, n_seqs or settings.batch_size)
    draws = settings.n_random if settings.random_control else 1
    forward = batch * seq_len * (2 * n_heads * seq_len + d_vocab) * 4
    captured = batch * n_heads * len(queries) * seq_len * 4
    one_position = batch * n_heads * draws * seq_len * ORDER_BYTES_PER_KEY
    rows = rows_per_window(n_layers, n_heads, queries, settings)
    tables = rows * (batch * ROW_BYTES + GROUP_BYTES)
    what = (
        f"a run of batches of {batch} window{'s' if batch > 1 else ''} x {seq_len} tokens ({len(queries)} query positions, {draws} draws "
        f"per row, {rows} result rows per window)"
    )
    return BASE_BYTES + forward + captured + one_position + tables, what


def check_run_memory(
    n_heads: int,
    d_vocab: int,
    n_layers: int,
    queries: Sequence[int],
    settings: AnalysisSettings,
    seq_len: int,
    n_seqs: int | None,
) -> None:
    """Refuse, before any forward pass, a run whose peak (:func:`run_memory`) exceeds the budget
    (:mod:`tl_geometry.runtime.budget`)."""
    n_bytes, what = run_memory(n_heads, d_vocab, n_layers, queries, settings, seq_len, n_seqs)
    check_memory(n_bytes, what, "lower batch_size, seq_len or n_random, or measure fewer query positions or sizes N")
