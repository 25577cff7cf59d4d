"""Build the wheel, install it into a fresh virtual environment and import it from there.

Run by ``make wheel-check`` (part of ``make test``). Offline and fast: the wheel is built with
``python -m build --no-isolation`` (the running environment already holds setuptools), installed
with ``--no-deps --no-index``, and the fresh environment borrows the *dependencies* (torch,
transformer_lens, ...) from the running environment's site-packages through a ``.pth`` line. That
line only appends a directory to ``sys.path``, so the editable install of the source tree that
lives there (a ``.pth`` hook of its own) is not activated: ``tl_geometry`` can only come from the
wheel, and the check asserts it does.

Usage: ``python .ci/check_wheel.py`` from the repository root (any working directory works).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What the build reads: the package, its metadata and the files pyproject.toml names.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "tl_geometry")

CHECK = """
import importlib.metadata as md
import pathlib
import sys

import tl_geometry as tlg

where = pathlib.Path(tlg.__file__).resolve()
assert where.is_relative_to(pathlib.Path(sys.prefix).resolve()), f"tl_geometry imported from {where}, not the wheel"
assert tlg.__version__ == md.version("tl-geometry") == sys.argv[1], (tlg.__version__, sys.argv[1])
assert (where.parent / "py.typed").is_file(), "py.typed is missing from the installed package"
for name in ("analyze", "separability", "load_model", "theory", "taxonomy", "report", "plot"):
    assert hasattr(tlg, name), name
print(f"tl_geometry {tlg.__version__} imports from {where.parent}")
"""


def run(*cmd: str | Path, cwd: Path | None = None) -> str:
    """Run a command, echo it, and stop with its output when it fails."""
    print("$", " ".join(str(c) if len(str(c)) < 80 else "<script>" for c in cmd), flush=True)
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def copy_sources(dest: Path) -> Path:
    """Copy what the build reads to ``dest``, so that setuptools' build/ and egg-info stay out of the checkout."""
    dest.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, dest / name)
    return dest


def check_contents(wheel: Path) -> None:
    """The wheel holds the package, py.typed, the licence and the console script, and no tests."""
    names = zipfile.ZipFile(wheel).namelist()
    required = ["tl_geometry/__init__.py", "tl_geometry/py.typed", "tl_geometry/theory/__init__.py"]
    missing = [n for n in required if n not in names]
    if missing:
        sys.exit(f"{wheel.name} lacks {missing}")
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
        sys.exit(f"{wheel.name} carries no LICENSE")
    tops = {n.split("/")[0] for n in names}
    strays = sorted(t for t in tops if t != "tl_geometry" and not t.endswith(".dist-info"))
    if strays:
        sys.exit(f"{wheel.name} ships top-level entries besides tl_geometry: {strays}")


def main() -> None:
    version = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE).group(1)
    with tempfile.TemporaryDirectory(prefix="tlg-wheel-") as tmp_name:
        tmp = Path(tmp_name)
        src = copy_sources(tmp / "src")
        run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", tmp / "dist", src)
        (wheel,) = (tmp / "dist").glob("tl_geometry-*.whl")
        check_contents(wheel)

        env = tmp / "venv"
        venv.EnvBuilder(with_pip=False).create(env)
        python = env / "bin" / "python"
        fresh_site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
        (fresh_site / "_borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index", wheel)
        print(run(python, "-c", CHECK, version, cwd=tmp).strip())
        print(run(env / "bin" / "tl-geometry", "--help", cwd=tmp).splitlines()[0])
    print(f"wheel check passed: {wheel.name}")


if __name__ == "__main__":
    main()
