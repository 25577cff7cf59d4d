"""Where the names and modules of tl_geometry 0.1 went, and the warnings that say so.

0.2 keeps a small top level (``tl_geometry.__all__``) and puts everything else in the layer that
holds it. For one release every old spelling still works and warns once per use with a
``DeprecationWarning`` naming the new home:

* a name that left the top level (``tlg.bounds``) is looked up in :data:`MOVED_NAMES`;
* a module that moved (``import tl_geometry.store``) is aliased by :data:`MOVED_MODULES`;
* a figure renamed for what it draws (``tlg.plot.envelopes``) is in :data:`RENAMED_FIGURES`.

``tl_geometry.separability`` is the only old module path not aliased: that name is the function.

Examples
--------
>>> import warnings, tl_geometry as tlg
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     bounds = tlg.bounds
>>> bounds is tlg.theory.bounds, str(caught[0].message)
(True, 'tl_geometry.bounds has moved: use tl_geometry.theory.bounds (the old name goes in 0.3)')
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

#: Top-level names of 0.1 that now live in a sub-package: name -> the module that holds it.
MOVED_NAMES: dict[str, str] = {
    **dict.fromkeys(
        [
            "AttentionProfileFit",
            "DiagnosticsObserver",
            "DiagnosticsTables",
            "SimilarityDecay",
            "ValueNormStats",
            "fit_attention_profile",
            "similarity_decay",
            "value_norm_stats",
        ],
        "tl_geometry.diagnostics",
    ),
    **dict.fromkeys(
        [
            "Bounds",
            "BoundsObserver",
            "PiecewiseProfile",
            "SimilarityModel",
            "bounds",
            "envelopes",
            "f_bound",
            "join_bounds",
            "phase_boundaries",
            "size_phases",
        ],
        "tl_geometry.theory",
    ),
    **dict.fromkeys(
        [
            "ClassificationStability",
            "RegimeClusters",
            "RegimeFeatures",
            "RegimeFunction",
            "RegimeThresholds",
            "TaxonomyObserver",
            "classification_stability",
            "head_features",
            "regime_feature_table",
            "regime_features",
            "regime_pr_curves",
            "regime_shares",
            "rho0_table",
            "sink_effect",
        ],
        "tl_geometry.taxonomy",
    ),
    **dict.fromkeys(["Observer", "RowObserver", "SeparabilityObserver"], "tl_geometry.capture.observers"),
    **dict.fromkeys(["PrecisionRecallAtRadius", "Separability"], "tl_geometry.core.separability"),
    **dict.fromkeys(["DEFAULT_MODEL", "kv_head_index"], "tl_geometry.models"),
}

#: Modules of 0.1 that moved: old dotted path -> new dotted path (imports of the old path still work).
MOVED_MODULES: dict[str, str] = {
    "tl_geometry.analysis": "tl_geometry.pipeline",
    "tl_geometry.cli_sparsify": "tl_geometry.cli.sparsify",
    "tl_geometry.distributed": "tl_geometry.pipeline.torchrun",
    "tl_geometry.environment": "tl_geometry.io.environment",
    "tl_geometry.observers": "tl_geometry.capture.observers",
    "tl_geometry.patching": "tl_geometry.intervention.patching",
    "tl_geometry.query_engine": "tl_geometry.core.engine.query_engine",
    "tl_geometry.rankings": "tl_geometry.core.rankings",
    "tl_geometry.rows_on_disk": "tl_geometry.io.rows_on_disk",
    "tl_geometry.screening": "tl_geometry.core.engine.screening",
    "tl_geometry.selection": "tl_geometry.core.sizes",
    "tl_geometry.settings": "tl_geometry.pipeline.settings",
    "tl_geometry.store": "tl_geometry.io.store",
    "tl_geometry.tables": "tl_geometry.capture.tables",
    "tl_geometry.vis": "tl_geometry.plot.circuitsvis_grid",
}

#: Figures of ``tl_geometry.plot`` renamed for what they draw: old name -> new name.
RENAMED_FIGURES: dict[str, str] = {
    "separability": "separability_by_n",
    "envelopes": "envelopes_by_n",
    "regime_clusters": "cluster_scatter",
}

#: The release that drops the old spellings.
REMOVED_IN = "0.3"


def warn_moved(old: str, new: str, stacklevel: int = 3) -> None:
    """One ``DeprecationWarning``: ``old`` has moved to ``new`` (``stacklevel`` 3: the caller's caller's line)."""
    message = f"{old} has moved: use {new} (the old name goes in {REMOVED_IN})"
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel)


def moved_attribute(package: str, name: str) -> Any:
    """The object a 0.1 name of ``tl_geometry`` stood for (warning once), or raise ``AttributeError``."""
    if name in MOVED_NAMES:
        home = MOVED_NAMES[name]
        warn_moved(f"{package}.{name}", f"{home}.{name}", stacklevel=4)  # the line of the user's code
        return getattr(importlib.import_module(home), name)
    module = MOVED_MODULES.get(f"{package}.{name}")
    if module is not None:
        warn_moved(f"{package}.{name}", module, stacklevel=4)
        return importlib.import_module(module)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a 0.1 module path as a read-only alias of its new module, with a warning."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        new = MOVED_MODULES[module.__name__]
        warn_moved(module.__name__, new)
        target = importlib.import_module(new)
        module.__dict__.update({k: v for k, v in vars(target).items() if not k.startswith("__")})
        module.__getattr__ = lambda name: getattr(target, name)  # type: ignore[method-assign]  # names a package loads on first use
        module.__doc__ = f"Moved to {new}."


def install_finder() -> None:
    """Put :class:`MovedModuleFinder` on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


__all__ = [
    "MOVED_MODULES",
    "MOVED_NAMES",
    "REMOVED_IN",
    "RENAMED_FIGURES",
    "MovedModuleFinder",
    "install_finder",
    "moved_attribute",
    "warn_moved",
]
