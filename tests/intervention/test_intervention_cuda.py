"""The top-N attention intervention on CUDA: the same loss as on the CPU. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from intervention_reference import intervened_nll

from tl_geometry.testing import tiny_llama_bridge

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("rank_by", ["attention", "contribution", "random"])
def test_top_n_attention_on_cuda_equals_the_cpu(rank_by):
    torch.manual_seed(1)
    tokens = torch.randint(3, 259, (2, 16))
    cpu_model = tiny_llama_bridge()
    cpu = intervened_nll(cpu_model, tokens, n=3, rank_by=rank_by)
    gpu_model = tiny_llama_bridge().to("cuda")
    gpu = intervened_nll(gpu_model, tokens, n=3, rank_by=rank_by)  # corpus_nll moves the batches
    assert gpu == pytest.approx(cpu, abs=1e-5)
