"""Every public function that runs a model's passes runs them on the threads the policy picks
(runtime/threads.py: the CPUs free now), and a user's own ``torch.set_num_threads`` wins."""

from __future__ import annotations

import pytest
import torch

import tl_geometry as tlg
from tl_geometry.competition.budgets import head_budgets
from tl_geometry.competition.context import context_scaling
from tl_geometry.competition.evaluate import evaluate_budgets
from tl_geometry.competition.fact import Fact, supporting_fact
from tl_geometry.corpus import from_tokens
from tl_geometry.intervention.context import top_n_attention
from tl_geometry.intervention.patching import attribute_head_out, head_out, mean_ablation, patch_head_out
from tl_geometry.runtime import threads


@pytest.fixture(scope="module")
def model():
    return tlg.testing.tiny_llama_bridge(n_heads=4, n_kv_heads=2)


@pytest.fixture
def policy(monkeypatch):
    """No thread variable set, torch's count as at import, and a policy that picks ``torch's + 2``
    threads (a count nothing else would set)."""
    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "REUSE_SECONDS", 0.0)
    outer = torch.get_num_threads()
    monkeypatch.setattr(threads, "TORCH_DEFAULT_THREADS", outer)
    picked = outer + 2
    monkeypatch.setattr(threads, "free_threads", lambda cpus=None, busy=None: picked)
    yield picked
    torch.set_num_threads(outer)


@pytest.fixture
def seen(model):
    """The thread count torch had at the start of every forward pass of ``model`` (at its embedding)."""
    counts: list[int] = []
    handle = model.embed.register_forward_pre_hook(lambda module, args: counts.append(torch.get_num_threads()))
    yield counts
    handle.remove()


def _tokens(seed: int, shape=(2, 9)) -> torch.Tensor:
    return torch.randint(3, 259, shape, generator=torch.Generator().manual_seed(seed))


def _metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 7].mean()


def _users_passes(model):
    with top_n_attention(model, n=2):
        model(_tokens(0))


FACTS = [Fact("Bob lives in Oslo.", "Where does Bob live? In", " Oslo")]

ENTRY_POINTS = {
    "patch_head_out": lambda model: patch_head_out(model, _tokens(0), _tokens(1), _metric),
    "attribute_head_out": lambda model: attribute_head_out(model, _tokens(0), _tokens(1), _metric),
    "head_out attribution": lambda model: head_out(model, _tokens(0), _tokens(1), _metric, method="attribution"),
    "mean_ablation": lambda model: mean_ablation(model, _tokens(2)),
    "the user's passes under top_n_attention": _users_passes,
    "head_types": lambda model: tlg.head_types(model, tokens=_tokens(3, (2, 12)), batch_size=2),
    "head_budgets": lambda model: head_budgets(
        model, from_tokens(_tokens(4, (2, 16))), mean_budget=3, rule="geometry", grid=(1, 4)
    ),
    "evaluate_budgets": lambda model: evaluate_budgets(
        model,
        from_tokens(_tokens(5, (2, 16))),
        [head_budgets(model, from_tokens(_tokens(4, (2, 16))), mean_budget=3, rule="uniform")],
        progress=False,
    ),
    "supporting_fact": lambda model: supporting_fact(
        model, FACTS, background="x = 1\n" * 10, amounts=(0, 5), ns=(1,), progress=False
    ),
    "context_scaling": lambda model: context_scaling(
        model, from_tokens(_tokens(6, (2, 20))), contexts=(8, 12), targets=4, ns=[1, 4], progress=False
    ),
}


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_every_pass_runs_on_the_threads_the_policy_picks(model, policy, seen, name) -> None:
    before = torch.get_num_threads()
    ENTRY_POINTS[name](model)
    assert seen, "no forward pass seen"
    assert set(seen) == {policy}
    assert torch.get_num_threads() == before  # restored


@pytest.mark.parametrize("name", ["patch_head_out", "the user's passes under top_n_attention", "head_budgets"])
def test_the_users_own_thread_count_wins(model, policy, seen, name) -> None:
    mine = policy + 1
    torch.set_num_threads(mine)  # after import: the user's choice
    ENTRY_POINTS[name](model)
    assert seen and set(seen) == {mine}
    assert torch.get_num_threads() == mine
