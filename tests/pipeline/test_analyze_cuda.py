"""analyze() with the model on CUDA: every observer of the main job and every query position runs,
and gives the CPU's tables up to the forward pass's own rounding. Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tl_geometry as tlg
from tl_geometry.testing import tiny_llama_bridge

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

JOBS = {
    "main job": dict(ns="log", diagnostics=True, k_max=4, bounds=True, taxonomy=True, rank_by=["attention", "random"]),
    "every query": dict(ns="log", query_positions="all", taxonomy=False),
}


@pytest.mark.parametrize("job", list(JOBS))
def test_analyze_on_cuda_gives_the_cpu_tables(job):
    torch.manual_seed(0)
    tokens = torch.randint(3, 259, (2, 24))
    cpu = tlg.analyze(tiny_llama_bridge(), tokens, progress=False, **JOBS[job])
    gpu = tlg.analyze(tiny_llama_bridge().to("cuda"), tokens, progress=False, **JOBS[job])
    assert set(gpu.tables()) == set(cpu.tables())
    for name, expected in cpu.tables().items():
        got = gpu.tables()[name]
        assert list(got.columns) == list(expected.columns) and len(got) == len(expected), name
        keys = [c for c in ("seq", "layer", "head", "query_pos", "n", "lag") if c in expected]
        assert got[keys].equals(expected[keys]), name
    for name in ("value_norms", "attention_profile"):  # smooth in the inputs: the forward pass's rounding only
        if name in cpu.tables():
            a, b = cpu.tables()[name], gpu.tables()[name]
            floats = [c for c in a.columns if a[c].dtype.kind == "f"]
            np.testing.assert_allclose(b[floats].to_numpy(), a[floats].to_numpy(), rtol=1e-4, atol=1e-5)
