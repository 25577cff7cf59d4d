"""One source per setting: AnalysisSettings' metadata makes analyze's docs and signature and run's options.

Every field of :class:`AnalysisSettings` must reach ``analyze.__doc__``, ``inspect.signature(analyze)``
and ``tl-geometry run --help`` (or say it has no option); ``tl-geometry run`` with no options must
give exactly :data:`CLI_PRESET`; ``analyze(settings=s, **overrides)`` must replace only the
overridden fields, and refuse an unknown one before a model is loaded.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from dataclasses import fields

import pytest
import torch

import tl_geometry as tlg
import tl_geometry.pipeline.analysis
import tl_geometry.pipeline.plan
from tl_geometry.cli.app import build_parser, main
from tl_geometry.cli.run import settings_from_args
from tl_geometry.errors import InputError
from tl_geometry.pipeline.settings import CLI_PRESET, AnalysisSettings, CliForm, cli_flag, cli_text

FIELDS = fields(AnalysisSettings)
NAMES = [f.name for f in FIELDS]
TEXT = ["The quick brown fox jumps over the lazy dog. " * 12, "Attention is a weighting of values. " * 10]

#: The settings `make run` (`tl-geometry run --force`, no options) recorded in run.json before the
#: settings had one source: the preset must keep producing exactly these.
MAKE_RUN_SETTINGS = {
    "ns": "log",
    "query_positions": "last",
    "layers": None,
    "batch_size": 4,
    "dtype": "torch.float64",
    "kernel": "auto",
    "diagnostics": True,
    "k_max": 64,
    "taxonomy": True,
    "bounds": True,
    "kappa": 0.5,
    "rho": "measured",
    "rank_by": ["attention", "random"],
    "distance": "euclidean",
    "n_random": 16,
    "seed": 0,
}


def no_loading(monkeypatch) -> None:
    """Fail the test if a model is loaded by name (analyze) or by the command line."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(tl_geometry.pipeline.plan, "load_model", refuse)
    monkeypatch.setattr(tlg, "load_model", refuse)


