"""glibc keeps freed memory for the command line's process (runtime/allocator.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tl_geometry.cli import app
from tl_geometry.runtime import allocator

GLIBC = allocator.has_glibc()

# A 64 MiB block from malloc: glibc's default serves it with mmap (one more mmapped block in
# mallinfo2's hblks); with the thresholds at 1 GiB it comes from the heap.
_PROBE = """
import ctypes, json, sys
from tl_geometry.runtime.allocator import keep_freed_memory
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
before = libc.mallinfo2().hblks
block = libc.malloc(64 << 20)
mapped = libc.mallinfo2().hblks - before
libc.free(block)
print(json.dumps({"kept": kept, "mapped": mapped}))
"""


def _probe(mode: str, **extra_env: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in allocator.MALLOC_VARIABLES and k != "GLIBC_TUNABLES"}
    env.update(extra_env, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_kept_memory_serves_a_large_block_from_the_heap():
    assert _probe("default") == {"kept": None, "mapped": 1}
    assert _probe("keep") == {"kept": True, "mapped": 0}


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
@pytest.mark.parametrize(
    "variable, value", [("MALLOC_TRIM_THRESHOLD_", "131072"), ("GLIBC_TUNABLES", "glibc.malloc.perturb=0")]
)
def test_a_users_malloc_settings_win(variable, value):
    assert _probe("keep", **{variable: value}) == {"kept": False, "mapped": 1}


def test_user_tuned_malloc_reads_only_malloc_settings():
    assert not allocator.user_tuned_malloc({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=0"})
    assert not allocator.user_tuned_malloc({"MALLOC_TRIM_THRESHOLD_": ""})
    assert allocator.user_tuned_malloc({"MALLOC_MMAP_THRESHOLD_": "65536"})
    assert allocator.user_tuned_malloc({"GLIBC_TUNABLES": "glibc.rtld.nns=2:glibc.malloc.mmap_max=0"})


def test_the_command_line_keeps_freed_memory(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(app, "keep_freed_memory", lambda: calls.append(True) or True)
    assert app.main(["report", str(tmp_path / "no-run")]) == 2  # fails fast: no run there
    assert calls == [True]
    assert "error" in capsys.readouterr().err
