"""The head grid's cap warning and the fragment's head tiles (data in the page, drawn by its script)."""

from __future__ import annotations

import json
import re
import warnings

import pandas as pd
import pytest

from tl_geometry.plot.circuitsvis_grid import DEFAULT_MAX_HEADS, head_grid
from tl_geometry.testing import tiny_llama_bridge

TEXT = "def f(x):\n    return x  # </script> <!-- tag"


@pytest.fixture(scope="module")
def many_heads():
    """36 heads: more than the default cap of 32."""
    model = tiny_llama_bridge(n_heads=4, n_kv_heads=2, n_layers=9)
    assert model.cfg.n_layers * model.cfg.n_heads > DEFAULT_MAX_HEADS
    return model


def test_default_cap_says_above_the_grid_that_heads_were_left_out(many_heads) -> None:
    """The README's call draws the default cap: no warning (following the README prints none),
    a line above the grid, in the notebook and in the report's fragment."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grid = head_grid(many_heads, TEXT)
    assert len(grid.heads) == 32 and grid.n_chosen == 36
    note = "32 of the 36 heads chosen are shown: pass max_heads= to show more"
    assert note in grid.local_src and note in grid.cdn_src and note in grid.fragment()


@pytest.mark.parametrize("cap", [12, 32])
def test_a_cap_the_user_chose_does_not_warn(many_heads, cap: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grid = head_grid(many_heads, TEXT, max_heads=cap)
    assert len(grid.heads) == cap and grid.n_chosen == 36 and "heads chosen are shown" not in grid.local_src


def fragment_parts(fragment: str) -> tuple[dict, list[dict], str]:
    """The circuitsvis props, the tiles' data and the render call, read from a fragment."""
    data = re.search(r'<script type="application/json" id="(circuits-vis-[0-9a-f-]+)-data"[^>]*>(.*?)</script>',
                     fragment, flags=re.DOTALL)  # fmt: skip
    tiles = re.search(r'<script type="application/json" class="tlg-head-tiles-data">(.*?)</script>', fragment,
                      flags=re.DOTALL)  # fmt: skip
    assert data and tiles, fragment[:500]
    call = fragment[fragment.index("CircuitsVis.render(") :]
    return json.loads(data.group(2)), json.loads(tiles.group(1)), call


def test_fragment_holds_the_data_once_and_circuitsvis_reads_it() -> None:
    model = tiny_llama_bridge()
    heads = pd.DataFrame({"layer": [0, 1, 1], "head": [1, 0, 3], "regime": ["Reset", "Unclassified", "Mixer"],
                          "regime_nearest": ["Reset", "Mixer", "Mixer"]})  # fmt: skip
    grid = head_grid(model, TEXT, heads, decimals=6)
    fragment = grid.fragment()
    props, tiles, call = fragment_parts(fragment)
    mount = re.search(r'<div id="(circuits-vis-[0-9a-f-]+)"', fragment).group(1)
    # circuitsvis renders from the JSON element: the attention is in the page once
    assert call.split("\n", 1)[0] == (
        f'CircuitsVis.render("{mount}", CircuitsVis.AttentionHeads, '
        f'JSON.parse(document.getElementById("{mount}-data").textContent))'
    )
    assert fragment.count('"attention"') == 1
    assert props["attentionHeadNames"] == grid.names and props["tokens"] == grid.tokens
    assert len(props["attention"]) == 3 and len(props["attention"][0]) == len(grid.tokens)
    # nothing in the data can end its <script>: every "<" is escaped
    data = fragment[fragment.index(f'id="{mount}-data"') :]
    assert "<" not in data[data.index(">") + 1 : data.index("</script>")]
    assert "</script> <!--" in "".join(props["tokens"])
    # one tile per head, in grid order, its label split for wrapping and its full name for the tooltip
    assert [t["name"] for t in tiles] == grid.names
    unclassified = tiles[grid.names.index("L1H0 · Unclassified (nearest: Mixer)")]
    assert unclassified == {"head": "L1H0", "regime": "Unclassified", "nearest": "Mixer",
                            "name": "L1H0 · Unclassified (nearest: Mixer)"}  # fmt: skip
    assert tiles[grid.names.index("L0H1 · Reset")]["nearest"] is None
    assert 'class="tlg-head-tiles"' in fragment and "<style>" in fragment


def test_tiles_without_regimes_are_named_by_head() -> None:
    grid = head_grid(tiny_llama_bridge(), [0, 70, 71], [(1, 2)])
    _, tiles, _ = fragment_parts(grid.fragment())
    assert tiles == [{"head": "L1H2", "regime": None, "nearest": None, "name": "L1H2"}]
