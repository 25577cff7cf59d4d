"""Attention patterns of a chosen text as a circuitsvis head grid, named and ordered by regime.

::

    heads = classify_heads(result)                          # regime per (layer, head), optional
    head_grid(model, "def f(x):\n    return x", heads)      # renders inline in a notebook
    html = head_grid_html(model, text, heads)               # self-contained fragment (no CDN)

The model runs once, hooked only where a chosen head is. Heads are named
``L{layer}H{head} · {regime}``. Details (HTML versions, no network): docs/figures.md.
"""

from __future__ import annotations

import html
import json
import math
import re
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from circuitsvis.attention import attention_heads
from circuitsvis.utils.render import RenderedHTML
from torch import Tensor

from tl_geometry.capture.hooks import StopForward, forward_with_hooks
from tl_geometry.errors import InputError, ModelError
from tl_geometry.models import describe_model, hook_pattern_name
from tl_geometry.plot.head_tiles import TILES_SCRIPT, TILES_STYLE, head_tiles, json_for_script
from tl_geometry.taxonomy.classify import ALL_LABELS


class _DefaultCap(int):
    """The default ``max_heads``: an int that remembers the caller did not choose it.

    Under this default :func:`head_grid` says above the grid how many heads it left out; a cap the
    caller passed (even 32) is taken as meant.
    """


#: Largest number of heads drawn by default. The page carries ``heads x tokens^2`` numbers and the
#: browser draws as many cells: 32 heads x 64 tokens take about 10 s to appear in a software-rendered
#: headless Chromium on 2 CPU cores (48 x 128: about 45 s).
DEFAULT_MAX_HEADS: int = _DefaultCap(32)
#: Longest text drawn by default; longer inputs are cut to their first ``max_tokens`` tokens.
DEFAULT_MAX_TOKENS = 128

_SEPARATOR = " · "
_SELF_CLOSED_DIV = re.compile(r'(<div id="circuits-vis-[0-9a-f-]+"[^>]*?)\s*/>')
#: circuitsvis' call at the end of its local HTML: ``CircuitsVis.render("<mount>", CircuitsVis.AttentionHeads,
#: {props})`` then ``</script>``.
_RENDER_CALL = re.compile(
    r'CircuitsVis\.render\(\s*"(?P<mount>circuits-vis-[0-9a-f-]+)",\s*CircuitsVis\.AttentionHeads,\s*'
    r"(?P<props>\{.*\})\s*\)\s*</script>\s*$",
    re.DOTALL,
)


class HeadGrid(RenderedHTML):
    """A circuitsvis ``attention_heads`` figure, with what was drawn.

    Renders inline in a notebook like any circuitsvis object. ``local_src`` holds the HTML with
    circuitsvis' JavaScript inlined; :meth:`fragment` wraps it for a page.

    Attributes
    ----------
    heads : DataFrame
        The heads drawn, in grid order: ``layer``, ``head``, ``regime`` (None without a heads
        table), ``name``.
    tokens : list of str
        The tokens of the text, as displayed.
    token_ids : list of int
    n_chosen : int
        The heads chosen before ``max_heads`` capped them (``len(heads)`` where none was left out).
    """

    def __init__(self, local_src: str, cdn_src: str, heads: pd.DataFrame, tokens: list[str], token_ids: list[int]):
        super().__init__(local_src, cdn_src)
        self.n_chosen = len(heads)
        self.heads = heads
        self.tokens = tokens
        self.token_ids = token_ids

    @property
    def names(self) -> list[str]:
        return list(self.heads["name"])

    def fragment(self) -> str:
        """A self-contained HTML fragment (circuitsvis' script inlined, nothing fetched)."""
        return _wrap_fragment(self.local_src, self.heads, len(self.tokens))

    def __repr__(self) -> str:
        return f"HeadGrid(heads={len(self.heads)}, tokens={len(self.tokens)})"


