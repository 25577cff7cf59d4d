"""Competition and budgets: what happens to selection when keys compete (definitions §9).

Context scaling (the same targets predicted from longer contexts), a supporting fact under growing
background, and per-head key budgets compared at equal mean budget. Built on the intervention
layer's top-N restriction; see docs/competition.md.

* :func:`retrieval_under_competition` — bAbI qa1-style retrieval under neutral or competing
  background (:func:`babi_examples`): support keys' rank, mass, recall; candidate answer loss; ``N*``;
* :func:`head_budgets` — per-(layer, head) budgets at a mean budget ``B`` by rule;
* :func:`evaluate_budgets` — their ``delta_nll_rel`` on held-out windows.
"""

from tl_geometry.competition.babi import RetrievalExample, babi_examples, read_examples
from tl_geometry.competition.budgets import HeadBudgets, head_budgets
from tl_geometry.competition.context import context_scaling
from tl_geometry.competition.evaluate import evaluate_budgets
from tl_geometry.competition.fact import Fact, SupportingFact, supporting_fact, template_facts
from tl_geometry.competition.retrieval import Retrieval, retrieval_under_competition

__all__ = [
    "Fact",
    "HeadBudgets",
    "Retrieval",
    "RetrievalExample",
    "SupportingFact",
    "babi_examples",
    "context_scaling",
    "evaluate_budgets",
    "head_budgets",
    "read_examples",
    "retrieval_under_competition",
    "supporting_fact",
    "template_facts",
]
