"""Progress bars: tqdm's notebook widget where Jupyter can draw it, the terminal's bar elsewhere.

``tqdm.auto`` picks the widget in any Jupyter kernel and, where ``ipywidgets`` is not installed,
warns (``TqdmWarning: IProgress not found``) before it falls back to the terminal's bar; here the
fallback is chosen without the warning. Every bar of the package is this module's :data:`tqdm`.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm.std import tqdm

__all__ = ["tqdm"]
