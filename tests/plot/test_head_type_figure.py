"""The regimes-against-head-types figure counts heads like the cross-table, with the heads on hover."""

from __future__ import annotations

import pandas as pd
import pytest

import tl_geometry as tlg
from tl_geometry.errors import InputError


def test_regimes_vs_head_types_counts_and_names_the_heads() -> None:
    table = pd.DataFrame(
        {
            "layer": [0, 0, 1, 1, 2],
            "head": [0, 1, 0, 1, 0],
            "regime_strict": ["Reset", "Reset", "Retriever", "Unclassified", "Reset"],
            "regime_nearest": ["Reset", "Reset", "Retriever", "Mixer", "Reset"],
            "head_type": ["induction", "induction", "current_token", "previous_token", "none"],
        }
    )
    table.attrs["threshold"] = 0.4
    fig = tlg.plot.regimes_vs_head_types(table)
    heat = fig.data[0]
    assert list(heat.y) == ["Retriever", "Reset", "Mixer", "Unclassified"]
    assert list(heat.x) == ["previous-token", "duplicate-token", "induction", "current-token", "none"]
    assert [list(row) for row in heat.z] == [[0, 0, 0, 1, 0], [0, 0, 2, 0, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]]
    assert heat.customdata[1][2] == "L0H0, L0H1" and ">= 0.4" in fig.layout.title.text
    nearest = tlg.plot.regimes_vs_head_types(table, mode="nearest").data[0]
    assert nearest.z[2][0] == 1 and nearest.z[3][0] == 0
    with pytest.raises(InputError, match="mode"):
        tlg.plot.regimes_vs_head_types(table, mode="both")
