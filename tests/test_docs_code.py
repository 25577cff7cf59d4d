"""Every ```python block of README.md and docs/index.md runs as written.

The blocks of one file run in order, in one namespace (a later block uses the names of an earlier
one, as a reader would), in a temporary working directory. They load SmolLM2 on short windows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", "docs/index.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(page: str) -> list[str]:
    """The code of every ```python block of ``page``, in order."""
    return BLOCK.findall((ROOT / page).read_text(encoding="utf-8"))


def test_the_pages_have_python_blocks() -> None:
    assert all(python_blocks(page) for page in PAGES)
    assert python_blocks("README.md")[0].startswith("import tl_geometry as tlg")


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_runs_as_written(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    for i, code in enumerate(python_blocks(page), start=1):
        try:
            exec(compile(code, f"{page} block {i}", "exec"), namespace)
        except Exception as exc:
            pytest.fail(f"{page}, python block {i} fails as written: {type(exc).__name__}: {exc}")
