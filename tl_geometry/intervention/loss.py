"""Next-token loss over a corpus of windows, streamed, accumulated in float64 (definitions §8).

``NLL = (1 / T) sum_{windows} sum_{p = 1..L-1} -log softmax(logits[p - 1])[token[p]]``, ``T`` the
number of targets (``n_seqs * (L - 1)``): position ``p``'s token is predicted from the prefix
``0..p-1``. Logits are taken in float32 or better; the sum runs in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from ..capture import model_device
from ..errors import InputError


@dataclass(frozen=True)
class LossSum:
    """``total`` (float64 sum of the per-target NLL, nats) over ``n_tokens`` targets; ``nll = total / n_tokens``."""

    total: float
    n_tokens: int

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


def window_nll(logits: Tensor, tokens: Int[Tensor, "batch pos"]) -> Tensor:
    """Per-window float64 sum of the next-token NLL over targets ``1..L-1``: shape ``[batch]``."""
    log_probs = F.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = log_probs.gather(-1, tokens[:, 1:, None].to(log_probs.device))[..., 0]
    return -picked.double().sum(dim=-1)


def corpus_nll(
    model: Any,
    tokens: Int[Tensor, "seq pos"],
    batch_size: int = 4,
    progress: bool = True,
    desc: str = "loss",
    before_batch: Callable[[Tensor], None] | None = None,
) -> LossSum:
    """Stream ``tokens`` through ``model`` in batches and sum the next-token NLL in float64.

    ``before_batch(seq_ids)`` is called before each forward pass (the intervention sets its
    ``seq_ids`` there). Returns :class:`LossSum`.
    """
    tokens = check_windows(tokens)
    device = model_device(model)
    total = torch.zeros((), dtype=torch.float64)
    bar = tqdm(total=tokens.shape[0], desc=desc, unit="seq", disable=not progress, leave=False)
    with torch.inference_mode():
        for start in range(0, tokens.shape[0], batch_size):
            batch = tokens[start : start + batch_size]
            if before_batch is not None:
                before_batch(torch.arange(start, start + batch.shape[0]))
            logits = model(batch.to(device))
            total += window_nll(logits, batch).sum().cpu()
            bar.update(batch.shape[0])
    bar.close()
    return LossSum(total=float(total), n_tokens=int(tokens.shape[0] * (tokens.shape[1] - 1)))


__all__ = ["LossSum", "check_windows", "corpus_nll", "window_nll"]
