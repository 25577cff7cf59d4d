"""The head grid's selector tiles: per head, a thumbnail of its attention and a label that wraps.

circuitsvis' own selector puts ``L3H2 · Unclassified (nearest: Mixer)`` over a thumbnail a twelfth
of the page wide, where it overflows and clips. Here Python only writes data, as circuitsvis does:
the grid's props (``attention``, ``tokens``, head names) once, in a ``<script type="application/json">``
that circuitsvis renders from, and one small record per tile; :data:`TILES_SCRIPT`, inline in the
page, draws each tile (a ``<canvas>`` with one pixel per (query, key), a label in three short lines,
the full name as its ``title``) and forwards a click to circuitsvis' zoomed view. No network.

::

    tiles = head_tiles(grid.heads)   # [{"head": "L3H2", "regime": "Unclassified", "nearest": "Mixer",
                                     #   "name": "L3H2 · Unclassified (nearest: Mixer)"}, ...]
    json_for_script(tiles)           # JSON with every "<" escaped: safe inside a <script>
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

#: Width of a tile in CSS pixels, fixed: the grid fits as many columns as the page allows.
TILE_MIN_WIDTH_PX = 112

#: The tiles' style, scoped to the grid; the report's colours where the page defines them.
TILES_STYLE = f"""
.tlg-head-tiles {{ display: grid; grid-template-columns: repeat(auto-fill, minmax({TILE_MIN_WIDTH_PX}px, 1fr));
  gap: 8px; margin: 4px 0 12px; }}
