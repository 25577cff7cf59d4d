"""Circuit head types beside the regimes: previous-token, duplicate-token, induction, current-token.

TransformerLens' ``head_detector`` definitions (its own detection patterns,
``transformer_lens.head_detector.get_*_detection_pattern``) on repeated random tokens made here
(:func:`repeated_random_tokens`, ``BOS + r + r``, seeded), plus a current-token score. For a head
with attention ``A[q, k]`` (``hook_pattern``) and a 0/1 detection pattern ``D[q, k]``::

    score = mean over the rows q where D[q] has a 1 of  sum_k A[q, k] * D[q, k]

previous-token ``D[q, q-1]``; duplicate-token ``D[q, k] = 1`` for the earlier copies ``k < q`` of
token ``q``; induction ``D[q, k+1]`` for those copies (the token after the earlier copy);
current-token ``D[q, q]`` for ``q >= 1`` (row 0 can only attend to itself). TransformerLens'
``detect_head`` (``error_measure="mul"``) divides the same sum by all ``L`` rows instead:
``detect_head = score * n_rows / L`` for one sequence. A head's ``head_type`` is the type of its
largest score when that score is at least ``threshold`` (default 0.4), else ``"none"``.

:func:`head_types` returns one row per (layer, head), joined to the regimes of both modes
(:func:`~tl_geometry.taxonomy.classify_heads`) when given; :func:`head_type_crosstab` counts
regimes against head types; :func:`regime_agreement` is the share of heads whose label is the same
in two runs (e.g. the Python-docs corpus and repeated random tokens). SmolLM2: docs/head_types.md.

Examples
--------
>>> from tl_geometry.testing import tiny_llama_bridge
>>> table = head_types(tiny_llama_bridge(), n_seqs=2, half_len=16)
>>> list(table.columns)
['layer', 'head', 'previous_token_score', 'duplicate_token_score', 'induction_score', 'current_token_score', 'head_type']
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.capture.hooks import model_device
from tl_geometry.core.checks import is_integer
from tl_geometry.errors import InputError
from tl_geometry.models import describe_model, hook_pattern_name
from tl_geometry.runtime.threads import runs_model
from tl_geometry.taxonomy.classify import ALL_LABELS, classify_heads

#: The head types, in the order of their score columns (``<type>_score``).
HEAD_TYPES = ("previous_token", "duplicate_token", "induction", "current_token")
#: The label of a head with no score at or above the threshold.
NO_TYPE = "none"
#: Default threshold of :func:`head_types`: a head's type needs at least this much attention, on
#: average over the rows where the type applies, on the type's keys.
TYPE_THRESHOLD = 0.4
SCORE_COLUMNS = [f"{t}_score" for t in HEAD_TYPES]


def repeated_random_tokens(
    model: Any, n_seqs: int = 8, half_len: int = 64, *, seed: int = 0
) -> Int[Tensor, "n_seqs seq_len"]:
    """Random tokens repeated twice, ``[BOS] + r + r`` (``2 * half_len + 1`` tokens; no BOS if the model has none).

    ``r`` is ``half_len`` distinct token ids drawn uniformly (seeded, ``torch.Generator``) from the
    model's vocabulary without its special tokens, so that the only repeated tokens are the second
    copy: the sequence of TransformerLens' induction demonstrations.

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer (its ``cfg.d_vocab`` and tokenizer).
    n_seqs : int, default 8
    half_len : int, default 64
        Length of ``r``.
    seed : int, default 0

    Examples
    --------
    >>> from tl_geometry.testing import tiny_llama_bridge
    >>> tokens = repeated_random_tokens(tiny_llama_bridge(), n_seqs=2, half_len=5)
    >>> tokens.shape, bool((tokens[:, 1:6] == tokens[:, 6:]).all()), tokens[:, 0].tolist()
    (torch.Size([2, 11]), True, [0, 0])
    """
    for name, value in (("n_seqs", n_seqs), ("half_len", half_len), ("seed", seed)):
        if not is_integer(value) or value < (0 if name == "seed" else 1):
            raise InputError(f"{name} must be a {'non-negative' if name == 'seed' else 'positive'} int, got {value!r}")
    info = describe_model(model)
    tokenizer = getattr(model, "tokenizer", None)
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    vocab = int(model.cfg.d_vocab)
    candidates = torch.tensor([i for i in range(vocab) if i not in special])
    if half_len > len(candidates):
        raise InputError(f"half_len={half_len} is more than the {len(candidates)} ordinary tokens of the vocabulary")
    n_ctx = int(getattr(model.cfg, "n_ctx", 0) or 0)
    seq_len = 2 * half_len + (info.bos_token_id is not None)
    if n_ctx and seq_len > n_ctx:
        raise InputError(
            f"2 * half_len{' + 1' if info.bos_token_id is not None else ''} = {seq_len} is more than the model's n_ctx={n_ctx}"
        )
    generator = torch.Generator().manual_seed(int(seed))
    halves = torch.stack(
        [candidates[torch.randperm(len(candidates), generator=generator)[:half_len]] for _ in range(n_seqs)]
    )
    parts = [halves, halves]
    if info.bos_token_id is not None:
        parts.insert(0, torch.full((n_seqs, 1), info.bos_token_id))
    return torch.cat(parts, dim=1).to(torch.int64)


def detection_patterns(tokens: Int[Tensor, " pos"]) -> Float[Tensor, "type pos pos"]:
    """The 0/1 detection patterns ``[type, q, k]`` of :data:`HEAD_TYPES` for one sequence.

    The first three are TransformerLens' ``get_previous_token_head_detection_pattern``,
    ``get_duplicate_token_head_detection_pattern`` and ``get_induction_head_detection_pattern``;
    the current-token pattern is the diagonal without row 0.

    Examples
    --------
    >>> import torch
    >>> d = detection_patterns(torch.tensor([0, 7, 8, 7, 8]))
    >>> d[2].nonzero().tolist()          # induction: row 3 (a 7) attends to 2 (after the first 7)
    [[3, 2], [4, 3]]
    """
    from transformer_lens import head_detector

    cpu = tokens.detach().cpu()
    n = len(cpu)
    current = torch.eye(n)
    current[0, 0] = 0
    return torch.stack(
        [
            head_detector.get_previous_token_head_detection_pattern(cpu).float(),
            head_detector.get_duplicate_token_head_detection_pattern(cpu).float(),
            head_detector.get_induction_head_detection_pattern(cpu).float(),
            current,
        ]
    )


def _pattern_sums(model: Any, tokens: Tensor, batch_size: int) -> tuple[Tensor, Tensor]:
    """Per (type, layer, head) the attention on the detection keys summed over applicable rows, and the row counts."""
    info = describe_model(model)
    device = model_device(model)
    names = {hook_pattern_name(layer) for layer in range(info.n_layers)}
    sums = torch.zeros(len(HEAD_TYPES), info.n_layers, info.n_heads, dtype=torch.float64)
    rows = torch.zeros(len(HEAD_TYPES), dtype=torch.float64)
    for start in range(0, len(tokens), batch_size):
        batch = tokens[start : start + batch_size]
        det = torch.stack([detection_patterns(seq) for seq in batch]).double()  # [b, type, q, k]
        rows += det.amax(-1).sum(dim=(0, 2))
        with torch.inference_mode():
            _, cache = model.run_with_cache(batch.to(device), names_filter=lambda name: name in names)
        for layer in range(info.n_layers):
            pattern = cache[hook_pattern_name(layer)].double().cpu()  # [b, head, q, k]
            sums[:, layer] += torch.einsum("bhqk,btqk->th", pattern, det)
    return sums, rows


def _regime_labels(regimes: Any) -> pd.DataFrame:
    if isinstance(regimes, pd.DataFrame) and {"regime_strict", "regime_nearest"} <= set(regimes.columns):
        heads = regimes
    else:
        heads = classify_heads(regimes)
    return heads[["layer", "head", "regime_strict", "regime_nearest"]]


@runs_model
def head_types(
    model: Any,
    regimes: Any = None,
    *,
    tokens: Int[Tensor, "n_seqs pos"] | None = None,
    n_seqs: int = 8,
    half_len: int = 64,
    seed: int = 0,
    threshold: float = TYPE_THRESHOLD,
    batch_size: int = 4,
) -> pd.DataFrame:
    """Previous-token, duplicate-token, induction and current-token scores of every (layer, head).

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer
    regimes : AnalysisResult, features table or :func:`classify_heads` frame, optional
        When given, the regime labels of both modes are joined: ``regime_strict``,
        ``regime_nearest``.
    tokens : [n_seqs, pos] int tensor, optional
        The sequences to score on; default :func:`repeated_random_tokens` (``n_seqs``,
        ``half_len``, ``seed``). Duplicate and induction scores need repeated tokens.
    n_seqs, half_len, seed : int, default 8, 64, 0
        The repeated random tokens, when ``tokens`` is not given.
    threshold : float, default 0.4
        A head's ``head_type`` is the type of its largest score if that score is at least
        ``threshold``, else ``"none"``.
    batch_size : int, default 4
        Sequences per forward pass.

    Returns
    -------
    DataFrame, one row per (layer, head): ``layer``, ``head``, ``previous_token_score``,
    ``duplicate_token_score``, ``induction_score``, ``current_token_score`` (module docstring;
    pooled over every applicable row of every sequence; NaN for a type with no applicable row),
    ``head_type``, and with ``regimes`` ``regime_strict``, ``regime_nearest``.
    ``attrs["threshold"]`` and ``attrs["n_seqs"]`` record the settings. Columns:
    docs/columns.md#head-types.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
        raise InputError(f"threshold must be a number in (0, 1], got {threshold!r}")
    if not is_integer(batch_size) or batch_size < 1:
        raise InputError(f"batch_size must be a positive int, got {batch_size!r}")
    labels = None if regimes is None else _regime_labels(regimes)  # refuse a bad regimes before the model runs
    if tokens is None:
        tokens = repeated_random_tokens(model, n_seqs, half_len, seed=seed)
    elif not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype.is_floating_point or tokens.shape[1] < 2:
        raise InputError("tokens must be an integer tensor [n_seqs, pos] with at least 2 positions")
    sums, rows = _pattern_sums(model, tokens, int(batch_size))
    with np.errstate(invalid="ignore", divide="ignore"):
        scores = (sums / rows[:, None, None]).numpy()  # [type, layer, head]
    n_types, n_layers, n_heads = scores.shape
    flat = scores.reshape(n_types, -1).T  # [layer * head, type]
    table = pd.DataFrame(flat, columns=SCORE_COLUMNS)
    table.insert(0, "head", np.tile(np.arange(n_heads), n_layers))
    table.insert(0, "layer", np.repeat(np.arange(n_layers), n_heads))
    best = np.nan_to_num(flat, nan=-np.inf)
    winner = best.argmax(axis=1)
    typed = best[np.arange(len(best)), winner] >= threshold
    table["head_type"] = pd.Categorical(
        np.where(typed, np.array(HEAD_TYPES)[winner], NO_TYPE), categories=[*HEAD_TYPES, NO_TYPE]
    )
    if labels is not None:
        table = table.merge(labels, on=["layer", "head"], how="left", validate="one_to_one")
    table.attrs["threshold"] = float(threshold)
    table.attrs["n_seqs"] = len(tokens)
    return table


