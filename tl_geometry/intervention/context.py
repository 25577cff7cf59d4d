"""``top_n_attention``: a context manager that restricts a model's attention to the top-``N`` keys.

Inside the ``with`` block, every forward pass of the model edits ``blocks.{l}.attn.hook_pattern``
of every chosen (layer, head): each causal query keeps only the ``N`` keys of ``I_N`` under
``rank_by`` (definitions §7), scored from the activations of *this* forward pass, so later layers
see the changed residual stream (definitions §8). ``"contribution"`` scores ``alpha_i ||v_i||``
with the values of the key/value head serving the query head (grouped-query attention: ``g = h //
(n_heads // n_kv_heads)``), read from ``hook_v`` of the same layer in the same pass.

On entry one probe forward of four tokens checks that the model honours pattern edits (its
``hook_z`` must equal the edited pattern times the values in every layer); a model whose attention
runs in a native kernel that ignores ``hook_pattern`` is refused with :class:`ModelError`. On exit,
also when the body raises, exactly the hooks added are removed: the model is as before.
"""

from __future__ import annotations

import contextlib
import numbers
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import einops
import numpy as np
import torch
from torch import Tensor

from tl_geometry.capture.hooks import as_kv_values, model_device
from tl_geometry.core.checks import is_integer
from tl_geometry.core.rankings import check_rank_by, check_seed, ranking_scores, row_keys
from tl_geometry.errors import InputError, ModelError
from tl_geometry.intervention.restrict import restrict_pattern, restrict_pattern_per_head
from tl_geometry.models import ModelInfo, describe_model, hook_pattern_name, hook_v_name
from tl_geometry.runtime.threads import model_threads

HOOK_Z = "blocks.{layer}.attn.hook_z"


