"""``tl-geometry --help`` loads no heavy library: the parser and every command's help import no torch.

The parser's options come from the settings' metadata (one source per setting); the preset's
defaults as the help shows them must equal those of the built :data:`CLI_PRESET`.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

from tl_geometry.pipeline import settings

HEAVY = ("torch", "pandas", "transformers", "plotly", "scipy")

PROBE = """
import sys
from tl_geometry.cli.app import build_parser
parser = build_parser()
for argv in (["--help"], ["run", "--help"], ["sparsify", "--help"], ["report", "--help"]):
    try:
        parser.parse_args(argv)
    except SystemExit:
        pass
print("IMPORTED=" + ",".join(m for m in {heavy!r} if m in sys.modules))
"""


def test_the_parser_and_every_help_import_no_heavy_library() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY)], capture_output=True, text=True, check=True)
    assert "usage: tl-geometry run" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "IMPORTED="


def test_python_m_app_runs_without_a_runpy_warning() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "tl_geometry.cli.app", "--help"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "RuntimeWarning" not in done.stderr


def test_the_help_shows_the_defaults_of_the_built_preset() -> None:
    for f in fields(settings.AnalysisSettings):
        shown = settings.cli_text(settings.cli_default(f))
        assert shown == settings.cli_text(getattr(settings.CLI_PRESET, f.name)), f.name


def test_every_option_with_a_default_shows_it_in_the_help() -> None:
    import argparse

    from tl_geometry.cli.app import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in commands.choices.items():
        for action in parser._actions:
            if action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
                continue
            assert "default" in (action.help or ""), f"{name} {action.option_strings[0]} hides its default"
