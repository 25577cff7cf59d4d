"""The shape of the package (docs/architecture.md): layers, a small public face, no private reach.

The layering itself is checked by ``lint-imports`` (the contract in pyproject.toml); these tests
check what that tool does not: that the contract names every part of the package, that no module
takes a private name from another, the size of the top level and of ``__all__``, and that every
0.1 spelling still works with a warning naming its new home.
"""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

import tl_geometry as tlg
from tl_geometry import moved

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tl_geometry"


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((".".join(parts), path))
    return out


def _imports(path: Path, module: str) -> list[tuple[str, str]]:
    """``(imported module, name)`` of every ``from X import name`` inside the package (absolute)."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] == "tl_geometry":
                found += [(source, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.split(".")[0] == "tl_geometry"]
    return found


def test_at_most_eight_modules_directly_under_the_package() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top


def test_no_module_imports_a_private_name_from_another_module() -> None:
    offences = []
    for module, path in _modules():
        for source, name in _imports(path, module):
            private_module = any(part.startswith("_") and part != "__init__" for part in source.split("."))
            if source != module and (name.startswith("_") or private_module):
                offences.append(f"{module} imports {name or '*'} from {source}")
    assert offences == []


#: The separability engine's modules (``core/engine/``), and the names a module above ``core/`` may
#: take from them: the layer's one door, the kernels a user may name, the result types, a compiled
#: running sum other tables share and the size the memory budget counts.
ENGINE_MODULES = {
    "tl_geometry.core.engine": set(),
    "tl_geometry.core.engine.batched": set(),
    "tl_geometry.core.engine.dispatch": {"KERNELS", "check_kernel"},
    "tl_geometry.core.engine.fused": {"grid_sums"},
    "tl_geometry.core.engine.fused_rows": set(),
    "tl_geometry.core.engine.layer": {"separability_of_layer"},
    "tl_geometry.core.engine.query_engine": {"QueryRows"},
    "tl_geometry.core.engine.rows": {"ORDER_BYTES_PER_KEY", "Separability"},
    "tl_geometry.core.engine.screening": set(),
}


def test_nothing_above_core_chooses_a_separability_engine() -> None:
    """Issue 45: one module decides the route (``core/engine/dispatch.py``); above ``core/`` a caller
    goes through the layer's door (``separability_of_layer``) or ``core/separability.py``'s API, never
    a pipeline; and the engine's modules are one folder, ``core/engine/``."""
    engine = {f"tl_geometry.core.{p.stem}" for p in (PACKAGE / "core").glob("*.py")}
    assert not engine & {f"tl_geometry.core.{m.rpartition('.')[2]}" for m in ENGINE_MODULES}, "outside the engine"
    offences = []
    for module, path in _modules():
        if module.startswith("tl_geometry.core"):
            continue
        for source, name in _imports(path, module):
            if source == "tl_geometry.core.engine" and name:
                source, name = f"{source}.{name}", ""  # from tl_geometry.core.engine import fused
            if source.startswith("tl_geometry.core.engine") and name not in ENGINE_MODULES.get(source, set()):
                offences.append(f"{module} imports {name or 'the module'} from {source}")
    assert offences == []


def test_the_layers_contract_names_every_part_of_the_package() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    named = {part.strip() for layer in layers for part in layer.split("|")}
    parts = {f"tl_geometry.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    parts |= {f"tl_geometry.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert parts == named, f"not in the contract: {sorted(parts - named)}; not in the package: {sorted(named - parts)}"


def test_the_public_face_is_small_and_every_name_resolves_without_warning() -> None:
    assert len(tlg.__all__) <= 32  # 27 verbs in 0.2, room for the five of docs/competition.md and analyze_cache
    assert len(set(tlg.__all__)) == len(tlg.__all__)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in tlg.__all__:
            assert getattr(tlg, name) is not None
        for name in tlg.SUBPACKAGES:
            assert getattr(tlg, name).__name__ == f"tl_geometry.{name}"


@pytest.mark.parametrize("name", sorted(moved.MOVED_NAMES))
def test_a_name_that_left_the_top_level_still_works_and_names_its_new_home(name: str) -> None:
    home = importlib.import_module(moved.MOVED_NAMES[name])
    with pytest.warns(DeprecationWarning, match=rf"tl_geometry\.{name} has moved: use {home.__name__}\.{name}"):
        old = getattr(tlg, name)
    assert old is getattr(home, name)


@pytest.mark.parametrize("old", sorted(moved.MOVED_MODULES))
def test_a_module_that_moved_still_imports_and_names_its_new_home(old: str) -> None:
    sys.modules.pop(old, None)
    new = importlib.import_module(moved.MOVED_MODULES[old])
    with pytest.warns(DeprecationWarning, match=rf"{old} has moved: use {new.__name__}"):
        alias = importlib.import_module(old)
    public = getattr(new, "__all__", None) or [
        n for n, obj in vars(new).items() if not n.startswith("_") and getattr(obj, "__module__", None) == new.__name__
    ]
    assert public and all(getattr(alias, n) is getattr(new, n) for n in public)


@pytest.mark.parametrize("old, new", sorted(moved.RENAMED_FIGURES.items()))
def test_a_renamed_figure_still_works_and_names_its_new_name(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"tl_geometry\.plot\.{old} has moved: use tl_geometry\.plot\.{new}"):
        figure = getattr(tlg.plot, old)
    assert figure is getattr(tlg.plot, new)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        _ = tlg.no_such_name
    with pytest.raises(AttributeError, match="no attribute 'no_such_figure'"):
        _ = tlg.plot.no_such_figure


def test_the_formatter_is_overridden_in_at_most_15_places() -> None:
    markers = sum(path.read_text().count("# fmt: skip") for _, path in _modules())
    assert markers <= 15


def test_every_listed_slow_test_exists() -> None:
    from conftest import GEMMA3_TESTS, SLOW_TESTS, SMOLLM2_TESTS

    missing = []
    for entry in [*SLOW_TESTS, *SMOLLM2_TESTS, *GEMMA3_TESTS]:
        file, _, test = entry.partition("::")
        path = ROOT / "tests" / file
        defined = (
            {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
            if path.is_file()
            else set()
        )
        if not path.is_file() or (test and test not in defined):
            missing.append(entry)
    assert missing == []
