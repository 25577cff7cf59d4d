"""Head-type scores (TransformerLens' head_detector definitions) against loops over hook_pattern,
against TransformerLens' own detect_head, and their join with the regimes."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import tl_geometry as tlg
from tl_geometry.errors import InputError
from tl_geometry.taxonomy.head_types import (
    HEAD_TYPES,
    head_type_crosstab,
    head_types,
    regime_agreement,
    repeated_random_tokens,
)


def _scores_by_loops(model, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each score straight from hook_pattern: per type, attention on its keys averaged over the rows it applies to."""
    info = tlg.describe_model(model)
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens)
    out = {}
    for kind in HEAD_TYPES:
        total, rows = torch.zeros(info.n_layers, info.n_heads, dtype=torch.float64), 0
        for s, seq in enumerate(tokens.tolist()):
            for q in range(len(seq)):
                if kind == "previous_token":
                    keys = [q - 1] if q >= 1 else []
                elif kind == "current_token":
                    keys = [q] if q >= 1 else []
                elif kind == "duplicate_token":
                    keys = [k for k in range(q) if seq[k] == seq[q]]
                else:  # induction: the token after an earlier copy of the current token
                    keys = [k + 1 for k in range(q) if seq[k] == seq[q]]
                if not keys:
                    continue
                rows += 1
                for layer in range(info.n_layers):
                    pattern = cache[f"blocks.{layer}.attn.hook_pattern"][s, :, q].double()
                    total[layer] += sum(pattern[:, k] for k in keys)
        out[kind] = total / rows
    return out


@pytest.mark.parametrize("which", ["repeated", "duplicates"])
def test_scores_equal_loops_over_hook_pattern(llama_bridge, which, one_thread) -> None:
    if which == "repeated":
        tokens = repeated_random_tokens(llama_bridge, n_seqs=3, half_len=6, seed=2)
    else:  # duplicates inside the first copy and a token seen three times
        tokens = torch.tensor([[0, 5, 6, 5, 7, 6, 5, 8, 9], [0, 9, 9, 9, 4, 4, 3, 9, 4]])
    table = head_types(llama_bridge, tokens=tokens, batch_size=2)
    want = _scores_by_loops(llama_bridge, tokens)
    for kind in HEAD_TYPES:
        got = torch.tensor(table[f"{kind}_score"].to_numpy()).reshape(2, 4)
        assert torch.allclose(got, want[kind], atol=1e-9, rtol=0), kind
    assert table.attrs["n_seqs"] == len(tokens)


def test_scores_are_transformer_lens_detect_head_rescaled(llama_bridge, one_thread) -> None:
    """detect_head (error_measure="mul") divides by every row; the score by the rows the pattern applies to."""
    from transformer_lens.head_detector import detect_head

    text = "abcab bcabca"
    tokens = llama_bridge.to_tokens(text)
    table = head_types(llama_bridge, tokens=tokens)
    seq = tokens[0].tolist()
    applies = {
        "previous_token": len(seq) - 1,
        "duplicate_token": sum(seq[q] in seq[:q] for q in range(len(seq))),
    }
    applies["induction"] = applies["duplicate_token"]
    for kind, rows in applies.items():
        tl = detect_head(llama_bridge, text, f"{kind}_head").double()
        ours = torch.tensor(table[f"{kind}_score"].to_numpy()).reshape(tl.shape) * rows / len(seq)
        assert torch.allclose(ours, tl, atol=1e-6), kind


def test_repeated_random_tokens_are_seeded_distinct_and_ordinary(llama_bridge) -> None:
    tokens = repeated_random_tokens(llama_bridge, n_seqs=4, half_len=20, seed=3)
    assert tokens.shape == (4, 41) and (tokens[:, 0] == 0).all()
    first, second = tokens[:, 1:21], tokens[:, 21:]
    assert torch.equal(first, second)
    assert all(len(set(row)) == 20 for row in first.tolist())
    assert int(first.min()) >= 3 and int(first.max()) < 259  # no <bos>, <eos>, <pad>
    assert torch.equal(tokens, repeated_random_tokens(llama_bridge, n_seqs=4, half_len=20, seed=3))
    assert not torch.equal(tokens, repeated_random_tokens(llama_bridge, n_seqs=4, half_len=20, seed=4))
    with pytest.raises(InputError, match="half_len"):
        repeated_random_tokens(llama_bridge, half_len=0)
    with pytest.raises(InputError, match="n_ctx"):
        repeated_random_tokens(llama_bridge, half_len=100)


@pytest.fixture(scope="module")
def tiny_heads(llama_bridge):
    corpus = torch.randint(3, 259, (4, 12), generator=torch.Generator().manual_seed(3))
    return tlg.analyze(llama_bridge, corpus, batch_size=2, progress=False).classify_heads()


def test_head_type_is_the_largest_score_over_the_threshold_and_joins_the_regimes(
    llama_bridge, tiny_heads, one_thread
) -> None:
    table = head_types(llama_bridge, tiny_heads, n_seqs=2, half_len=8, threshold=1e-9)
    scores = table[[f"{kind}_score" for kind in HEAD_TYPES]].to_numpy()
    assert table.head_type.astype(str).tolist() == [HEAD_TYPES[i] for i in scores.argmax(axis=1)]
    assert (table.regime_strict.astype(str) == tiny_heads.regime_strict.astype(str)).all()
    assert (table.regime_nearest.astype(str) == tiny_heads.regime_nearest.astype(str)).all()
    cut = float(scores.max(axis=1).min()) + 1e-12  # above the weakest head's best score: that head has no type
    typed = head_types(llama_bridge, n_seqs=2, half_len=8, threshold=cut).head_type.astype(str)
    weakest = int(scores.max(axis=1).argmin())
    assert typed[weakest] == "none" and (typed != "none").sum() == (scores.max(axis=1) >= cut).sum()
    with pytest.raises(InputError, match="threshold"):
        head_types(llama_bridge, threshold=0)


def test_crosstab_and_agreement_count_by_hand() -> None:
    table = pd.DataFrame(
        {
            "layer": 0,
            "head": range(5),
            "regime_strict": ["Reset", "Reset", "Mixer", "Unclassified", "Reset"],
            "regime_nearest": ["Reset", "Reset", "Mixer", "Mixer", "Reset"],
            "head_type": ["induction", "none", "previous_token", "previous_token", "induction"],
        }
    )
    strict = head_type_crosstab(table)
    assert strict.loc["Reset", "induction"] == 2 and strict.loc["Reset", "none"] == 1
    assert strict.loc["Unclassified", "previous_token"] == 1 and strict.loc["Retriever"].sum() == 0
    assert head_type_crosstab(table, "nearest").loc["Mixer", "previous_token"] == 2
    assert strict.to_numpy().sum() == 5 and list(strict.columns)[-1] == "none"
    other = table.assign(regime_strict=["Reset", "Mixer", "Mixer", "Reset", "Reset"])
    agree = regime_agreement(table, other).set_index("mode")
    assert agree.loc["strict", "n_same"] == 3 and agree.loc["strict", "share_same"] == 0.6
    assert agree.loc["nearest", "share_same"] == 1.0 and agree.loc["nearest", "n_heads"] == 5
    with pytest.raises(InputError, match="regimes="):
        head_type_crosstab(table.drop(columns="regime_strict"))