def head_type_crosstab(table: pd.DataFrame, mode: str = "strict") -> pd.DataFrame:
    """Number of heads per regime (rows, mode ``mode``) and head type (columns), every label shown.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"regime_strict": ["Reset", "Reset", "Mixer"], "head_type": ["induction", "none", "none"]})
    >>> head_type_crosstab(t).loc["Reset", ["induction", "none"]].tolist()
    [1, 1]
    """
    column = f"regime_{mode}"
    if column not in table.columns or "head_type" not in table.columns:
        raise InputError(
            f"needs a head_types table joined to the regimes (columns {column!r} and 'head_type'): pass regimes= to head_types"
        )
    regime = pd.Categorical(table[column].astype(str), categories=list(ALL_LABELS))
    kind = pd.Categorical(table["head_type"].astype(str), categories=[*HEAD_TYPES, NO_TYPE])
    counts = pd.crosstab(regime, kind, dropna=False)
    counts.index.name, counts.columns.name = f"regime ({mode})", "head type"
    return counts


def regime_agreement(first: Any, second: Any) -> pd.DataFrame:
    """Share of heads whose regime label is the same in two runs, per mode.

    Parameters
    ----------
    first, second : AnalysisResult, features table or :func:`classify_heads` frame
        Two runs of the same model (e.g. the Python-docs corpus and repeated random tokens).

    Returns
    -------
    DataFrame, one row per mode (``strict``, ``nearest``): ``mode``, ``n_heads``, ``n_same``,
    ``share_same``.

    Examples
    --------
    >>> import pandas as pd
    >>> a = pd.DataFrame({"layer": 0, "head": [0, 1], "regime_strict": ["Reset", "Mixer"], "regime_nearest": ["Reset", "Mixer"]})
    >>> regime_agreement(a, a.assign(regime_strict=["Reset", "Unclassified"])).share_same.tolist()
    [0.5, 1.0]
    """
    a, b = _regime_labels(first), _regime_labels(second)
    both = a.merge(b, on=["layer", "head"], suffixes=("_a", "_b"), validate="one_to_one")
    if len(both) == 0:
        raise InputError("the two runs share no (layer, head)")
    rows = []
    for mode in ("strict", "nearest"):
        same = both[f"regime_{mode}_a"].astype(str) == both[f"regime_{mode}_b"].astype(str)
        rows.append({"mode": mode, "n_heads": len(both), "n_same": int(same.sum()), "share_same": float(same.mean())})
    return pd.DataFrame(rows)
