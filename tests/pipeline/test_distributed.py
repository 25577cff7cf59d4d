"""torchrun: sharded runs equal single-process runs, and a dead rank resumes without loss.

Every test here starts real processes (``torchrun --standalone --nproc-per-node=2``, gloo, CPU) on a
tiny random LLaMA saved to a directory (``--model DIR``), and compares every table with a
single-process run of the same command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import torchrun
from hypothesis import given
from hypothesis import strategies as st

from tl_geometry.errors import InputError
from tl_geometry.pipeline.torchrun import World, check_shards, shard_windows

REPO = Path(__file__).resolve().parents[2]
#: Tables computed window by window (equal bit for bit); the others come from sums and (count, mean,
#: M2) moments over windows, merged in another order by the shards: equal to 1e-12 relative, with no
#: absolute slack (labels and integers exactly).
PER_WINDOW = {"separability", "head_effects"}

# A rank that dies after its second saved batch (only when TLG_TEST_DIE_RANK is set), and a
# finished run that keeps its progress/ folder to be inspected (only when TLG_TEST_KEEP_PROGRESS is
# set): loaded by Python at start-up through sitecustomize, so the package itself carries no test hook.
HOOKS = """
import os
if os.environ.get("TLG_TEST_KEEP_PROGRESS"):
    import tl_geometry.cli.run as _run
    _run.remove_written = lambda out, folder: None
if os.environ.get("TLG_TEST_DIE_RANK") == os.environ.get("RANK"):
    import tl_geometry.io.store as _store
    _write = _store.RunStore.write
    _count = [0]
    def write(self, *args, **kwargs):
        _write(self, *args, **kwargs)
        _count[0] += 1
        if _count[0] == 2:
            os._exit(17)
    _store.RunStore.write = write