@dataclass(frozen=True)
class _Choice:
    layer: int
    head: int
    regime: str | None
    nearest: str | None = None


def head_grid(
    model: Any,
    text_or_tokens: str | Sequence[int] | Tensor,
    heads: pd.DataFrame | Iterable[tuple[int, int]] | None = None,
    *,
    layers: Sequence[int] | None = None,
    regimes: str | Sequence[str] | None = None,
    sort_by_regime: bool = True,
    max_heads: int | None = DEFAULT_MAX_HEADS,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    decimals: int = 4,
) -> HeadGrid:
    """Attention patterns of every chosen head on one text, as a circuitsvis ``attention_heads`` grid.

    Parameters
    ----------
    model : TransformerBridge or HookedTransformer
    text_or_tokens : str, list of int, or int tensor [pos] / [1, pos]
        A text is tokenised with the model's tokenizer (no special tokens) and, as
        :func:`tl_geometry.analyze` does, the model's BOS token is put first when it has one.
        Token ids are used as they are.
    heads : DataFrame, list of (layer, head), or None
        ``None``: every head of the chosen layers, named ``L{l}H{h}``. A heads table with columns
        ``layer, head, regime`` (:func:`tl_geometry.taxonomy.classify_heads`): its heads, named
        ``L{l}H{h} · regime``. A list of ``(layer, head)`` pairs: those heads.
    layers : list of int, optional
        Keep only heads of these layers.
    regimes : str or list of str, optional
        Keep only heads of these regimes (needs a heads table).
    sort_by_regime : bool, default True
        Order the grid by regime (the table's categorical order, else Retriever, Reset, Mixer,
        Unclassified), then layer and head. False: by layer and head.
    max_heads : int or None, default 32
        At most this many heads (None: no limit). When more are chosen, each regime keeps a share
        (taken in turn, regime by regime), within a regime the largest ``margin`` first when the
        table has one, else the lowest (layer, head). Under the default a line above the grid
        says how many were left out (``.n_chosen`` counts them all); a cap you pass is taken as
        meant.
    max_tokens : int or None, default 128
        Longer inputs are cut to their first ``max_tokens`` tokens (with a warning): the page
        carries ``heads x tokens^2`` numbers.
    decimals : int, default 4
        Attention weights are rounded to this many decimals in the page.

    Returns
    -------
    HeadGrid
        A circuitsvis ``RenderedHTML`` (shown inline by Jupyter) with ``.heads``, ``.tokens`` and
        :meth:`HeadGrid.fragment`.
    """
    info = describe_model(model)
    ids = _cut_tokens(_token_ids(model, text_or_tokens, info.bos_token_id, info.n_ctx), max_tokens)
    chosen, n_chosen = _choose_heads(heads, info.n_layers, info.n_heads, layers, regimes, sort_by_regime, max_heads)
    names = [_name(c) for c in chosen]
    tokens = _str_tokens(model, ids)
    rendered = _render(_patterns(model, ids, chosen), tokens, names, decimals)
    table = pd.DataFrame(
        {
            "layer": [c.layer for c in chosen],
            "head": [c.head for c in chosen],
            "regime": [c.regime for c in chosen],
            "regime_nearest": [c.nearest for c in chosen],
            "name": names,
        }
    )
    local_src = _make_safe(rendered.local_src, tokens, names)
    cdn_src = _make_safe(rendered.cdn_src, tokens, names)
    if n_chosen > len(chosen) and isinstance(max_heads, _DefaultCap):
        note = (
            f'<p class="tlg-head-grid-note">{len(chosen)} of the {n_chosen} heads chosen are shown: pass '
            "max_heads= to show more, or narrow them with layers= / regimes=</p>\n"
        )
        local_src, cdn_src = note + local_src, note + cdn_src
    grid = HeadGrid(local_src, cdn_src, table, tokens, ids)
    grid.n_chosen = n_chosen
    return grid


