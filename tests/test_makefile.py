"""``make test`` runs every suite even when one fails, names the failed ones, and exits non-zero."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Stand-in suites appended to a copy of the Makefile: one fails between two that pass.
STUBS = """
ok-first:
\ttouch first.ran
broken:
\tfalse
ok-last:
\ttouch last.ran
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_runs_every_suite_and_reports_the_failed_ones(tmp_path: Path) -> None:
    (tmp_path / "Makefile").write_text((ROOT / "Makefile").read_text() + STUBS)
    done = subprocess.run(
        ["make", "test", "SUITES=ok-first broken ok-last"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert (tmp_path / "first.ran").exists() and (tmp_path / "last.ran").exists()  # not stopped at `broken`
    assert "FAILED: broken" in done.stderr


def test_make_test_runs_every_suite_of_ci() -> None:
    suites = re.search(r"^SUITES := (.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert suites is not None
    assert suites.group(1).split() == [
        "lint",
        "imports",
        "typecheck",
        "doctest",
        "wheel-check",
        "test-main",
        "test-tl3",
    ]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_make_test_draws_fixed_property_examples() -> None:
    """The test suites of ``make test`` load the derandomized hypothesis profile: CI's outcome is not chance."""
    from hypothesis import settings

    makefile = (ROOT / "Makefile").read_text()
    for suite in ("test-main", "test-tl3"):
        recipe = re.search(rf"^{suite}:.*\n\t(.*)$", makefile, re.MULTILINE)
        assert recipe is not None and "HYPOTHESIS_PROFILE=ci" in recipe.group(1), suite
    assert settings.get_profile("ci").derandomize


def test_set_up_retries_the_registry() -> None:
    """Every install of the set-ups retries a dropped connection; all but pip's own upgrade also resume."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^PIP := .*--retries \d+", makefile, re.MULTILINE)
    assert re.search(r"^PIP_RESUME := \$\(PIP\) --resume-retries \d+", makefile, re.MULTILINE)
    for target in (r"\$\(VENV\)/\.installed", r"\$\(VENV_TL3\)/\.installed"):
        recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
        assert recipe is not None, target
        installs = [line for line in recipe.group(1).splitlines() if " $(PIP" in line]
        assert installs[0].endswith("$(PIP) --upgrade pip"), installs[0]
        assert len(installs) >= 2 and all("$(PIP_RESUME)" in line for line in installs[1:]), installs