@pytest.fixture()
def run_help(monkeypatch, capsys) -> str:
    monkeypatch.setenv("COLUMNS", "400")  # one line per option
    with pytest.raises(SystemExit) as stop:
        main(["run", "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


# ----------------------------------------------------------------------------- documentation and signature


@pytest.mark.parametrize("doc_of", [tlg.analyze, AnalysisSettings], ids=["analyze", "AnalysisSettings"])
def test_every_setting_is_documented_once_with_its_default(doc_of) -> None:
    doc = doc_of.__doc__
    assert "{settings}" not in doc
    for f in FIELDS:
        entries = re.findall(rf"^    {f.name} : (.*)$", doc, flags=re.MULTILINE)
        assert len(entries) == 1, f"{f.name} is documented {len(entries)} times"
        assert entries[0].startswith(f.metadata["type"])
        assert entries[0].endswith("optional" if f.default is None else "default " + _python(f.default))


def _python(value) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "(" + ", ".join(_python(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def test_analyze_docs_list_the_settings_between_corpus_and_out_dir() -> None:
    names = re.findall(r"^    (\w+) : ", tlg.analyze.__doc__, flags=re.MULTILINE)
    assert names == ["model", "corpus", "settings", *NAMES, "out_dir", "resume", "progress", "device"]


def test_the_signature_shows_every_setting_with_its_default() -> None:
    params = inspect.signature(tlg.analyze).parameters
    assert list(params) == ["model", "corpus", "settings", *NAMES, "out_dir", "resume", "progress", "device"]
    for f in FIELDS:
        assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[f.name].default == f.default and type(params[f.name].default) is type(f.default)
    assert params["settings"].default is None
    assert "**" not in str(inspect.signature(tlg.analyze))


def option_help(run_help: str, flag: str) -> str:
    """The help of ``flag`` in ``run_help``, its continuation lines joined (empty if absent)."""
    found: list[str] = []
    for line in run_help.splitlines():
        starts = re.match(r"^  (-[-\w]+)", line)
        if starts:
            if found:
                break
            if line.strip().startswith((flag + " ", flag + ",")) or line.strip() == flag:
                found.append(line)
        elif found and line.startswith("   "):
            found.append(line)
        elif found:
            break
    return " ".join(" ".join(found).split())


def test_every_setting_is_a_run_option_with_the_preset_default_or_says_it_is_not(run_help) -> None:
    for f in FIELDS:
        form = f.metadata["cli"]
        flag = cli_flag(f)
        if flag is None:  # explicitly command-line-less: a reason, given in the docs and the help
            assert isinstance(form, str) and form
            assert re.search(rf"No ``tl-geometry run``\s+option: {re.escape(form[:20])}", AnalysisSettings.__doc__)
            assert f.name in run_help.split("without an option here")[1].split("\n\n")[0]
            continue
        assert isinstance(form, CliForm)
        text = option_help(run_help, flag)
        assert text, f"{flag} not in run --help"
        assert text.endswith(f"(default: {cli_text(getattr(CLI_PRESET, f.name))})"), text
    assert option_help(run_help, "--no-bounds") == "" and "--bounds, --no-bounds" in run_help
    assert "--diagnostics, --no-diagnostics" in run_help and option_help(run_help, "--query-stride")


def test_run_help_says_its_defaults_are_the_preset_and_how_they_differ(run_help) -> None:
    description = " ".join(run_help.split())
    assert "CLI_PRESET" in description
    for name in ("rank_by", "diagnostics", "bounds"):  # the three the preset changes
        f = next(f for f in FIELDS if f.name == name)
        api = cli_text(getattr(AnalysisSettings(), name))
        assert f"{cli_flag(f)} {cli_text(getattr(CLI_PRESET, name))} (tlg.analyze: {api})" in description


# ----------------------------------------------------------------------------- the command line's settings


def test_run_without_options_gives_exactly_the_preset() -> None:
    parsed = settings_from_args(build_parser().parse_args(["run"]))
    assert parsed == CLI_PRESET
    assert parsed.to_dict() == CLI_PRESET.to_dict() == MAKE_RUN_SETTINGS


def test_the_preset_differs_from_analyze_only_where_it_says() -> None:
    api = AnalysisSettings()
    differ = {f.name for f in FIELDS if getattr(CLI_PRESET, f.name) != getattr(api, f.name)}
    assert differ == {"rank_by", "diagnostics", "bounds"}


def test_each_option_sets_its_setting_and_only_it() -> None:
    argv = ["run", "--ns", "4,1,2", "--no-bounds", "--analysis-dtype", "float32", "--query-stride", "4"]
    argv += ["--rank-by", "contribution,attention", "--kappa", "2", "--k-max", "8", "--no-diagnostics"]
    argv += ["--batch-size", "2", "--distance", "cosine", "--n-random", "3", "--seed", "7", "--kernel", "torch"]
    got = settings_from_args(build_parser().parse_args(argv))
    want = CLI_PRESET.replace(
        ns=[1, 2, 4],
        bounds=False,
        dtype=torch.float32,
        query_positions=slice(3, None, 4),
        rank_by=("contribution", "attention"),
        kappa=2.0,
        k_max=8,
        diagnostics=False,
        batch_size=2,
        distance="cosine",
        n_random=3,
        seed=7,
        kernel="torch",
    )
    assert got == want
    assert settings_from_args(build_parser().parse_args(["run", "--query", "3,1"])).query_positions == (1, 3)
    assert settings_from_args(build_parser().parse_args(["run", "--bounds"])) == CLI_PRESET


@pytest.mark.parametrize(
    "option, message",
    [
        (["--query", "1", "--query-stride", "2"], "give either --query or --query-stride, not both"),
        (["--query-stride", "0"], "--query-stride must be at least 1"),
        (["--ns", "1,x"], "--ns must be 'log', 'all' or a comma-separated list of integers"),
        (["--k-max", "0"], "--k-max: k_max must be a positive integer"),
        (["--kappa", "nan"], "--kappa: kappa must be a positive finite number"),
        (["--kernel", "numba"], "kernel='numba' needs numba, which is not installed"),
    ],
)
def test_bad_options_name_the_option_before_loading(option, message, tmp_path, capsys, monkeypatch) -> None:
    no_loading(monkeypatch)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "numba" else real_find_spec(name, *a)
    )
    code = main(["run", "--out", str(tmp_path / "run"), "--no-progress", *option])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- analyze(settings, **overrides)


def test_overrides_replace_only_their_fields(monkeypatch) -> None:
    seen = []

    class Planned(Exception):
        pass

    def plan(model, corpus, settings):
        seen.append(settings)
        raise Planned

    monkeypatch.setattr(tl_geometry.pipeline.analysis, "place_model", lambda model, device: model)
    monkeypatch.setattr(tl_geometry.pipeline.analysis, "plan_analysis", plan)
    s = AnalysisSettings(ns="all", kappa=2, bounds=True, rank_by=("attention", "random"), seed=3, layers=[1])
    for call in (
        lambda: tlg.analyze("m", TEXT, settings=s, ns=[2, 1]),
        lambda: tlg.analyze("m", TEXT, s, ns=[1, 2]),
        lambda: tlg.analyze(
            "m", TEXT, ns=[1, 2], kappa=2, bounds=True, rank_by=("attention", "random"), seed=3, layers=1
        ),
    ):
        with pytest.raises(Planned):
            call()
    assert seen[0].ns == (1, 2)
    assert all(got == s.replace(ns=(1, 2)) for got in seen)
    with pytest.raises(Planned):
        tlg.analyze("m", TEXT, s)
    assert seen[-1] is s
    with pytest.raises(Planned):
        tlg.analyze("m", TEXT)
    assert seen[-1] == AnalysisSettings()


def test_settings_and_keywords_give_the_same_result(llama_bridge) -> None:
    corpus = tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=16)
    s = AnalysisSettings(ns=[1, 4], rank_by=("attention", "contribution"), diagnostics=True, layers=[0])
    by_settings = tlg.analyze(llama_bridge, corpus, s, ns=[1, 2], progress=False)
    by_keywords = tlg.analyze(
        llama_bridge,
        corpus,
        ns=[1, 2],
        rank_by=("attention", "contribution"),
        diagnostics=True,
        layers=[0],
        progress=False,
    )
    assert sorted(by_settings.separability.n.unique()) == [1, 2]
    assert set(by_settings.separability.rank_by) == {"attention", "contribution"}
    assert by_settings.config == by_keywords.config
    assert by_settings.separability.equals(by_keywords.separability)


@pytest.mark.parametrize("settings", [None, AnalysisSettings(ns=[1])])
def test_an_unknown_override_is_refused_before_loading(settings, monkeypatch) -> None:
    no_loading(monkeypatch)
    with pytest.raises(InputError, match=r"unknown analysis setting\(s\) \['nss'\]") as error:
        tlg.analyze("smollm2-135m", TEXT, settings, nss=[1, 2])
    assert all(name in str(error.value) for name in NAMES)


def test_settings_of_another_type_are_refused_before_loading(monkeypatch) -> None:
    no_loading(monkeypatch)
    with pytest.raises(InputError, match="settings must be an AnalysisSettings, got str"):
        tlg.analyze("smollm2-135m", TEXT, "log")
    with pytest.raises(InputError, match="settings must be an AnalysisSettings, got dict"):
        tlg.analyze("smollm2-135m", TEXT, {"ns": "log"})