def check_n(n: Any) -> int:
    """``n`` as an int ``>= 1``; otherwise one :class:`InputError`."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise InputError(f"n must be an integer >= 1 (the number of keys each query keeps), got {n!r}")
    return int(n)


def resolve_units(info: ModelInfo, layers: Any = None, heads: Any = None) -> dict[int, tuple[int, ...]]:
    """``{layer: heads}`` restricted: ``layers`` (None: all; an int or ints) x ``heads`` (None: all; an int or ints).

    Negative indices count from the end, as in Python.
    """

    def pick(spec: Any, size: int, what: str) -> tuple[int, ...]:
        if spec is None:
            return tuple(range(size))
        items = [spec] if isinstance(spec, numbers.Integral) else spec
        try:
            items = list(items)
        except TypeError:
            raise InputError(f"{what} must be None, an int or a list of ints, got {spec!r}") from None
        out = []
        for item in items:
            if not is_integer(item) or not -size <= int(item) < size:
                raise InputError(f"{what} {item!r} is not an index in 0..{size - 1}")
            out.append(int(item) % size)
        if not out:
            raise InputError(f"{what} is empty: pass None for all of them")
        return tuple(sorted(set(out)))

    layer_ids = pick(layers, info.n_layers, "layer")
    head_ids = pick(heads, info.n_heads, "head")
    return {layer: head_ids for layer in layer_ids}


def head_budget(info: ModelInfo, n: Any, layers: Any = None, heads: Any = None) -> Tensor:
    """Keys kept by every (layer, head) as an int64 tensor ``[n_layers, n_heads]`` (``0``: the head stays full).

    ``n`` is an int ``>= 1`` (for the heads chosen by ``layers`` x ``heads``), a mapping
    ``{(layer, head): n}`` (heads not named stay full) or an integer tensor/array
    ``[n_layers, n_heads]``; in the last two, ``n <= 0`` keeps a head full. Every entry is checked
    here, before any forward pass: one :class:`InputError` naming the bad entry.

    >>> from tl_geometry.models import ModelInfo
    >>> info = ModelInfo("toy", "TransformerBridge", n_layers=2, n_heads=3, n_kv_heads=3, d_head=4, n_ctx=16,
    ...                  bos_token_id=None, values_include_value_bias=True)
    >>> head_budget(info, {(1, 2): 4, (0, 0): 1}).tolist()
    [[1, 0, 0], [0, 0, 4]]
    """
    per_head = isinstance(n, (Mapping, Tensor, np.ndarray))
    if not per_head:
        size = check_n(n)
        budget = torch.zeros(info.n_layers, info.n_heads, dtype=torch.int64)
        for layer, chosen in resolve_units(info, layers, heads).items():
            budget[layer, list(chosen)] = size
        return budget
    if layers is not None or heads is not None:
        raise InputError("layers= and heads= choose the heads of an int n; a per-head n names its heads itself")
    if isinstance(n, Mapping):
        budget = torch.zeros(info.n_layers, info.n_heads, dtype=torch.int64)
        for key, value in n.items():
            layer, head = check_head_key(info, key, "n")
            if not is_integer(value):
                raise InputError(f"n[{key!r}] = {value!r} is not an integer (keys kept; 0 or less: full)")
            budget[layer, head] = int(value)
        return budget
    array = torch.as_tensor(n)
    if array.dtype.is_floating_point or array.dtype.is_complex or array.dtype == torch.bool:
        raise InputError(f"a per-head n must hold integers (keys kept; 0 or less: full), got dtype {array.dtype}")
    if tuple(array.shape) != (info.n_layers, info.n_heads):
        raise InputError(
            f"a per-head n must have shape [n_layers, n_heads] = [{info.n_layers}, {info.n_heads}], "
            f"got {list(array.shape)}"
        )
    return array.to(torch.int64).clone()


def check_head_key(info: ModelInfo, key: Any, what: str) -> tuple[int, int]:
    """A ``(layer, head)`` key of a per-head mapping, checked against the model."""
    if (
        not isinstance(key, tuple)
        or len(key) != 2
        or not all(is_integer(k) for k in key)
        or not (0 <= int(key[0]) < info.n_layers and 0 <= int(key[1]) < info.n_heads)
    ):
        raise InputError(
            f"{what} has the key {key!r}: keys must be (layer, head) with layer in 0..{info.n_layers - 1} "
            f"and head in 0..{info.n_heads - 1}"
        )
    return int(key[0]), int(key[1])


def head_rankings(info: ModelInfo, rank_by: Any) -> tuple[tuple[str, ...], ...]:
    """The ranking of every (layer, head): ``rank_by`` a ranking name, or ``{(layer, head): name}``
    (heads not named rank by ``"attention"``). Checked here, one :class:`InputError` per bad entry."""
    if not isinstance(rank_by, Mapping):
        name = check_rank_by(rank_by)
        return tuple((name,) * info.n_heads for _ in range(info.n_layers))
    table = [["attention"] * info.n_heads for _ in range(info.n_layers)]
    for key, value in rank_by.items():
        layer, head = check_head_key(info, key, "rank_by")
        table[layer][head] = check_rank_by(value)
    return tuple(tuple(row) for row in table)


@dataclass
class TopNAttention:
    """The state of one ``top_n_attention`` block (what it restricts and how).

    Attributes
    ----------
    n, rank_by, renormalize, seed : as given to :func:`top_n_attention`.
    budget : int64 tensor [n_layers, n_heads], keys kept by each head's queries (0: full).
    rankings : the ranking of each (layer, head), ``rankings[layer][head]``.
    units : ``{layer: heads}`` restricted.
    seq_ids : corpus index of each window of the next forward pass, for the ``"random"`` ranking's
        row keys (default: the window's index in the batch); set it before each batch to make draws
        independent of batching.
    """

    model: Any
    info: ModelInfo
    n: Any
    rank_by: Any
    renormalize: bool
    units: dict[int, tuple[int, ...]]
    budget: Tensor
    rankings: tuple[tuple[str, ...], ...]
    seed: int = 0
    seq_ids: Tensor | None = None
    _values: dict[int, Tensor] = field(default_factory=dict, repr=False)
    _handles: list[tuple[Any, Any]] = field(default_factory=list, repr=False)

    # -- scores of one layer
    def scores(self, layer: int, pattern: Tensor, heads: Tensor, rank_by: str | None = None) -> Tensor:
        """Score of every key for the rows ``pattern[b, heads, q, k]`` (future keys ``-inf``) under
        ``rank_by`` (default: the ranking of ``heads[0]``)."""
        rank_by = rank_by if rank_by is not None else self.rankings[layer][int(heads[0])]
        if rank_by == "attention":
            return pattern  # the order of alpha in float32 is its order in float64
        n_queries, n_keys = pattern.shape[-2:]
        if rank_by == "contribution":
            values = self._values.get(layer)
            if values is None:
                raise ModelError(
                    f"hook_v of layer {layer} did not fire before hook_pattern: contribution ranking needs it"
                )
            norms = torch.linalg.vector_norm(values.to(torch.float64), dim=-1)  # [b, pos, kv_head]
            per_head = norms[:, :, self.info.kv_head_of().to(norms.device)[heads]]  # [b, k, h]
            per_row = einops.repeat(per_head, "b k h -> b h q k 1", q=n_queries)
            scores = ranking_scores(pattern, per_row, "contribution")  # alpha_i * || ||v_i|| || = alpha_i ||v_i||
        elif rank_by == "sink_window":
            scores = ranking_scores(pattern, None, "sink_window").clone()
        else:
            batch = pattern.shape[0]
            seq = self.seq_ids if self.seq_ids is not None else torch.arange(batch)
            if seq.shape[0] != batch:
                raise InputError(f"seq_ids has {seq.shape[0]} entries for a batch of {batch} windows")
            keys = row_keys(
                seq=seq.to(pattern.device)[:, None, None],
                layer=layer,
                head=heads.to(pattern.device)[None, :, None],
                query_pos=torch.arange(n_queries, device=pattern.device)[None, None, :],
            )
            scores = ranking_scores(pattern, None, "random", row_keys=keys, seed=self.seed)
        future = torch.ones(n_queries, n_keys, dtype=torch.bool, device=pattern.device).triu(1)
        window = self.info.sliding_window(layer)
        if window is not None:  # and the keys before the window
            future |= torch.ones(n_queries, n_keys, dtype=torch.bool, device=pattern.device).tril(-window)
        return scores.masked_fill(future, -torch.inf)

    def mixed_scores(self, layer: int, pattern: Tensor, heads: Tensor) -> Tensor:
        """float64 scores of the rows ``pattern[b, heads]``, each head under its own ranking
        (one call of :meth:`scores` per ranking present, vectorised over its heads)."""
        names = [self.rankings[layer][int(h)] for h in heads]
        out = torch.empty(pattern.shape, dtype=torch.float64, device=pattern.device)
        for name in dict.fromkeys(names):
            where = torch.tensor([i for i, other in enumerate(names) if other == name], device=pattern.device)
            out[:, where] = self.scores(layer, pattern[:, where], heads[where.cpu()], name).to(torch.float64)
        return out

    # -- hooks
    def _v_hook(self, layer: int):
        def hook(values: Tensor, hook: Any) -> None:
            self._values[layer] = as_kv_values(values.detach(), self.info)

        return hook

    def _pattern_hook(self, layer: int):
        heads = torch.tensor(self.units[layer], dtype=torch.int64)
        all_heads = len(self.units[layer]) == self.info.n_heads
        sizes = self.budget[layer, heads]
        names = {self.rankings[layer][int(h)] for h in heads}
        uniform = len(names) == 1 and bool((sizes == sizes[0]).all())

        def hook(pattern: Tensor, hook: Any) -> Tensor:
            if pattern.ndim != 4 or pattern.shape[-1] != pattern.shape[-2]:
                raise ModelError(
                    f"hook_pattern of layer {layer} has shape {tuple(pattern.shape)}; the intervention needs the "
                    "square causal pattern [batch, head, pos, pos] of a forward pass without a KV cache"
                )
            try:
                chosen = pattern if all_heads else pattern.index_select(1, heads.to(pattern.device))
                window = self.info.sliding_window(layer)
                if uniform:
                    scores = self.scores(layer, chosen, heads)
                    kept = restrict_pattern(chosen, scores, int(sizes[0]), self.renormalize, window=window)
                else:
                    scores = self.mixed_scores(layer, chosen, heads)
                    kept = restrict_pattern_per_head(chosen, scores, sizes, self.renormalize, window=window)
            finally:
                self._values.pop(layer, None)
            if all_heads:
                return kept
            out = pattern.clone()
            out[:, heads.to(pattern.device)] = kept
            return out

        return hook

    def attach(self) -> None:
        """Add the hooks (remembering exactly which, for :meth:`detach`)."""
        for layer in sorted(self.units):
            if "contribution" in {self.rankings[layer][h] for h in self.units[layer]}:
                self._add(hook_v_name(layer), self._v_hook(layer))
            self._add(hook_pattern_name(layer), self._pattern_hook(layer))

    def _add(self, name: str, fn: Any) -> None:
        point = self.model.hook_dict[name]
        before = list(point.fwd_hooks)
        point.add_hook(fn, dir="fwd")
        for handle in point.fwd_hooks:
            if not any(handle is old for old in before):
                self._handles.append((point, handle))

    def detach(self) -> None:
        """Remove exactly the hooks :meth:`attach` added; forget the stored values."""
        for point, handle in reversed(self._handles):
            handle.hook.remove()
            point.fwd_hooks = [h for h in point.fwd_hooks if h is not handle]
        self._handles.clear()
        self._values.clear()


def check_pattern_edits_honoured(model: Any, info: ModelInfo) -> None:
    """Refuse a model whose attention output ignores edits of ``hook_pattern``.

    One forward pass of 4 tokens replaces every layer's pattern by "each query attends only to
    itself"; then ``hook_z[b, q, h]`` must equal ``v[b, q, g(h)]`` in every layer.
    """
    tokens = (torch.arange(4) % max(int(getattr(model.cfg, "d_vocab", 2) or 2), 1))[None].to(model_device(model))
    seen: dict[str, Tensor] = {}

    def diagonal(pattern: Tensor, hook: Any) -> Tensor:
        eye = torch.eye(pattern.shape[-1], dtype=pattern.dtype, device=pattern.device)
        return eye.expand_as(pattern).clone()

    def keep(name: str):
        def hook(act: Tensor, hook: Any) -> None:
            seen[name] = act.detach()

        return hook

    hooks = []
    for layer in range(info.n_layers):
        hooks.append((hook_pattern_name(layer), diagonal))
        hooks.append((hook_v_name(layer), keep(hook_v_name(layer))))
        hooks.append((HOOK_Z.format(layer=layer), keep(HOOK_Z.format(layer=layer))))
    if any(name not in model.hook_dict for name, _ in hooks):
        raise ModelError(
            "this model has no blocks.{l}.attn.hook_z to check the intervention against; "
            "top_n_attention supports TransformerBridge and HookedTransformer with standard attention"
        )
    with torch.inference_mode():
        model.run_with_hooks(tokens, fwd_hooks=hooks)
    kv_of = info.kv_head_of()
    for layer in range(info.n_layers):
        z, v = seen.get(HOOK_Z.format(layer=layer)), seen.get(hook_v_name(layer))
        if z is None or v is None:
            raise ModelError(
                f"layer {layer} did not fire hook_z/hook_v: its attention cannot be restricted through hook_pattern; "
                'load the model with attn_implementation="eager"'
            )
        if z.ndim == 3:
            z = einops.rearrange(z, "b p (h d) -> b p h d", d=info.d_head)
        expected = as_kv_values(v, info)[:, :, kv_of.to(v.device)]  # [b, pos, head, d_head]
        if not torch.allclose(z.float(), expected.float(), rtol=1e-4, atol=1e-5):
            raise ModelError(
                f"layer {layer} ignores edits of hook_pattern (its attention runs in a native kernel): the top-N "
                'intervention would report an unchanged loss. Load the model with attn_implementation="eager" '
                "(tl_geometry.load_model does) or use a HookedTransformer"
            )


@contextlib.contextmanager
def top_n_attention(
    model: Any,
    n: int | Mapping[tuple[int, int], int] | Tensor = 8,
    rank_by: str | Mapping[tuple[int, int], str] = "attention",
    renormalize: bool = False,
    layers: int | Sequence[int] | None = None,
    heads: int | Sequence[int] | None = None,
    seed: int = 0,
) -> Iterator[TopNAttention]:
    """Restrict every causal query of the chosen heads to its top-``n`` keys while the block runs.

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer (eager attention)
    n : int >= 1, mapping ``{(layer, head): int}`` or integer tensor ``[n_layers, n_heads]``
        Keys kept per query; a query with at most ``n`` visible keys is unchanged. A mapping or a
        tensor gives every head its own budget (heads not named, and entries ``<= 0``, stay full);
        :func:`tl_geometry.head_budgets` makes one.
    rank_by : "attention", "contribution", "random", "sink_window", or a mapping ``{(layer, head): name}``
        The order defining ``I_N`` (definitions §7); ``"random"`` draws a fresh seeded permutation per
        row (keyed by window, layer, head and query position). A mapping gives a head its own
        ranking (e.g. ``"sink_window"`` for StreamingLLM-style heads); heads not named rank by
        ``"attention"``.
    renormalize : bool, default False
        False: kept weights unchanged, the others zero; True: kept weights divided by their sum.
    layers, heads : None (all), an int or a list of ints
        The restricted layers and, in each of them, the restricted query heads (an int ``n`` only).
    seed : int
        Seed of ``"random"``.

    Yields
    ------
    :class:`TopNAttention` (its ``seq_ids`` may be set per batch, see there).

    Examples
    --------
    >>> import torch
    >>> from tl_geometry.testing import tiny_llama_bridge
    >>> model = tiny_llama_bridge()
    >>> tokens = torch.randint(3, 259, (1, 12))
    >>> with top_n_attention(model, n=2, rank_by="attention"):
    ...     restricted = model(tokens)
    >>> bool((model(tokens) != restricted).any())   # restored on exit
    True
    >>> with top_n_attention(model, n={(0, 1): 3, (1, 0): 2}, rank_by={(0, 1): "sink_window"}):
    ...     per_head = model(tokens)                 # two heads restricted, each its own way
    """
    seed = check_seed(seed)
    if not isinstance(renormalize, (bool,)):
        raise InputError(f"renormalize must be True or False, got {renormalize!r}")
    info = describe_model(model)
    budget = head_budget(info, n, layers, heads)
    rankings = head_rankings(info, rank_by)
    units = {
        layer: tuple(int(h) for h in torch.nonzero(budget[layer] > 0).flatten())
        for layer in range(info.n_layers)
        if bool((budget[layer] > 0).any())
    }
    with model_threads(model):  # the probe and the passes in the block run on the CPUs free now
        check_pattern_edits_honoured(model, info)
        state = TopNAttention(
            model=model,
            info=info,
            n=n,
            rank_by=rank_by,
            renormalize=renormalize,
            units=units,
            budget=budget,
            rankings=rankings,
            seed=seed,
        )
        state.attach()
        try:
            yield state
        finally:
            state.detach()


__all__ = [
    "TopNAttention",
    "check_head_key",
    "check_n",
    "check_pattern_edits_honoured",
    "head_budget",
    "head_rankings",
    "resolve_units",
    "top_n_attention",
]
