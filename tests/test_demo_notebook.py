"""The demo notebook runs top to bottom, as written, on the embedded model, so it cannot rot.

As written it is a tour of a few minutes (``FULL = False``: 2 windows of 128 tokens, a few layers
patched): the work is small, and no cell has a wall-clock limit that a busy machine could hit.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "demos" / "tour.ipynb"

#: A warning as Python prints it: ``file.py:21: TqdmWarning: IProgress not found...``.
WARNING = re.compile(r"\b\w*Warning\b: ")


def test_the_tour_is_small_as_written() -> None:
    first = next(cell for cell in nbformat.read(NOTEBOOK, as_version=4).cells if cell.cell_type == "code")
    assert "FULL = False" in first.source


def test_demo_notebook_executes(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # no cell timeout: a busy machine may take any time; the notebook's work is kept small instead
    NotebookClient(
        nb, timeout=None, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    # no warning printed in any cell (tqdm.auto's "TqdmWarning: IProgress not found" without ipywidgets,
    # a UserWarning of the package's own)
    warned = [o.text for o in outputs if o.output_type == "stream" and WARNING.search(o.text)]
    assert warned == [], f"the tour printed warnings: {warned}"
    # the patching study produced one row per regime present, and plotly figures were displayed
    text = "\n".join(str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "effect" in text
    # the more-studies section ran: head types cross-tabulated, N* per context, attribution effects
    assert "previous_token" in text and "n_star_over_context" in text
    assert sum("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outputs) >= 6