.tlg-head-tiles .tlg-tile {{ display: flex; flex-direction: column; align-items: center; gap: 4px;
  min-width: {TILE_MIN_WIDTH_PX}px; padding: 6px 4px; margin: 0; border: 1px solid var(--line, #d9e2ec);
  border-radius: 6px; background: #fff; color: inherit; font: inherit; font-size: 0.78rem; line-height: 1.25;
  text-align: center; cursor: pointer; }}
.tlg-head-tiles .tlg-tile:hover {{ border-color: var(--muted, #52606d); }}
.tlg-head-tiles .tlg-tile[aria-pressed="true"] {{ border-color: var(--accent, #2f6fba);
  box-shadow: 0 0 0 2px var(--accent, #2f6fba); }}
.tlg-head-tiles .tlg-thumb {{ width: 72px; height: 72px; image-rendering: pixelated;
  border: 1px solid var(--line, #d9e2ec); }}
.tlg-head-tiles .tlg-tile-label {{ display: block; width: 100%; overflow-wrap: anywhere; }}
.tlg-head-tiles .tlg-tile-label > span {{ display: block; }}
.tlg-head-tiles .tlg-tile-nearest {{ color: var(--muted, #52606d); }}
.tlg-head-grid.tlg-tiled div[id^="circuits-vis-"] > div > h3:first-child,
.tlg-head-grid.tlg-tiled div[id^="circuits-vis-"] > div > h3:first-child + div {{ display: none !important; }}
"""

#: Draws the tiles of the grid it sits in (``document.currentScript``), from the two JSON elements
#: before it; marks the grid ``tlg-tiled`` (which hides circuitsvis' own selector row) and sets
#: ``data-tiles="drawn"``. A click on a tile clicks circuitsvis' tile of the same head (its zoom).
TILES_SCRIPT = """
(() => {
  const grid = document.currentScript.closest('.tlg-head-grid');
  const dataEl = grid.querySelector('script.tlg-head-grid-data');
  const props = JSON.parse(dataEl.textContent);
  const tiles = JSON.parse(grid.querySelector('script.tlg-head-tiles-data').textContent);
  const box = grid.querySelector('.tlg-head-tiles');
  const mountId = dataEl.id.replace(/-data$/, '');
  // circuitsvis' own tile i: the clickable div in the row after its "Head Selector" heading
  const theirs = (i) => {
    const heading = document.querySelector('#' + mountId + ' > div > h3:first-child');
    const row = heading && heading.nextElementSibling;
    const col = row && row.children[i];
    return col ? col.firstElementChild : null;
  };
  const forward = (i, type) => {
    const target = theirs(i);
    if (target) target.dispatchEvent(new MouseEvent(type, {bubbles: true, cancelable: true, view: window}));
  };
  const draw = (canvas, pattern) => {
    const n = pattern.length;
    canvas.width = n;
    canvas.height = n;
    const ctx = canvas.getContext('2d');
    const image = ctx.createImageData(n, n);
    for (let q = 0; q < n; q++) {
      for (let k = 0; k < n; k++) {
        const at = 4 * (q * n + k);
        if (k > q) {  // a future key: masked, as in circuitsvis' view
          image.data.set([245, 247, 250, 255], at);
          continue;
        }
        const w = Math.sqrt(Math.max(0, Math.min(1, Number(pattern[q][k]) || 0)));  // sqrt: faint heads stay visible
        image.data.set([255 - w * (255 - 47), 255 - w * (255 - 111), 255 - w * (255 - 186), 255], at);
      }
    }
    ctx.putImageData(image, 0, 0);
  };
  const buttons = tiles.map((tile, i) => {
    const button = document.createElement('button');
    button.type = 'button';
    button.className = 'tlg-tile';
    button.title = tile.name;
    button.setAttribute('aria-pressed', String(i === 0));
    const canvas = document.createElement('canvas');
    canvas.className = 'tlg-thumb';
    canvas.setAttribute('aria-hidden', 'true');
    draw(canvas, props.attention[i]);
    const label = document.createElement('span');
    label.className = 'tlg-tile-label';
    const lines = [[tile.head, 'tlg-tile-head'], [tile.regime, 'tlg-tile-regime'],
                   [tile.nearest && 'nearest: ' + tile.nearest, 'tlg-tile-nearest']];
    for (const [text, cls] of lines) {
      if (!text) continue;
      const line = document.createElement('span');
      line.className = cls;
      line.textContent = text;
      label.appendChild(line);
    }
    button.append(canvas, label);
    button.addEventListener('click', () => {
      buttons.forEach((b, j) => b.setAttribute('aria-pressed', String(j === i)));
      forward(i, 'click');
    });
    button.addEventListener('mouseenter', () => forward(i, 'mouseover'));
    button.addEventListener('mouseleave', () => forward(i, 'mouseout'));
    box.appendChild(button);
    return button;
  });
  grid.classList.add('tlg-tiled');
  grid.dataset.tiles = 'drawn';
})();
"""


def head_tiles(heads: pd.DataFrame) -> list[dict[str, Any]]:
    """One record per drawn head, in grid order: ``head`` (``L{layer}H{head}``), ``regime``,
    ``nearest`` (None where it equals the regime) and ``name`` (the full label, the tooltip).

    Parameters
    ----------
    heads : DataFrame
        :attr:`tl_geometry.plot.circuitsvis_grid.HeadGrid.heads`: ``layer``, ``head``, ``regime``,
        ``regime_nearest``, ``name``.
    """
    out = []
    for row in heads.itertuples(index=False):
        regime = None if row.regime is None else str(row.regime)
        nearest = None if row.regime_nearest is None else str(row.regime_nearest)
        out.append(
            {
                "head": f"L{int(row.layer)}H{int(row.head)}",
                "regime": regime,
                "nearest": None if nearest == regime else nearest,
                "name": str(row.name),
            }
        )
    return out


def json_for_script(value: Any) -> str:
    """``value`` as JSON that cannot end or derail a ``<script>``: every ``<`` becomes ``\\u003c``.

    >>> json_for_script(["</script>", "<!--"])
    '["\\\\u003c/script>", "\\\\u003c!--"]'
    """
    return json.dumps(value).replace("<", "\\u003c")
