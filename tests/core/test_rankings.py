"""Rankings of keys (definitions §7): scores, order, the seeded hash, and the checks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_geometry.core import rankings
from tl_geometry.core.engine import fused
from tl_geometry.errors import InputError

MASK = (1 << 64) - 1


def splitmix64_reference(x: int) -> int:
    """SplitMix64 on Python ints (unsigned 64-bit), written from Steele, Lea & Flood (2014)."""
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def mix_reference(*parts: int) -> int:
    h = 0
    for p in parts:
        h = splitmix64_reference(h ^ (p & MASK))
    return h


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
@settings(max_examples=200, deadline=None)
def test_splitmix64_matches_the_unsigned_reference(x):
    assert int(rankings.splitmix64(torch.tensor([x]))[0]) & MASK == splitmix64_reference(x & MASK)


def test_uniform_scores_are_the_top_53_bits_of_the_hash():
    keys = rankings.row_keys(seq=torch.tensor([0, 5]), layer=2, head=1, query_pos=9)
    u = rankings.uniform_scores(keys, n_keys=6, draws=3, seed=7)
    assert u.shape == (2, 3, 6)
    for r, seq in enumerate([0, 5]):
        key = mix_reference(seq, 2, 1, 9)
        for draw in range(3):
            for i in range(6):
                expected = (mix_reference(7, key, draw, i) >> 11) * 2.0**-53
                assert float(u[r, draw, i]) == expected


def test_random_scores_do_not_depend_on_the_batch_or_the_number_of_keys():
    keys = rankings.row_keys(seq=torch.arange(4), layer=1, head=0, query_pos=3)
    w = torch.rand(4, 10)
    together = rankings.ranking_scores(w, None, "random", row_keys=keys, seed=3, draw=2)
    alone = rankings.ranking_scores(w[2:3, :5], None, "random", row_keys=keys[2:3], seed=3, draw=2)
    assert torch.equal(together[2:3, :5], alone)
    other_seed = rankings.ranking_scores(w, None, "random", row_keys=keys, seed=4, draw=2)
    assert not torch.equal(together, other_seed)


def test_random_order_is_a_uniform_permutation():
    """Each key is first in about 1/K of 20000 rows (chi-square far below the 0.1 % critical value)."""
    k, rows = 5, 20000
    scores = rankings.ranking_scores(torch.ones(rows, k), None, "random", seed=1)
    first = torch.bincount(rankings.selection_order(scores)[:, 0], minlength=k).double()
    chi2 = float(((first - rows / k) ** 2 / (rows / k)).sum())
    assert chi2 < 18.47  # chi-square, 4 degrees of freedom, p = 0.001


@given(
    n_keys=st.sampled_from([1, 2, 7, 64, 1023, 1024, 1025, 1500]),
    draws=st.integers(1, 4),
    seed=st.integers(0, 2**31),
    seq=st.integers(0, 1000),
)
@settings(max_examples=30, deadline=None)
def test_uniform_order_is_the_stable_order_of_the_uniform_scores(n_keys, draws, seed, seq):
    keys = rankings.row_keys(seq=torch.tensor([seq, seq + 1]), layer=1, head=2, query_pos=n_keys - 1)
    expected = rankings.selection_order(rankings.uniform_scores(keys, n_keys, draws, seed))
    assert torch.equal(rankings.uniform_order(keys, n_keys, draws, seed), expected)


@pytest.mark.skipif(not fused.AVAILABLE, reason="numba is not installed")
@given(
    n_keys=st.sampled_from([1, 2, 7, 64, 1023, 1024, 1025]),
    draws=st.integers(1, 4),
    seed=st.integers(0, 2**63 - 1),
    seq=st.integers(-(2**40), 2**40),
)
@settings(max_examples=30, deadline=None)
def test_compiled_uniform_bits_are_the_tensor_hash(n_keys, draws, seed, seq):
    """The one-pass unsigned hash gives the bits of the tensor SplitMix64, keys of either sign."""
    keys = rankings.row_keys(seq=torch.tensor([seq, seq + 1, -seq]), layer=3, head=torch.arange(2)[:, None])
    compiled = rankings.uniform_bits(keys, n_keys, draws, seed, compiled=True)
    assert torch.equal(compiled, rankings.uniform_bits(keys, n_keys, draws, seed, compiled=False))
    assert compiled.shape == (2, 3, draws, n_keys) and int(compiled.min()) >= 0 and int(compiled.max()) < 2**53


def test_compiled_uniform_bits_off_the_cpu_is_refused():
    """``compiled=True`` where the compiled hash cannot run (here: a meta tensor) names the tensor
    hash instead of failing inside numpy; the default takes the tensor hash there."""
    keys = torch.zeros(2, dtype=torch.int64, device="meta")
    with pytest.raises(InputError, match="use compiled=False"):
        rankings.uniform_bits(keys, 5, 2, compiled=True)
    assert rankings.uniform_bits(keys, 5, 2).device.type == "meta"


@pytest.mark.parametrize("n_keys", [5, 100, 1024])
def test_uniform_order_breaks_ties_to_the_lower_key(n_keys, monkeypatch):
    """Scores drawn from four values (ties everywhere): highest first, ties to the lower index."""
    g = torch.Generator().manual_seed(n_keys)
    bits = (torch.randint(0, 4, (3, 2, n_keys), generator=g) << 50) | 7
    monkeypatch.setattr(rankings, "uniform_bits", lambda *a, **k: bits)
    expected = torch.argsort(bits.to(torch.float64), dim=-1, descending=True, stable=True)
    assert torch.equal(rankings.uniform_order(torch.zeros(3, dtype=torch.int64), n_keys, 2), expected)


def test_scores_of_each_ranking():
    w = torch.tensor([[0.5, 0.2, 0.2, 0.1]])
    v = torch.tensor([[[1.0, 0.0], [0.0, 3.0], [4.0, 0.0], [0.0, 0.0]]])
    assert torch.equal(rankings.ranking_scores(w, v, "attention"), w.double())
    assert torch.allclose(rankings.ranking_scores(w, v, "contribution"), torch.tensor([[0.5, 0.6, 0.8, 0.0]]).double())
    assert rankings.selection_order(rankings.ranking_scores(w, v, "sink_window")).tolist() == [[0, 3, 2, 1]]
    # ties go to the lower key index
    assert rankings.selection_order(rankings.ranking_scores(w, v, "attention")).tolist() == [[0, 1, 2, 3]]
    assert rankings.top_n_mask(rankings.ranking_scores(w, v, "attention"), 2).tolist() == [[True, True, False, False]]


def test_contribution_scores_take_values_shared_by_rows():
    """A key/value head's values broadcast over its query heads' and queries' rows (the block
    pipeline's groups): the scores equal those of the values repeated for every row."""
    g = torch.Generator().manual_seed(0)
    w = torch.rand(2, 3, 4, 5, generator=g, dtype=torch.float64)  # [group, head, query, key]
    v = torch.randn(2, 5, 7, generator=g, dtype=torch.float64)  # [group, key, d]
    shared = rankings.ranking_scores(w, v[:, None, None], "contribution")
    repeated = rankings.ranking_scores(w, v[:, None, None].expand(2, 3, 4, 5, 7).contiguous(), "contribution")
    assert torch.equal(shared, repeated)
    assert torch.equal(
        rankings.ranking_scores(w, v[:, None, None], "sink_window"), rankings.ranking_scores(w, None, "sink_window")
    )


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: rankings.check_rank_by("alpha"), "rank_by='alpha' is not a ranking"),
        (lambda: rankings.check_rankings([]), "non-empty"),
        (lambda: rankings.check_distance("manhattan"), "not a distance"),
        (lambda: rankings.check_n_random(0), "n_random must be an integer >= 1"),
        (lambda: rankings.check_n_random(2.0), "n_random must be an integer >= 1"),
        (lambda: rankings.check_seed("a"), "seed must be an integer"),
    ],
)
def test_bad_names_raise_one_clear_error(call, match):
    with pytest.raises(InputError, match=match):
        call()
