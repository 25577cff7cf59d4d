"""analyze_cache and the TransformerLens layout on the real SmolLM2-135M (grouped-query, 9 heads, 3 kv heads)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import tl_geometry as tlg
from tl_geometry.errors import InputError

# analyze's own forward pass against run_with_cache's: one thread count for both, whatever the load
pytestmark = pytest.mark.usefixtures("fixed_threads")

LAYERS = [0, 10, 29]
QUERIES = [31, 79]


def test_analyze_cache_equals_analyze_and_the_trap_is_closed() -> None:
    model = tlg.load_model("smollm2-135m")
    result = tlg.analyze(
        model, tlg.corpus.python_docs(n_seqs=1, seq_len=80), layers=LAYERS, query_positions=QUERIES, progress=False
    )
    _, cache = model.run_with_cache(
        result.tokens, names_filter=lambda name: name.endswith(("attn.hook_v", "attn.hook_pattern"))
    )
    cached = tlg.analyze_cache(cache, result.tokens, layers=LAYERS, query_positions=QUERIES)
    got, expected = cached.separability, result.separability
    keys = ["seq", "layer", "head", "kv_head", "query_pos", "rank_by", "n"]
    pd.testing.assert_frame_equal(got[keys], expected[keys])
    assert (got.precision == expected.precision).all() and (got.recall == expected.recall).all()
    assert (got.r_max - expected.r_max).abs().max() < 1e-9
    pd.testing.assert_frame_equal(cached.regime_features, result.regime_features, check_exact=False, atol=1e-9)

    pattern, hook_v = cache["pattern", 10], cache["v", 10]
    with pytest.raises(InputError, match="weight exactly 0"):  # query 31's full row over 80 keys
        tlg.separability(pattern[:, :, 31], hook_v.repeat_interleave(3, dim=2).transpose(1, 2))
    rows = tlg.separability(pattern, hook_v, layout="tl", query_positions=31)
    layer10 = expected[(expected.layer == 10) & (expected.query_pos == 31)]
    precision = rows.precision[0, :, 0][:, rows.valid[0]].flatten()  # [head, n] in head, n order
    assert torch.equal(precision, torch.tensor(layer10.precision.to_numpy()))