def _cut_tokens(ids: list[int], max_tokens: int | None) -> list[int]:
    """The first ``max_tokens`` ids (with a warning when that cuts the text)."""
    if max_tokens is None:
        return ids
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise InputError(f"max_tokens must be a positive integer or None, got {max_tokens!r}")
    if len(ids) > max_tokens:
        warnings.warn(
            f"the text has {len(ids)} tokens; the head grid shows its first {max_tokens} (pass max_tokens= to show more)",
            UserWarning,
            stacklevel=3,
        )
    return ids[:max_tokens]


def _render(patterns: Tensor, tokens: list[str], names: list[str], decimals: int) -> RenderedHTML:
    """circuitsvis' ``attention_heads`` of ``[heads, pos, pos]`` patterns rounded to ``decimals``."""
    attention = np.round(patterns.to(torch.float64).numpy(), decimals)
    return attention_heads(
        attention=attention.tolist(),
        tokens=tokens,
        attention_head_names=names,
        max_value=1.0,
        min_value=0.0,
        mask_upper_tri=True,
    )


def head_grid_html(
    model: Any,
    text_or_tokens: str | Sequence[int] | Tensor,
    heads: pd.DataFrame | Iterable[tuple[int, int]] | None = None,
    **kwargs: Any,
) -> str:
    """:func:`head_grid` as a self-contained HTML fragment (circuitsvis' script inlined, no CDN).

    Takes the same arguments as :func:`head_grid`. The fragment is a ``<div class="tlg-head-grid">``
    holding circuitsvis' mount point and an inline ``<script type="module">``; it can be written
    to a file (``tl-geometry run`` keeps it as ``head_grid.html``) and given to
    :func:`tl_geometry.report.build_report`.
    """
    return head_grid(model, text_or_tokens, heads, **kwargs).fragment()


# --------------------------------------------------------------------------------------------
# tokens


def _token_ids(model: Any, text_or_tokens: Any, bos: int | None, n_ctx: int) -> list[int]:
    if isinstance(text_or_tokens, str):
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise InputError("the model has no tokenizer: pass token ids instead of text")
        if not text_or_tokens.strip():
            raise InputError("the text is empty: give a text to draw the attention patterns of")
        ids = list(tokenizer(text_or_tokens, add_special_tokens=False)["input_ids"])
        if bos is not None:
            ids = [int(bos)] + ids
    else:
        if isinstance(text_or_tokens, Tensor):
            t = text_or_tokens.detach().cpu()
            if t.ndim == 2 and t.shape[0] == 1:
                t = t[0]
            if t.ndim != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
                raise InputError(
                    f"token ids must be an integer tensor [pos] or [1, pos], got {t.dtype} of shape {tuple(t.shape)}"
                )
            ids = [int(i) for i in t.tolist()]
        else:
            try:
                ids = [int(i) for i in text_or_tokens]
            except (TypeError, ValueError):
                raise InputError(
                    f"text_or_tokens must be a str, a list of token ids or an int tensor, got "
                    f"{type(text_or_tokens).__name__}"
                ) from None
        vocab = int(getattr(model.cfg, "d_vocab", 0) or 0)
        bad = [i for i in ids if i < 0 or (vocab and i >= vocab)]
        if bad:
            raise InputError(f"token ids {bad[:5]} are outside the model's vocabulary of {vocab}")
    if not ids:
        raise InputError("no tokens to draw: give a non-empty text or list of token ids")
    if len(ids) > n_ctx:
        warnings.warn(
            f"the text has {len(ids)} tokens, more than the model's context of {n_ctx}: the head grid uses the "
            f"first {n_ctx}",
            UserWarning,
            stacklevel=3,
        )
        ids = ids[:n_ctx]
    return ids


