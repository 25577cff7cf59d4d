"""The package's progress bar: no ``IProgress not found`` warning in a notebook without ipywidgets."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings

import pytest

from tl_geometry.core import progress


def test_every_bar_of_the_package_is_the_one_of_core_progress() -> None:
    from tl_geometry.competition import context, evaluate, fact
    from tl_geometry.intervention import curve, localized, loss
    from tl_geometry.pipeline import loop

    assert all(module.tqdm is progress.tqdm for module in (context, evaluate, fact, curve, localized, loss, loop))


@pytest.mark.skipif(importlib.util.find_spec("ipywidgets") is not None, reason="ipywidgets installed: the widget")
def test_a_jupyter_kernel_without_ipywidgets_gets_the_terminal_bar_without_a_warning(monkeypatch) -> None:
    """tqdm.auto, imported in a Jupyter kernel (``ipykernel.zmqshell`` loaded) without ipywidgets,
    warns ``IProgress not found``; the package's bar is chosen without it."""

    class ZMQInteractiveShell:
        pass

    ipython = type(sys)("IPython")
    ipython.get_ipython = lambda: ZMQInteractiveShell()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", type(sys)("ipykernel.zmqshell"))
    for name in ("tqdm.autonotebook", "tqdm.auto"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    try:
        with warnings.catch_warnings(record=True) as caught:  # as errors, tqdm would swallow them
            warnings.simplefilter("always")
            importlib.reload(progress).tqdm(range(3)).close()
        assert [str(w.message) for w in caught] == []
    finally:
        monkeypatch.undo()
        importlib.reload(progress)
