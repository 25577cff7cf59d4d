"""Next-token loss over a corpus of windows, streamed, accumulated in float64 (definitions §8).

``NLL = (1 / T) sum_{windows} sum_{p = 1..L-1} -log softmax(logits[p - 1])[token[p]]``, ``T`` the
number of targets (``n_seqs * (L - 1)``): position ``p``'s token is predicted from the prefix
``0..p-1``. The log-softmax and the sum run in float64 (from float32 logits or better).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor

from tl_geometry.capture.hooks import model_device
from tl_geometry.core.progress import tqdm
from tl_geometry.errors import InputError
from tl_geometry.models import last_logits
from tl_geometry.runtime.budget import check_memory
from tl_geometry.runtime.threads import analysis_threads


@dataclass(frozen=True)
class LossSum:
    """``total`` (float64 sum of the per-target NLL, nats) over ``n_tokens`` targets; ``nll = total / n_tokens``."""

    total: float
    n_tokens: int
    #: each window's float64 sum, in window order (empty for a loss saved by an older version)
    window_totals: tuple[float, ...] = ()

    @property
    def nll(self) -> float:
        return self.total / self.n_tokens


def check_windows(tokens: Any) -> Tensor:
    """Token windows ``[n_seqs, L]`` with ``L >= 2`` (at least one target each); else one :class:`InputError`."""
    if (
        not isinstance(tokens, Tensor)
        or tokens.ndim != 2
        or tokens.dtype.is_floating_point
        or tokens.dtype == torch.bool
    ):
        raise InputError("the corpus must give an integer tensor [n_seqs, seq_len] of token ids")
    if tokens.shape[0] < 1:
        raise InputError("the corpus gives no windows: pass at least one")
    if tokens.shape[1] < 2:
        raise InputError(
            f"the windows have {tokens.shape[1]} token(s): the loss needs at least 2 (a target after the first); "
            "use seq_len >= 2"
        )
    return tokens


def check_targets(targets: Any, seq_len: int) -> int:
    """The number of targets per window: ``targets`` in ``1..seq_len - 1`` (None: all ``seq_len - 1``)."""
    if targets is None:
        return seq_len - 1
    if isinstance(targets, bool) or not isinstance(targets, numbers.Integral) or not 1 <= int(targets) <= seq_len - 1:
        raise InputError(
            f"targets must be an integer in 1..{seq_len - 1} (the last positions of a window of {seq_len} tokens "
            f"that are predicted), got {targets!r}"
        )
    return int(targets)


def window_nll(logits: Tensor, tokens: Int[Tensor, "batch pos"], targets: int | None = None) -> Tensor:
    """Per-window float64 sum of the next-token NLL over targets ``1..L-1``: shape ``[batch]``.

    ``targets`` (default: all ``L - 1``) counts only the last ``targets`` positions of each window.

    The log-softmax itself runs in float64, one window at a time (a float32 log-softmax over a
    49k-token vocabulary is biased by about 2e-6 relative on SmolLM2, the size of a real effect at
    small changes; one window's float64 logits are ``L x d_vocab x 8`` bytes).

    >>> import torch
    >>> round(float(window_nll(torch.zeros(1, 3, 4), torch.tensor([[0, 1, 2]]))[0]), 6)  # 2 log 4
    2.772589
    """
    sums = []
    first = 1 if targets is None else tokens.shape[1] - targets
    for window, ids in zip(logits[:, first - 1 : -1], tokens[:, first:].to(logits.device)):
        log_probs = F.log_softmax(window.to(torch.float64), dim=-1)
        sums.append(-log_probs.gather(-1, ids[:, None])[:, 0].sum())
    return torch.stack(sums)


def check_forward_memory(model: Any, batch_size: int, seq_len: int) -> None:
    """Refuse a forward batch whose least memory exceeds the budget (:mod:`tl_geometry.runtime.budget`).

    Counted per layer: the attention scores and pattern (float32) and a top-N restriction's
    ranking scores and order (float64, int64); and the logits (float32), one window's float64
    log-probabilities.
    """
    cfg = model.cfg
    heads, d_vocab = int(cfg.n_heads), int(getattr(cfg, "d_vocab", 0) or 0)
    n_bytes = batch_size * seq_len * (24 * heads * seq_len + 4 * d_vocab) + 8 * seq_len * d_vocab
    check_memory(
        n_bytes,
        f"a forward pass of {batch_size} windows x {seq_len} tokens",
        "lower batch_size, or use shorter windows",
    )


def corpus_nll(
    model: Any,
    tokens: Int[Tensor, "seq pos"],
    batch_size: int = 4,
    progress: bool = True,
    desc: str = "loss",
    before_batch: Callable[[Tensor], None] | None = None,
    *,
    windows: Sequence[int] | None = None,
    gather: Callable[[dict[int, float]], dict[int, float]] | None = None,
    targets: int | None = None,
) -> LossSum:
    """Stream ``tokens`` through ``model`` in batches and sum the next-token NLL in float64.

    ``before_batch(seq_ids)`` is called before each forward pass with the indices of the batch's
    windows in ``tokens`` (the intervention sets its ``seq_ids`` there). Returns :class:`LossSum`.

    ``windows`` (default: all) are the windows this process runs, e.g. its shard under torchrun
    (:func:`tl_geometry.pipeline.torchrun.shard_windows`); ``gather`` turns this process's per-window sums
    ``{window: float64 sum}`` into those of every window (every process's, merged). The total is
    then summed as one process would: the windows in order, batch by batch (``batch_size``), so a
    sharded run gives the same float64 total as one process whenever the per-window sums agree
    (always with ``batch_size=1``; with larger batches a window's logits can depend on its batch
    neighbours at float32 rounding).

    ``targets`` (default: all ``L - 1``): only the last ``targets`` positions of every window are
    targets (context scaling predicts the same last tokens from longer prefixes, definitions §9).
    """
    tokens = check_windows(tokens)
    n_targets = check_targets(targets, int(tokens.shape[1]))
    check_forward_memory(model, min(batch_size, tokens.shape[0]), tokens.shape[1])
    n_windows = tokens.shape[0]
    mine = list(range(n_windows)) if windows is None else sorted({int(i) for i in windows})
    device = model_device(model)
    sums: dict[int, float] = {}
    bar = tqdm(total=len(mine), desc=desc, unit="seq", disable=not progress, leave=False)
    with torch.inference_mode():
        for start in range(0, len(mine), batch_size):
            ids = torch.tensor(mine[start : start + batch_size], dtype=torch.int64)
            batch = tokens[ids]
            if before_batch is not None:
                before_batch(ids)
            with analysis_threads(device):  # the CPUs free now (tl_geometry.runtime.threads)
                logits = last_logits(model, batch.to(device), n_targets + 1)  # the targets' logits only
            sums.update(zip(ids.tolist(), window_nll(logits, batch[:, -(n_targets + 1) :], n_targets).cpu().tolist()))
            bar.update(batch.shape[0])
    bar.close()
    if gather is not None:
        sums = gather(sums)
    missing = [i for i in range(n_windows) if i not in sums]
    if missing:
        raise InputError(f"no loss for the windows {missing[:5]}: the shards do not cover every window")
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, n_windows, batch_size):  # the order of one process's pass
        total += torch.tensor(
            [sums[i] for i in range(start, min(start + batch_size, n_windows))], dtype=torch.float64
        ).sum()
    return LossSum(
        total=float(total),
        n_tokens=int(n_windows * n_targets),
        window_totals=tuple(float(sums[i]) for i in range(n_windows)),
    )


__all__ = ["LossSum", "check_forward_memory", "check_targets", "check_windows", "corpus_nll", "window_nll"]