def _str_tokens(model: Any, ids: list[int]) -> list[str]:
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return [str(i) for i in ids]
    out = []
    for i in ids:
        try:
            out.append(tokenizer.decode([i]))
        except Exception:  # noqa: BLE001 - a tokenizer that cannot decode one id: show the id
            out.append(str(i))
    return out


def _make_safe(src: str, tokens: list[str], names: list[str]) -> str:
    """Make the props JSON safe inside a ``<script>``: ``<`` in strings becomes ``\\u003c``.

    circuitsvis writes ``json.dumps(props)`` into the script as it is, so a token such as
    ``</script>`` or ``<!--`` would end or derail the script. Every ``<`` of the page's props is in
    the tokens or the head names; their JSON is replaced by the escaped JSON (same JS value).
    """
    src = _SELF_CLOSED_DIV.sub(r"\1></div>", src, count=1)
    for value in (tokens, names):
        raw = json.dumps(value)
        if "<" not in raw:
            continue
        if raw not in src:  # pragma: no cover - circuitsvis changed its serialisation
            raise RuntimeError("cannot find the head grid's props in circuitsvis' HTML to escape them")
        src = src.replace(raw, raw.replace("<", "\\u003c"))
    return src


def _wrap_fragment(local_src: str, heads: pd.DataFrame, n_tokens: int) -> str:
    """The report's fragment: the props as JSON once (circuitsvis renders from them), the tiles'
    data, their container, style and script (:mod:`tl_geometry.plot.head_tiles`), circuitsvis."""
    opening = re.findall(r"<(?:script|link)\b[^>]*>", local_src, flags=re.IGNORECASE)
    remote = [t for t in opening if re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", t, flags=re.IGNORECASE)]
    remote += re.findall(r"""\b(?:from|import)\s*\(?\s*["'](?:https?:)?//[^"']*""", local_src, flags=re.IGNORECASE)
    if remote:  # pragma: no cover - circuitsvis' local HTML inlines its bundle
        raise RuntimeError(f"circuitsvis' local HTML loads a remote script ({remote[0]!r}); refusing to embed it")
    call = _RENDER_CALL.search(local_src)
    if call is None:  # pragma: no cover - circuitsvis changed its render call
        raise RuntimeError("cannot find circuitsvis' render call in its HTML to feed it the head grid's data")
    mount = call.group("mount")
    props = json_for_script(json.loads(call.group("props")))
    circuitsvis = (
        local_src[: call.start()]
        + f'CircuitsVis.render("{mount}", CircuitsVis.AttentionHeads, '
        + f'JSON.parse(document.getElementById("{mount}-data").textContent))\n</script>'
    )
    regimes = sorted({str(r) for r in heads["regime"] if r is not None})
    attrs = (
        f'class="tlg-head-grid" data-heads="{len(heads)}" data-tokens="{n_tokens}"'
        f' data-regimes="{html.escape(",".join(regimes))}"'
    )
    return (
        f"<div {attrs}>\n<style>{TILES_STYLE}</style>\n"
        f'<script type="application/json" id="{mount}-data" class="tlg-head-grid-data">{props}</script>\n'
        f'<script type="application/json" class="tlg-head-tiles-data">{json_for_script(head_tiles(heads))}</script>\n'
        f'<div class="tlg-head-tiles" role="group" aria-label="heads: click one to enlarge it"></div>\n'
        f"<script>{TILES_SCRIPT}</script>\n{circuitsvis}\n</div>\n"
    )


# --------------------------------------------------------------------------------------------
# heads


def _choose_heads(
    heads: Any,
    n_layers: int,
    n_heads: int,
    layers: Sequence[int] | None,
    regimes: str | Sequence[str] | None,
    sort_by_regime: bool,
    max_heads: int | None,
) -> tuple[list[_Choice], int]:
    """The heads to draw, in grid order (read the table, check, filter, cap, sort), and how many
    were chosen before the cap."""
    table, order, margin = _heads_table(heads, n_layers, n_heads)
    table = _filter_heads(table, order, n_layers, layers, regimes)
    has_regimes = table["regime"].notna().any()
    choices = [
        _Choice(
            int(r.layer),
            int(r.head),
            None if r.regime is None else str(r.regime),
            None if r.regime_nearest is None else str(r.regime_nearest),
        )
        for r in table.itertuples(index=False)
    ]

    def rank(regime: str | None) -> tuple[int, str]:
        if regime is None:
            return (len(order) + 1, "")
        return (order.index(regime), "") if regime in order else (len(order), regime)

    n_chosen = len(choices)
    if max_heads is not None:
        if not isinstance(max_heads, int) or max_heads < 1:
            raise InputError(f"max_heads must be a positive integer or None, got {max_heads!r}")
        if len(choices) > max_heads:
            choices = _cap(choices, max_heads, margin, rank)
    if sort_by_regime and has_regimes:
        choices.sort(key=lambda c: (rank(c.regime), c.layer, c.head))
    else:
        choices.sort(key=lambda c: (c.layer, c.head))
    return choices, n_chosen


def _labels_or_none(column: pd.Series) -> pd.Series:
    return column.astype(object).where(column.notna(), None)


def _heads_table(heads: Any, n_layers: int, n_heads: int) -> tuple[pd.DataFrame, list[str], dict]:
    """``layer, head, regime, regime_nearest`` of every head named by ``heads``, the regime order
    and the margins; heads that do not exist are an :class:`InputError`."""
    order: list[str] = list(ALL_LABELS)  # classify_heads' categories; a categorical column's own order wins
    margin: dict[tuple[int, int], float] = {}
    if heads is None:
        table = pd.DataFrame(
            [(layer, head) for layer in range(n_layers) for head in range(n_heads)], columns=["layer", "head"]
        )
    elif isinstance(heads, pd.DataFrame):
        missing = {"layer", "head"} - set(heads.columns)
        if missing:
            raise InputError(
                f"the heads table lacks the columns {sorted(missing)}: pass "
                "tl_geometry.taxonomy.classify_heads(result) "
                "or a DataFrame with layer, head and regime"
            )
        if "query_pos" in heads.columns and heads["query_pos"].nunique() > 1:
            raise InputError(
                "the heads table holds several query positions: classify one (classify_heads(result, query_pos=...))"
            )
        table = heads.copy()
        if "regime" in table.columns and isinstance(table["regime"].dtype, pd.CategoricalDtype):
            order = [str(c) for c in table["regime"].cat.categories]
        if "margin" in table.columns:
            margin = {
                (int(r.layer), int(r.head)): float(r.margin)
                for r in table[["layer", "head", "margin"]].itertuples(index=False)
                if r.margin is not None and not (isinstance(r.margin, float) and math.isnan(r.margin))
            }
    else:
        try:
            pairs = [(int(a), int(b)) for a, b in heads]
        except (TypeError, ValueError):
            raise InputError(
                "heads must be a heads table (DataFrame), a list of (layer, head) pairs or None, "
                f"got {type(heads).__name__}"
            ) from None
        table = pd.DataFrame(pairs, columns=["layer", "head"])
    for column in ("regime", "regime_nearest"):
        table[column] = _labels_or_none(table[column]) if column in table.columns else None
    table = table[["layer", "head", "regime", "regime_nearest"]].drop_duplicates(["layer", "head"])
    bad = table[(table.layer < 0) | (table.layer >= n_layers) | (table["head"] < 0) | (table["head"] >= n_heads)]
    if len(bad):
        raise InputError(
            f"heads {list(zip(bad.layer, bad['head']))[:5]} do not exist: the model has layers 0..{n_layers - 1} "
            f"and heads 0..{n_heads - 1}"
        )
    return table, order, margin


def _filter_heads(
    table: pd.DataFrame, order: list[str], n_layers: int, layers: Sequence[int] | None, regimes: Any
) -> pd.DataFrame:
    """The rows of ``layers`` and ``regimes``; an empty result is an :class:`InputError`."""
    if layers is not None:
        wanted = {int(layer) for layer in layers}
        missing_layers = sorted(x for x in wanted if not 0 <= x < n_layers)
        if missing_layers:
            raise InputError(f"layers {missing_layers} do not exist: the model has layers 0..{n_layers - 1}")
        table = table[table.layer.isin(wanted)]
    if regimes is not None:
        keep = [regimes] if isinstance(regimes, str) else [str(r) for r in regimes]
        if not table["regime"].notna().any():
            raise InputError(
                "regimes= needs a heads table with a regime column: "
                "pass heads=tl_geometry.taxonomy.classify_heads(result)"
            )
        unknown = sorted(set(keep) - set(order) - set(table["regime"].dropna().astype(str)))
        if unknown:
            raise InputError(f"unknown regimes {unknown}: the heads table has {sorted(set(order))}")
        table = table[table["regime"].isin(keep)]
    if table.empty:
        raise InputError("no head is left to draw after the layers= / regimes= filters")
    return table


def _cap(choices: list[_Choice], max_heads: int, margin: dict, rank) -> list[_Choice]:
    """Keep ``max_heads`` heads, regimes taking turns; within one, largest margin first."""
    groups: dict[Any, list[_Choice]] = {}
    for c in choices:
        groups.setdefault(c.regime, []).append(c)
    for members in groups.values():
        members.sort(key=lambda c: (-margin.get((c.layer, c.head), 0.0), c.layer, c.head))
    queues = [groups[k] for k in sorted(groups, key=rank)]
    kept: list[_Choice] = []
    i = 0
    while len(kept) < max_heads:
        if all(i >= len(q) for q in queues):
            break
        for q in queues:
            if i < len(q) and len(kept) < max_heads:
                kept.append(q[i])
        i += 1
    return kept


def _name(c: _Choice) -> str:
    """``L{layer}H{head} · regime``, with ``(nearest: X)`` where the nearest label differs."""
    base = f"L{c.layer}H{c.head}"
    if c.regime is None:
        return base
    name = f"{base}{_SEPARATOR}{c.regime}"
    return name if c.nearest is None or c.nearest == c.regime else f"{name} (nearest: {c.nearest})"


# --------------------------------------------------------------------------------------------
# the forward pass


def _patterns(model: Any, ids: list[int], chosen: list[_Choice]) -> Tensor:
    """``[len(chosen), pos, pos]`` attention patterns (float32, CPU), one forward pass."""
    by_layer: dict[int, list[int]] = {}
    for c in chosen:
        by_layer.setdefault(c.layer, []).append(c.head)
    last = max(by_layer)
    got: dict[int, Tensor] = {}

    def make_hook(layer: int):
        index = torch.tensor(sorted(set(by_layer[layer])), dtype=torch.int64)

        def hook(pattern: Tensor, hook: Any) -> None:
            got[layer] = pattern.detach()[0].index_select(0, index.to(pattern.device)).float().cpu()
            if layer == last and len(got) == len(by_layer):
                raise StopForward

        return hook, index

    hooks, index_of = [], {}
    for layer in sorted(by_layer):
        fn, index = make_hook(layer)
        hooks.append((hook_pattern_name(layer), fn))
        index_of[layer] = {int(h): i for i, h in enumerate(index.tolist())}
    forward_with_hooks(model, torch.tensor([ids], dtype=torch.int64), hooks)
    silent = sorted(set(by_layer) - set(got))
    if silent:
        raise ModelError(
            f"layers {silent[:6]} did not fire hook_pattern: the model's attention does not expose its pattern "
            "(boot the model with an eager attention implementation)"
        )
    return torch.stack([got[c.layer][index_of[c.layer][c.head]] for c in chosen])
