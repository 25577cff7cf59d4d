"""The demo notebook runs top to bottom on the embedded model (short windows), so it cannot rot."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "demos" / "tour.ipynb"


def test_demo_notebook_executes(monkeypatch) -> None:
    monkeypatch.setenv("TLG_DEMO_N_SEQS", "2")
    monkeypatch.setenv("TLG_DEMO_SEQ_LEN", "96")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # no cell timeout: a busy machine may take any time; the notebook's work is kept small instead
    NotebookClient(
        nb, timeout=None, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    # the patching study produced one row per regime present, and plotly figures were displayed
    text = "\n".join(str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "effect" in text
    assert sum("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outputs) >= 6
