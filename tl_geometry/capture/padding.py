"""Padded token batches: where each row's real tokens lie, from an attention mask or the pad token.

``model.to_tokens(["short text", "a longer text ..."])`` pads the shorter rows (on the right by
default, before the BOS with ``padding_side="left"``) and ``transformer_lens.utilities.get_attention_mask``
gives the mask of the real tokens (1) and the pads (0). A padded row measured as it stands takes a
pad for its last query (right padding) or pads for keys (left padding); :func:`real_spans`
reads each row's real tokens from the mask so they can be measured alone, and
:func:`find_padding` finds pads in a batch given without a mask, so that it can be refused.

>>> import torch
>>> real_spans(torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [1, 1, 1, 1]]))
((0, 3), (1, 3), (0, 4))
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from tl_geometry.errors import InputError

#: How to make the mask of ``model.to_tokens(texts)``, for the error messages.
MASK_ADVICE = "attention_mask=transformer_lens.utilities.get_attention_mask(model.tokenizer, tokens, prepend_bos=True)"


def real_spans(attention_mask: Any, shape: tuple[int, int] | None = None) -> tuple[tuple[int, int], ...]:
    """(first real position, number of real tokens) of each row of ``attention_mask`` ``[n_seqs, seq_len]``.

    The mask holds 1 for a real token and 0 for a pad (booleans too); each row's real tokens must be
    one run (pads on the left, the right or both), at least one token. ``shape`` (optional) is the
    ``(n_seqs, seq_len)`` the mask must have. Raises :class:`InputError` naming what is wrong.
    """
    if not isinstance(attention_mask, Tensor) or attention_mask.is_floating_point():
        raise InputError(
            f"attention_mask must be an integer or boolean tensor of 1 (real token) and 0 (pad), got "
            f"{type(attention_mask).__name__ if not isinstance(attention_mask, Tensor) else attention_mask.dtype}"
        )
    mask = attention_mask.detach().cpu()
    if mask.ndim == 1:
        mask = mask[None]
    if shape is not None and tuple(mask.shape) != tuple(shape):
        raise InputError(
            f"attention_mask of shape {tuple(attention_mask.shape)} does not match the {shape[0]} sequences of "
            f"{shape[1]} positions: pass the mask of the tokens given to run_with_cache"
        )
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise InputError("attention_mask must hold only 1 (real token) and 0 (pad)")
    spans = []
    for row, real in enumerate(mask.to(torch.bool)):
        where = torch.nonzero(real).flatten()
        if where.numel() == 0:
            raise InputError(f"row {row} of attention_mask has no real token: drop that row")
        first, last = int(where[0]), int(where[-1])
        if last - first + 1 != where.numel():
            raise InputError(
                f"row {row} of attention_mask has pads between real tokens: only pads before or after "
                "a row's tokens (as model.to_tokens makes them) can be measured"
            )
        spans.append((first, last - first + 1))
    return tuple(spans)


def find_padding(tokens: Int[Tensor, "n_seqs seq_len"], tokenizer: Any) -> tuple[list[int], str] | None:
    """The rows of ``tokens`` that look padded by ``tokenizer`` and how (``"right"``/``"left"``), or None.

    A row is padded on the right when it ends in the pad token, on the left when the pad token
    comes before its first other token (the BOS, when the pad and BOS share an id, is not counted).
    When the pad token is also the end-of-text or BOS token, a single one at the end is text, not
    padding: two are needed.
    """
    pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
    if pad is None or tokens.ndim != 2 or tokens.shape[1] < 2:
        return None
    shared = pad in {getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)}
    is_pad = tokens.detach().cpu() == int(pad)
    seq_len = is_pad.shape[1]
    trailing = torch.flip(is_pad, [1]).to(torch.int64).cumprod(1).sum(1)
    leading = is_pad.to(torch.int64).cumprod(1).sum(1)
    leading = torch.where(leading < seq_len, leading - int(pad == getattr(tokenizer, "bos_token_id", None)), leading)
    least = 2 if shared else 1
    right = [i for i, n in enumerate(trailing.tolist()) if n >= least]
    left = [i for i, n in enumerate(leading.tolist()) if n >= least]
    if right:
        return right, "right"
    if left:
        return left, "left"
    return None


__all__ = ["MASK_ADVICE", "find_padding", "real_spans"]