"""


@given(n=st.integers(0, 200), size=st.integers(1, 9))
def test_shards_are_disjoint_and_cover_every_window(n: int, size: int) -> None:
    shards = [shard_windows(n, rank, size) for rank in range(size)]
    flat = sorted(i for shard in shards for i in shard)
    assert flat == list(range(n))
    assert all(i % size == rank for rank, shard in enumerate(shards) for i in shard)


def test_world_from_env_and_devices() -> None:
    assert World.from_env({}) is None
    world = World.from_env({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"})
    assert (world.rank, world.size, world.local_rank) == (3, 4, 1)
    assert str(world.device("cuda")) == "cuda:1"
    assert str(world.device("cpu")) == "cpu"
    with pytest.raises(InputError, match="outside WORLD_SIZE"):
        World.from_env({"WORLD_SIZE": "2", "RANK": "2"})


def test_shards_of_another_world_size_are_refused(tmp_path: Path) -> None:
    (tmp_path / "shard-00000-of-00003").mkdir()
    check_shards(tmp_path, 3)
    with pytest.raises(InputError, match="3 processes.*this one has 2"):
        check_shards(tmp_path, 2)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A random grouped-query LLaMA (2 layers, 4 heads, 2 kv heads) and its tokenizer, saved."""
    import torch
    import transformers
    from conftest import byte_tokenizer

    torch.manual_seed(0)
    tokenizer = byte_tokenizer()
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, attn_implementation="eager",
    )  # fmt: skip
    out = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(config).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _env(extra: dict[str, str] | None = None, hook_dir: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    paths = [str(REPO)] + ([str(hook_dir)] if hook_dir else []) + [env.get("PYTHONPATH", "")]
    env.update(PYTHONPATH=os.pathsep.join(p for p in paths if p), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", **(extra or {}))  # fmt: skip
    return env


def _run(
    launcher: list[str], args: list[str], env: dict[str, str], command: str = "run"
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*launcher, "-m", "tl_geometry", command, *args, "--no-progress"],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip


def _assert_same_tables(single: Path, sharded: Path) -> None:
    names = sorted(p.stem for p in single.glob("*.parquet"))
    assert names == sorted(p.stem for p in sharded.glob("*.parquet"))
    assert "separability" in names and "regime_features" in names
    for name in names:
        a, b = pd.read_parquet(single / f"{name}.parquet"), pd.read_parquet(sharded / f"{name}.parquet")
        if name in PER_WINDOW:
            pd.testing.assert_frame_equal(a, b, check_exact=True)
            continue
        assert list(a.columns) == list(b.columns) and len(a) == len(b), name
        for column in a.columns:
            if pd.api.types.is_float_dtype(a[column]):
                np.testing.assert_allclose(a[column], b[column], rtol=1e-12, atol=0, equal_nan=True, err_msg=name)
            else:
                assert a[column].tolist() == b[column].tolist(), (name, column)


def _args(model: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", str(model), "--n-seqs", "7", "--seq-len", "48", "--batch-size", "1", "--out", str(out), *extra]


def hooks(tmp_path: Path) -> Path:
    """A folder holding :data:`HOOKS` as ``sitecustomize.py`` (for ``_env``'s ``hook_dir``)."""
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOOKS)
    return hook


def test_torchrun_two_ranks_equal_one_process(tiny_dir: Path, tmp_path: Path) -> None:
    one = _run([sys.executable], _args(tiny_dir, tmp_path / "one", "--query-stride", "8"), _env())
    assert one.returncode == 0, one.stderr[-2000:]
    assert not (tmp_path / "one" / "progress").exists()  # a finished run removes it
    keep = _env({"TLG_TEST_KEEP_PROGRESS": "1"}, hooks(tmp_path))
    two = _run(torchrun(tmp_path), _args(tiny_dir, tmp_path / "two", "--query-stride", "8"), keep)
    assert two.returncode == 0, two.stderr[-2000:]
    progress = sorted(p.name for p in (tmp_path / "two" / "progress").iterdir())
    # every rank's store, and the rows rank 0 merged from them on disk (no rank gathered them)
    assert progress == ["separability.parquet", "shard-00000-of-00002", "shard-00001-of-00002"]
    assert (tmp_path / "torchrun-logs").is_dir()  # torchrun's own logs: here, not in the system's /tmp
    _assert_same_tables(tmp_path / "one", tmp_path / "two")
    table = pd.read_parquet(tmp_path / "two" / "separability.parquet")
    assert sorted(table.seq.unique()) == list(range(7))
    assert sorted(table.query_pos.unique()) == [7, 15, 23, 31, 39, 47]
    # the same timings, the analysis split into its parts (the ranks' means), and the world's size
    one_t, two_t = (json.loads((tmp_path / name / "run.json").read_text())["timings"] for name in ("one", "two"))
    parts = ["separability_s", "bounds_s", "diagnostics_s", "taxonomy_s"]
    assert [k for k in two_t if k in parts] == [k for k in one_t if k in parts] == parts
    assert two_t["world_size"] == 2 and "world_size" not in one_t
    assert sum(two_t[k] for k in parts) < two_t["analysis_s"]


def test_dead_rank_resumes_without_redoing_or_losing(tiny_dir: Path, tmp_path: Path) -> None:
    hook = hooks(tmp_path)
    dead = _run(torchrun(tmp_path), _args(tiny_dir, tmp_path / "two"), _env({"TLG_TEST_DIE_RANK": "1"}, hook))
    assert dead.returncode != 0
    assert not (tmp_path / "two" / "result.json").exists()
    shard = tmp_path / "two" / "progress" / "shard-00001-of-00002"
    saved = {p.name: p.stat().st_mtime_ns for p in (shard / "separability").iterdir()}
    assert len(saved) == 2  # rank 1 owns windows 1, 3 and 5: two saved before it died
    die_and_keep = {"TLG_TEST_DIE_RANK": "1", "TLG_TEST_KEEP_PROGRESS": "1"}
    resumed = _run(torchrun(tmp_path), _args(tiny_dir, tmp_path / "two", "--resume"), _env(die_and_keep, hook))
    # the hook would kill rank 1 at its second write again: it has one window left, so it lives
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = {p.name: p.stat().st_mtime_ns for p in (shard / "separability").iterdir()}
    assert {k: after[k] for k in saved} == saved and len(after) == 3
    one = _run([sys.executable], _args(tiny_dir, tmp_path / "one"), _env())
    assert one.returncode == 0, one.stderr[-2000:]
    _assert_same_tables(tmp_path / "one", tmp_path / "two")


def test_torchrun_smollm2_equals_one_process(tmp_path: Path) -> None:
    args = ["--n-seqs", "2", "--seq-len", "64", "--batch-size", "1", "--no-diagnostics"]
    one = _run([sys.executable], [*args, "--out", str(tmp_path / "one")], _env())
    assert one.returncode == 0, one.stderr[-2000:]
    two = _run(torchrun(tmp_path), [*args, "--out", str(tmp_path / "two")], _env())
    assert two.returncode == 0, two.stderr[-2000:]
    _assert_same_tables(tmp_path / "one", tmp_path / "two")


# ----------------------------------------------------------------------------- sparsification curve


def test_sharded_loss_sums_equal_one_pass() -> None:
    """Two shards' per-window sums, merged, give one pass's float64 total bit for bit (batch size 1),
    and the windows reach the intervention with their indices in the corpus."""
    import torch

    from tl_geometry.intervention.loss import corpus_nll
    from tl_geometry.testing import tiny_llama_bridge

    model = tiny_llama_bridge()
    tokens = torch.randint(3, 259, (5, 12), generator=torch.Generator().manual_seed(0))
    one = corpus_nll(model, tokens, batch_size=1, progress=False)
    seen: list[list[int]] = []
    first: dict[int, float] = {}

    def keep(part: dict[int, float]) -> dict[int, float]:
        first.update(part)
        return part

    with pytest.raises(InputError, match="do not cover every window"):
        corpus_nll(model, tokens, 1, False, windows=shard_windows(5, 0, 2), gather=keep)
    merged = corpus_nll(
        model, tokens, 1, False, before_batch=lambda ids: seen.append(ids.tolist()),
        windows=shard_windows(5, 1, 2), gather=lambda part: {**first, **part},
    )  # fmt: skip
    assert seen == [[1], [3]]
    assert merged == one  # total and n_tokens
    assert merged.total != corpus_nll(model, tokens[:4], batch_size=1, progress=False).total


def test_torchrun_sparsify_equals_one_process(tiny_dir: Path, tmp_path: Path) -> None:
    args = ["--model", str(tiny_dir), "--n-seqs", "5", "--seq-len", "24", "--ns", "1,2,4,24", "--batch-size", "1",
            "--rank-by", "attention,random", "--local-unit", "head", "--local-n", "2", "--no-geometry"]  # fmt: skip
    # --local-unit, not --local: torchrun's own parser reads --local as an abbreviation of its --local-addr
    one = _run([sys.executable], [*args, "--out", str(tmp_path / "one")], _env(), command="sparsify")
    assert one.returncode == 0, one.stderr[-2000:]
    two = _run(torchrun(tmp_path), [*args, "--out", str(tmp_path / "two")], _env(), command="sparsify")
    assert two.returncode == 0, two.stderr[-2000:]
    for name in ("curve.parquet", "n_star.parquet", "local.parquet"):
        a, b = pd.read_parquet(tmp_path / "one" / name), pd.read_parquet(tmp_path / "two" / name)
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    curve = pd.read_parquet(tmp_path / "two" / "curve.parquet")
    assert (curve.n_tokens == 5 * 23).all() and (curve.delta_nll_rel[curve.n < 24] != 0).any()


def test_torchrun_fact_equals_one_process(tiny_dir: Path, tmp_path: Path) -> None:
    places = ["attic", "barn", "cellar", "den", "garden", "hall"]  # distinct first bytes
    facts = [
        {"fact": f"{who} moved to the {place}.", "question": f"Where is {who}? {who} is in the", "answer": place,
         "candidates": places}
        for who, place in (("Al", "attic"), ("Bo", "den"), ("Cy", "hall"))
    ]  # fmt: skip
    (tmp_path / "facts.json").write_text(json.dumps(facts))
    args = ["--model", str(tiny_dir), "--facts", str(tmp_path / "facts.json"), "--amounts", "0,9,20",
            "--ns", "2,5", "--rank-by", "attention,sink_window", "--top", "4"]  # fmt: skip
    one = _run([sys.executable], [*args, "--out", str(tmp_path / "one")], _env(), command="fact")
    assert one.returncode == 0, one.stderr[-2000:]
    two = _run(torchrun(tmp_path), [*args, "--out", str(tmp_path / "two")], _env(), command="fact")
    assert two.returncode == 0, two.stderr[-2000:]
    for name in ("heads", "answers", "summary", "n_star", "support", "examples"):
        a, b = (
            pd.read_parquet(tmp_path / "one" / f"{name}.parquet"),
            pd.read_parquet(tmp_path / "two" / f"{name}.parquet"),
        )
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    answers = pd.read_parquet(tmp_path / "two" / "answers.parquet")
    assert len(answers) == 2 * 3 * 3 * 2 * 2  # conditions x amounts x examples x rankings x sizes
    assert (
        json.loads((tmp_path / "two" / "retrieval.json").read_text())["done"]
        == json.loads((tmp_path / "one" / "retrieval.json").read_text())["done"]
    )
