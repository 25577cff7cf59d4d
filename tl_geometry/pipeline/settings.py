"""``AnalysisSettings``: every setting of :func:`tl_geometry.analyze`, checked once, before any work.

One frozen dataclass holds what ``analyze`` measures and how: the selection sizes, the query
positions, the layers, the precision, and which of the optional analyses run. Building it checks
and normalises every field (numpy integers become ints, lists become sorted tuples without
duplicates, ``None`` for ``ns`` becomes ``"all"``) and raises one :class:`~tl_geometry.errors.InputError`
naming the setting and the fix, before a model is loaded or run. The command line builds it from
its options, ``analyze`` from its keywords; the run store compares it to resume, and ``run.json``
records it (:meth:`AnalysisSettings.to_dict` / :meth:`AnalysisSettings.from_dict`).

What depends on the model or the corpus (layers that exist, positions inside the window, ``N``
at most ``K``) is checked by :meth:`AnalysisSettings.resolve` once those are known, still before
the first forward pass.

Each setting is written once, as one field with a default and ``metadata=setting(check, ...)``:
``check`` turns any accepted input (the Python value or its JSON form from :meth:`to_dict`) into
the normalised value or raises :class:`InputError`; ``encode`` (default: the value itself) gives
the JSON form; ``identity=False`` marks a setting that does not change the results (it is not
compared when resuming); ``needs="bounds"`` marks one that matters only when that switch is on;
``type`` and ``doc`` are its documentation (the ``Parameters`` of this class and of ``analyze``
are generated from them); ``cli`` is its ``tl-geometry run`` option (a :class:`CliForm`), or the
reason it has none. :data:`CLI_PRESET` holds the defaults of the command line.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Mapping, Sequence, get_type_hints

from tl_geometry.core.ranking_checks import (
    DEFAULT_N_RANDOM,
    DISTANCES,
    RANKINGS,
    check_distance,
    check_n_random,
    check_rankings,
    check_seed,
)
from tl_geometry.core.size_names import DEFAULT_NS
from tl_geometry.errors import InputError
from tl_geometry.pipeline.setting_checks import (
    KERNELS,
    QUERY_WORDS,
    check_dtype,
    check_k_max,
    check_kappa,
    check_kernel,
    check_layers,
    check_ns,
    check_query_positions,
    check_rho,
    encode_ints,
    encode_query_positions,
    encode_rho,
    flag,
    positive_int,
)


@dataclass(frozen=True)
class CliForm:
    """How a setting is written as an option of ``tl-geometry run``.

    A boolean setting is a switch: ``--flag`` turns it on, ``--no-flag`` off. Any other setting
    takes one word of text: a ``type`` value, one of ``words``, or (``comma=True``) a comma list
    of ``type`` values.

    Parameters
    ----------
    flag : str, optional
        The option (default: ``--`` and the setting's name with ``-`` for ``_``).
    type : callable, default str
        Text -> one value (``int``, ``float`` or ``str``); argparse applies it unless ``comma``.
    comma : bool, default False
        The text is a comma-separated list of ``type`` values (or one of ``words``).
    words : tuple of str, default ()
        Words accepted as they are instead of a list.
    choices : tuple of str, optional
        The only texts accepted (argparse refuses any other).
    syntax : str, optional
        What the text may be, for the help (default: generated from the above).
    stride : str, optional
        A second option taking an integer ``K`` that sets the setting to every ``K``-th position,
        ``slice(K - 1, None, K)`` (only ``query_positions`` has one: ``--query-stride``).
    """

    flag: str | None = None
    type: Callable[[str], Any] = str
    comma: bool = False
    words: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    syntax: str | None = None
    stride: str | None = None

    def describe(self) -> str:
        """What the option's text may be (for the help)."""
        if self.syntax is not None:
            return self.syntax
        if self.choices:
            return " or ".join(repr(c) for c in self.choices)
        kind = {int: "integer", float: "number"}.get(self.type, "name")  # type: ignore[call-overload]
        one = f"a comma list of {kind}s" if self.comma else f"an {kind}" if kind == "integer" else f"a {kind}"
        return f"{', '.join(repr(w) for w in self.words)} or {one}" if self.words else one


def setting(
    check: Callable[[Any], Any],
    encode: Callable[[Any], Any] | None = None,
    *,
    type: str,
    doc: str,
    cli: CliForm | str,
    identity: bool = True,
    needs: str | None = None,
) -> dict[str, Any]:
    """Field metadata of an :class:`AnalysisSettings` field (see the module docstring).

    Parameters
    ----------
    check : callable
        Input value -> normalised value; raises :class:`InputError` on a bad value.
    encode : callable, optional
        Normalised value -> its JSON form (default: unchanged). ``check`` must accept that form.
    type : str
        The numpydoc type of the setting (what ``analyze`` accepts), without the default.
    doc : str
        What the setting does: a first sentence (also the command line's help), then details.
    cli : CliForm or str
        The setting's ``tl-geometry run`` option, or why it has none.
    identity : bool, default True
        Whether the setting changes the results (compared when a saved run is resumed).
    needs : str, optional
        Name of a boolean setting without which this one has no effect (not compared then).
    """
    return {
        "check": check,
        "encode": encode or (lambda v: v),
        "identity": identity,
        "needs": needs,
        "type": type,
        "doc": doc,
        "cli": cli,
    }


# ----------------------------------------------------------------------------- the settings


@dataclass(frozen=True)
class AnalysisSettings:
    """Every setting of :func:`tl_geometry.analyze`, checked and normalised at construction.

    Parameters
    ----------
    {settings}

    Examples
    --------
    >>> s = AnalysisSettings(ns=[4, 1, 2, 2], layers=1, kappa=2)
    >>> s.ns, s.layers, s.kappa
    ((1, 2, 4), (1,), 2.0)
    >>> AnalysisSettings.from_dict(s.to_dict()) == s
    True
    >>> s.differences(AnalysisSettings(ns=[1, 2, 4], layers=[1], batch_size=8))
    []
    >>> s.differences(AnalysisSettings(ns="log", layers=[1]))
    ['ns ([1, 2, 4] vs log)']
    >>> s.replace(ns=[8]).ns, s.replace(ns=[8]).kappa
    ((8,), 2.0)
    """

    #: The words ``query_positions`` accepts besides positions.
    QUERY_WORDS = QUERY_WORDS

    ns: Any = field(
        default=DEFAULT_NS,
        metadata=setting(
            check_ns,
            encode_ints,
            type='None, "all", "log" or list of int',
            doc='Selection sizes N. ``"log"`` is a log-spaced grid (every ``N <= 8``, then 4 per doubling, '
            'and ``N = K``); None or ``"all"`` is every ``N`` from 1 to ``K``; a list is sorted and '
            "de-duplicated.",
            cli=CliForm(type=int, comma=True, words=("log", "all")),
        ),
    )
    query_positions: Any = field(
        default="last",
        metadata=setting(
            check_query_positions,
            encode_query_positions,
            type='"last", "all", int, list of int, range or slice',
            doc='Query positions to analyse. ``"all"`` is every position; a ``range(start, stop, stride)`` '
            "or ``slice(stride - 1, None, stride)`` takes every ``stride``-th; negative positions count "
            "from the end of the window; a list is sorted and de-duplicated.",
            cli=CliForm(flag="--query", type=int, comma=True, words=QUERY_WORDS, stride="--query-stride"),
        ),
    )
    layers: Any = field(
        default=None,
        metadata=setting(
            check_layers,
            encode_ints,
            type="list of int or int",
            doc="Layers to analyse (default all). The forward pass stops after the last one; the list is "
            "sorted and de-duplicated.",
            cli="the command line analyses every layer (its report shows them all)",
        ),
    )
    batch_size: int = field(
        default=4,
        metadata=setting(
            positive_int("batch_size"),
            identity=False,
            type="int",
            doc="Windows per forward pass. Results do not depend on it.",
            cli=CliForm(type=int),
        ),
    )
    dtype: Any = field(
        default="float64",  # checked into torch.float64; a name here keeps torch out of the parser
        metadata=setting(
            check_dtype,
            str,
            type='torch.float64, torch.float32 or their names "float64", "float32"',
            doc="Precision of the envelopes and the taxonomy's features (the model itself may run in any dtype). "
            "Separability's counts and radii are those of float64 distances whatever it is: both of its "
            "engines screen in float32 and decide near ties in float64.",
            cli=CliForm(flag="--analysis-dtype", choices=("float64", "float32")),
        ),
    )
    kernel: str = field(
        default="auto",
        metadata=setting(
            check_kernel,
            identity=False,
            type=" or ".join(f'"{k}"' for k in KERNELS),
            doc='Which separability route runs (tl_geometry.core.engine.dispatch). ``"auto"`` takes the compiled numba '
            'screen on the CPU where numba is installed, else the batched tensor route; ``"numba"`` insists on '
            'the compiled screen; ``"torch"`` takes the batched route (what a GPU always runs). The counts are '
            "the same and the radii equal to rounding.",
            cli=CliForm(choices=KERNELS),
        ),
    )
    diagnostics: bool = field(
        default=False,
        metadata=setting(
            flag("diagnostics"),
            type="bool",
            doc="Also accumulate the assumption diagnostics. Those of definitions §3 (value norms and the sink, "
            "similarity decay, the attention-weight profile of the largest query position) go into "
            "``result.value_norms``, ``result.similarity``, ``result.attention_profile`` and their curves "
            "(see :mod:`tl_geometry.diagnostics`).",
            cli=CliForm(),
        ),
    )
    k_max: int | None = field(
        default=64,
        metadata=setting(
            check_k_max,
            needs="diagnostics",
            type="int or None",
            doc="Largest lag of the cosine-by-lag curve c(k). Used with ``diagnostics=True``.",
            cli=CliForm(type=int),
        ),
    )
    taxonomy: bool = field(
        default=True,
        metadata=setting(
            flag("taxonomy"),
            type="bool",
            doc="Also accumulate the regime features of every head. The definitions §5 features (mean and std "
            "over sequences, per ``N``) go into ``result.regime_features``; then ``result.sink_effect()`` "
            "and ``result.classify_heads()`` (see :mod:`tl_geometry.taxonomy`).",
            cli="the command line always accumulates them: its report classifies the heads",
        ),
    )
    bounds: bool = field(
        default=False,
        metadata=setting(
            flag("bounds"),
            type="bool",
            doc="Also compute the theoretical envelopes. Those of Theorems 1-2 and Corollary 1 (definitions §4), "
            "for every row: their columns (``precision_lower``, ``precision_upper``, ``recall_lower``, "
            "``recall_upper``, the four ``f_*`` bounds, ``delta``, ``delta0``, ``scale``) join "
            "``result.separability``; compare with :meth:`AnalysisResult.envelopes`. Needs "
            '``"attention"`` in ``rank_by``.',
            cli=CliForm(),
        ),
    )
    kappa: float = field(
        default=0.5,
        metadata=setting(
            check_kappa,
            needs="bounds",
            type="float",
            doc="The bounds' concentration constant. The theorems' unnamed constant, positive and finite "
            "(used with ``bounds=True``).",
            cli=CliForm(type=float),
        ),
    )
    rho: Any = field(
        default="measured",
        metadata=setting(
            check_rho,
            encode_rho,
            needs="bounds",
            type='"measured", SimilarityModel or ("model", beta, rho_0)',
            doc="Source of the cosines in the bounds. The values' own cosines, or the assumption model "
            "``exp(-beta |j-k|)`` with ``rho_0`` to the sink (see :func:`tl_geometry.theory.bounds.bounds`); "
            "used with ``bounds=True``.",
            cli="the command line uses the measured cosines (an assumption model is set from Python)",
        ),
    )
    rank_by: Any = field(
        default=("attention",),
        metadata=setting(
            check_rankings,
            list,
            type="str or sequence of str",
            doc="Rankings that define the top-N set. One block of rows each in ``result.separability`` "
            '(column ``rank_by``; definitions §7): ``"attention"`` (definitions §2), ``"contribution"`` '
            '(``alpha_i ||v_i||``), ``"random"`` (the control: ``n_random`` uniform permutations per row, '
            'each measured around its own ``s(N)``, averaged) and ``"sink_window"`` (the sink and the '
            "most recent keys); duplicates dropped, order kept. Everything that reads one ranking "
            "(taxonomy, bounds, figures, report) reads the attention rows.",
            cli=CliForm(comma=True, syntax="a comma list of " + ", ".join(RANKINGS)),
        ),
    )
    distance: str = field(
        default="euclidean",
        metadata=setting(
            check_distance,
            type=" or ".join(f'"{d}"' for d in DISTANCES),
            doc="Distance of the balls. Definitions §7.",
            cli=CliForm(syntax=" or ".join(repr(d) for d in DISTANCES)),
        ),
    )
    n_random: int = field(
        default=DEFAULT_N_RANDOM,
        metadata=setting(
            check_n_random,
            needs="random_control",
            type="int",
            doc='Random draws per row of the random control. Used with ``"random"`` in ``rank_by``.',
            cli=CliForm(type=int),
        ),
    )
    seed: int = field(
        default=0,
        metadata=setting(
            check_seed,
            needs="random_control",
            type="int",
            doc="Seed of the random control. A row's draws are keyed by (seq, layer, head, query_pos), so they "
            "do not depend on ``batch_size`` or on resuming.",
            cli=CliForm(type=int),
        ),
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, f.metadata["check"](getattr(self, f.name)))
        if self.bounds and "attention" not in self.rank_by:
            raise InputError(
                f"bounds=True needs rank_by to include 'attention' (the bounds are for attention selection), "
                f"got rank_by={list(self.rank_by)}"
            )

    @property
    def random_control(self) -> bool:
        """Whether ``rank_by`` holds the random control (then ``n_random`` and ``seed`` matter)."""
        return "random" in self.rank_by

    def replace(self, **overrides: Any) -> "AnalysisSettings":
        """These settings with the fields named in ``overrides`` replaced (and checked).

        An unknown name raises :class:`InputError` naming it and the known settings.
        """
        check_names(overrides)
        return replace(self, **overrides)

    # ------------------------------------------------------------------ JSON form
    def to_dict(self) -> dict[str, Any]:
        """Every setting in its JSON form (``json.dumps``-able); :meth:`from_dict` reads it back."""
        return {f.name: f.metadata["encode"](getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AnalysisSettings":
        """Settings from :meth:`to_dict` (missing keys take their defaults; unknown keys are an error)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"unknown analysis settings {unknown}; known: {sorted(known)}")
        return cls(**dict(data))

    # ------------------------------------------------------------------ comparing runs
    def identity(self) -> dict[str, Any]:
        """The JSON form of the settings that change the results (what a resumed run must share)."""
        out = {}
        for f in fields(self):
            needs = f.metadata["needs"]
            if f.metadata["identity"] and (needs is None or getattr(self, needs)):
                out[f.name] = f.metadata["encode"](getattr(self, f.name))
        return out

    def differences(self, other: "AnalysisSettings | Mapping[str, Any]") -> list[str]:
        """``"name (mine vs theirs)"`` for every result-changing setting that differs from ``other``."""
        from tl_geometry.io.store import describe_differences

        theirs = other.identity() if isinstance(other, AnalysisSettings) else dict(other)
        return describe_differences(self.identity(), theirs)

    # ------------------------------------------------------------------ against a model and corpus
    def resolve(
        self, n_layers: int, seq_len: int, sliding_windows: Sequence[int | None] = ()
    ) -> tuple[list[int], tuple[int, ...]]:
        """The layers and query positions for a model of ``n_layers`` layers and windows of ``seq_len``.

        Checks that the layers exist, the positions lie inside the window and every ``N`` fits the
        rows of the last position (``N <= q + 1``; a shorter row uses ``min(N, q + 1)``,
        :func:`tl_geometry.core.sizes.clip_ns`), and ``N <= W`` on a layer with a sliding window of
        ``W`` keys (``ModelInfo.sliding_windows``); raises :class:`InputError` otherwise.
        """
        from tl_geometry.core.layouts import resolve_query_positions
        from tl_geometry.core.sizes import clip_ns, resolve_ns

        layers = list(range(n_layers)) if self.layers is None else list(self.layers)
        bad = [layer for layer in layers if layer >= n_layers]
        if bad:
            raise InputError(f"layers {bad} do not exist: the model has layers 0..{n_layers - 1}")
        queries = resolve_query_positions(self.query_positions, seq_len)
        resolve_ns(self.ns, max(queries) + 1)  # a size no query's row holds is refused
        for q in queries:
            resolve_ns(clip_ns(self.ns, q + 1), q + 1)
        windows = {sliding_windows[layer] for layer in layers if sliding_windows and sliding_windows[layer]}
        if windows and queries:
            window = min(w for w in windows if w is not None)
            try:
                resolve_ns(self.ns, min(max(queries) + 1, window))
            except InputError as exc:
                raise InputError(
                    f"{exc}: a query of a sliding-window layer sees at most {window} keys "
                    f"(layers {[layer for layer in layers if sliding_windows[layer] == window]})"
                ) from None
        return layers, queries


# ----------------------------------------------------------------------------- one source per setting


def check_names(overrides: Mapping[str, Any]) -> None:
    """Raise :class:`InputError` if a name in ``overrides`` is not a setting (naming it and the known ones)."""
    known = [f.name for f in fields(AnalysisSettings)]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise InputError(f"unknown analysis setting(s) {unknown}; the settings are {known}")


def combine_settings(settings: Any, overrides: Mapping[str, Any], call: str) -> AnalysisSettings:
    """``settings`` (default ``AnalysisSettings()``) with the keywords ``overrides`` replaced and checked.

    ``call`` shows how the keywords are given (``"analyze(model, corpus, ns=...)"``) in the error
    raised when ``settings`` is not an :class:`AnalysisSettings`.
    """
    if settings is None:
        settings = AnalysisSettings()
    elif not isinstance(settings, AnalysisSettings):
        raise InputError(
            f"settings must be an AnalysisSettings, got {type(settings).__name__}: give the settings as "
            f"keywords ({call}) or as AnalysisSettings(...)"
        )
    return settings.replace(**overrides) if overrides else settings


def cli_flag(f: Any) -> str | None:
    """The ``tl-geometry run`` option of the setting ``f`` (a dataclass field), or None if it has none."""
    form = f.metadata["cli"]
    if not isinstance(form, CliForm):
        return None
    return form.flag or "--" + f.name.replace("_", "-")


def cli_text(value: Any) -> str:
    """A normalised setting value as command-line text (``("attention", "random")`` -> ``attention,random``)."""
    if type(value).__module__ == "torch":  # a dtype (torch itself is not imported for the parser)
        return str(value).removeprefix("torch.")
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _python_text(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        inner = ", ".join(_python_text(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


def _cli_line(f: Any) -> str:
    form, flag = f.metadata["cli"], cli_flag(f)
    if not isinstance(form, CliForm) or flag is None:
        return f"No ``tl-geometry run`` option: {form}."
    value = cli_default(f)
    if isinstance(f.default, bool):
        return f"``tl-geometry run``: ``{flag}`` / ``--no-{flag[2:]}`` (default {cli_text(value)})."
    also = f" or ``{form.stride} K``" if form.stride else ""
    return f"``tl-geometry run``: ``{flag}``{also} (default ``{cli_text(value)}``)."


def settings_parameters(indent: str = "    ") -> str:
    """The numpydoc ``Parameters`` entries of every setting (for :class:`AnalysisSettings` and ``analyze``)."""
    entries = []
    for f in fields(AnalysisSettings):
        default = "optional" if f.default is None else f"default {_python_text(f.default)}"
        body = f"{f.metadata['doc']} {_cli_line(f)}"
        wrapped = textwrap.fill(
            body,
            width=100,
            initial_indent=indent + "    ",
            subsequent_indent=indent + "    ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        entries.append(f"{indent}{f.name} : {f.metadata['type']}, {default}\n{wrapped}")
    return "\n".join(entries).lstrip()


def fill_settings_doc(doc: str | None, indent: str = "    ") -> str | None:
    """``doc`` with its ``{settings}`` line replaced by :func:`settings_parameters` (None stays None, as under -OO)."""
    return None if doc is None else doc.replace("{settings}", settings_parameters(indent))


def settings_parameters_signature() -> list[inspect.Parameter]:
    """Every setting as a keyword-only :class:`inspect.Parameter` with its default (for ``analyze.__signature__``)."""
    hints = get_type_hints(AnalysisSettings)
    return [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
        for f in fields(AnalysisSettings)
    ]


def signature_with_settings(fn: Callable) -> inspect.Signature:
    """``fn``'s signature with every setting as a keyword and its default (in place of ``**overrides``),
    for ``help`` and IDEs."""
    signature = inspect.signature(fn, eval_str=True)
    own = list(signature.parameters.values())
    positional = [p for p in own if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    keywords = [p for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return signature.replace(parameters=[*positional, *settings_parameters_signature(), *keywords])


#: Where ``tl-geometry run``'s defaults differ from ``analyze``'s (normalised values): ``analyze``
#: defaults to the cheapest measurement (attention alone), for notebooks that ask for more; the
#: command line runs the full study in one go because its report shows all of it: the random
#: control next to attention, the assumption diagnostics and the theorems' envelopes.
CLI_CHANGES: dict[str, Any] = {"rank_by": ("attention", "random"), "diagnostics": True, "bounds": True}

#: The settings ``tl-geometry run`` starts from (its options' defaults): ``AnalysisSettings()`` with
#: :data:`CLI_CHANGES`. Built on first use (building settings imports torch).
CLI_PRESET: AnalysisSettings


def cli_default(f: Any) -> Any:
    """The value of the setting ``f`` (a dataclass field) in :data:`CLI_PRESET`, without building it (no torch)."""
    return CLI_CHANGES.get(f.name, f.default)


def __getattr__(name: str) -> Any:
    if name == "CLI_PRESET":
        preset = AnalysisSettings(**CLI_CHANGES)
        globals()[name] = preset
        return preset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


AnalysisSettings.__doc__ = fill_settings_doc(AnalysisSettings.__doc__)

__all__ = [
    "AnalysisSettings",
    "CLI_CHANGES",
    "CLI_PRESET",
    "CliForm",
    "check_names",
    "cli_default",
    "combine_settings",
    "cli_flag",
    "cli_text",
    "fill_settings_doc",
    "setting",
    "settings_parameters",
    "settings_parameters_signature",
    "signature_with_settings",
]
