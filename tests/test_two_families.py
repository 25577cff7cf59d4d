"""Two model families in one process do not disturb each other.

TransformerLens issue 1795: a bridge once replaced the module-level ``eager_attention_forward`` of
transformers' Gemma 2/3 modules for the rest of the process. Here a LLaMA-style and a Gemma 3-style
tiny model are measured in one process (LLaMA, then Gemma, then LLaMA again) and each alone in a
fresh process; every number must agree exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

FAMILIES = ("llama", "gemma3")
#: The transformers modules whose ``eager_attention_forward`` issue 1795's wrapper replaced.
PATCHED_MODULES = ("llama", "gemma2", "gemma3")


def eager_functions() -> dict[str, object]:
    import importlib

    return {
        name: importlib.import_module(f"transformers.models.{name}.modeling_{name}").eager_attention_forward
        for name in PATCHED_MODULES
    }


def measure(family: str) -> dict[str, float]:
    """The bridge's loss, its Hugging Face model's loss (transformers' eager attention function), the
    mean precision of a small analysis and the loss under a top-2 restriction."""
    import tl_geometry as tlg
    from tl_geometry.testing import tiny_gemma3_bridge, tiny_llama_bridge

    model = tiny_llama_bridge() if family == "llama" else tiny_gemma3_bridge(n_layers=3, sliding_window=4)
    tokens = torch.randint(3, 259, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        loss = float(model(tokens, return_type="loss"))
        hf_loss = float(model.original_model(tokens, labels=tokens).loss)
        with tlg.top_n_attention(model, n=2, renormalize=True):
            restricted = float(model(tokens, return_type="loss"))
    result = tlg.analyze(model, tokens, query_positions="all", ns="all", progress=False)
    return {
        "loss": loss,
        "hf_loss": hf_loss,
        "restricted_loss": restricted,
        "precision": float(result.separability.precision.mean()),
    }


def alone(family: str) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        [sys.executable, __file__, family], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_each_family_measures_the_same_beside_the_other(monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    functions = eager_functions()
    try:
        together = {"llama": measure("llama"), "gemma3": measure("gemma3"), "llama again": measure("llama")}
    finally:
        torch.set_num_threads(before)
    assert eager_functions() == functions  # issue 1795's mechanism: no module-level function was replaced
    separate = {family: alone(family) for family in FAMILIES}
    assert together["llama"] == separate["llama"] == together["llama again"]
    assert together["gemma3"] == separate["gemma3"]
    assert together["llama"]["restricted_loss"] != together["llama"]["loss"]  # the restriction took effect


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps(measure(sys.argv[1])))
