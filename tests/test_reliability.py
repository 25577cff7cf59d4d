"""Issue 10, items 5-9 beyond the command line: bad corpora, validation gaps, diagnostics on odd
tensors, results independent of batching, and text tokenised as text.

Items 1-4 and 10 and the command-line side of 5 and 6 are in ``test_reliability_cli.py``; the
kill-and-resume runs in ``test_fault_injection.py``. Every test here failed before its fix.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_llama_bridge

import tl_geometry as tlg
import tl_geometry.cli.app as cli
from tl_geometry.diagnostics.decay_fit import fit_exponential_decay
from tl_geometry.testing import byte_tokenizer

TEXT = ["The quick brown fox jumps over the lazy dog. " * 12, "Attention is a weighting of values. " * 10]


@pytest.fixture()
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded although the corpus was invalid")

    monkeypatch.setattr(tlg, "load_model", refuse)


def cli_error(argv: list[str], capsys) -> str:
    code = cli.main(argv)
    _, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tl-geometry: error: "), err
    return lines[0]


# ----------------------------------------------------------------------------- 5. bad corpora


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("café olé".encode("latin-1"), "is not utf-8 text (byte 3 cannot be decoded)"),
        (bytes(range(256)) * 4, "is not a text file (it holds NUL bytes at byte 0)"),
    ],
)
def test_a_corpus_that_is_not_text_is_one_line_before_the_model(tmp_path, capsys, no_model, content, message):
    path = tmp_path / "doc.txt"
    path.write_bytes(content)
    line = cli_error(["run", "--corpus", str(path), "--out", str(tmp_path / "o"), "--n-seqs", "1"], capsys)
    assert str(path) in line and message in line
    assert not (tmp_path / "o").exists()


def test_a_corpus_directory_is_named_as_a_directory(tmp_path, capsys, no_model):
    (tmp_path / "texts").mkdir()
    line = cli_error(["run", "--corpus", str(tmp_path / "texts"), "--out", str(tmp_path / "o")], capsys)
    assert "is a directory, not a text file: pass the text files inside it" in line


def test_from_files_reads_latin1_when_told(tmp_path):
    path = tmp_path / "doc.txt"
    path.write_bytes("café olé".encode("latin-1"))
    with pytest.raises(tlg.InputError, match="not utf-8 text"):
        tlg.corpus.from_files(path)
    corpus = tlg.corpus.from_files(path, encoding="latin-1")
    assert list(corpus.texts()) == ["café olé"]


# ----------------------------------------------------------------------------- 6. validation gaps


def test_d_head_zero_is_a_clear_error():
    with pytest.raises(tlg.InputError, match=r"d_head >= 1"):
        tlg.separability(torch.full((2, 4), 0.25), torch.randn(2, 4, 0))
    model = tiny_llama_bridge()
    model.cfg.d_head = 0
    with pytest.raises(tlg.TLGeometryError, match=r"d_head = 0"):
        tlg.analyze(model, torch.randint(0, 50, (2, 8)), progress=False)


def test_numpy_counts_are_counts(llama_bridge):
    plain = tlg.analyze(llama_bridge, tlg.corpus.from_texts(TEXT, n_seqs=2, seq_len=16), batch_size=2, progress=False)
    numpy = tlg.analyze(
        llama_bridge, tlg.corpus.from_texts(TEXT, n_seqs=np.int64(2), seq_len=np.int32(16)),
        batch_size=np.int64(2), progress=False,
    )  # fmt: skip
    pd.testing.assert_frame_equal(numpy.separability, plain.separability, check_exact=True)


# ----------------------------------------------------------------------------- 7. diagnostics


def test_diagnostics_accept_tensors_that_require_grad():
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(2, 12, 2, 4, generator=gen, dtype=torch.float64)
    weights = torch.softmax(torch.randn(3, 12, generator=gen, dtype=torch.float64), -1)
    grad_v, grad_w = values.clone().requires_grad_(True), weights.clone().requires_grad_(True)
    pd.testing.assert_frame_equal(
        tlg.diagnostics.value_norm_stats(grad_v).summary, tlg.diagnostics.value_norm_stats(values).summary
    )
    pd.testing.assert_frame_equal(
        tlg.diagnostics.similarity_decay(grad_v, 4).summary, tlg.diagnostics.similarity_decay(values, 4).summary
    )
    pd.testing.assert_frame_equal(
        tlg.diagnostics.fit_attention_profile(grad_w).summary, tlg.diagnostics.fit_attention_profile(weights).summary
    )


def test_profile_of_zero_keys_is_a_clear_error():
    with pytest.raises(tlg.InputError, match="at least one key"):
        tlg.diagnostics.fit_attention_profile(torch.zeros(3, 0))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_values_are_refused_like_separability(bad):
    values = torch.randn(2, 12, 2, 4)
    values[1, 5, 0, 2] = bad
    for diagnostic in (tlg.diagnostics.value_norm_stats, tlg.diagnostics.similarity_decay):
        with pytest.raises(tlg.InputError, match="value vectors contain NaN or inf"):
            diagnostic(values)


# ----------------------------------------------------------------------------- 8. batching


def test_std_of_equal_values_is_exactly_zero_for_any_batching():
    """Every sequence the same: the std over sequences is 0, not the rounding of E[x^2] - E[x]^2."""
    gen = torch.Generator().manual_seed(3)
    one = torch.randn(1, 40, 2, 8, generator=gen, dtype=torch.float64) * 3.7
    values = one.expand(7, -1, -1, -1)
    for batch in (1, 2, 3, 7):
        acc = tlg.diagnostics.NormAccumulator()
        for start in range(0, 7, batch):
            acc.update(values[start : start + batch])
        std = acc.result().by_position["std_norm"]
        assert (std == 0.0).all(), (batch, std.max())


def test_analysis_std_columns_are_zero_for_identical_windows(llama_bridge):
    window = tlg.analyze(llama_bridge, tlg.corpus.from_texts(TEXT, n_seqs=1, seq_len=16), progress=False).tokens
    tokens = window.expand(5, -1).clone()
    results = [
        tlg.analyze(llama_bridge, tokens, batch_size=b, diagnostics=True, k_max=4, progress=False) for b in (1, 2, 5)
    ]
    for result in results:
        checked = 0
        for name, table in result.tables().items():
            # every std over sequences (c_std is over the pairs of one lag: not 0)
            for column in [c for c in table.columns if (c.endswith("_std") or c == "std_norm") and c != "c_std"]:
                assert (table[column].dropna() == 0.0).all(), (name, column, table[column].abs().max())
                checked += table[column].notna().sum()
        assert checked > 100
    betas = [r.similarity["beta"].to_numpy() for r in results]
    for beta in betas[1:]:
        np.testing.assert_array_equal(beta, betas[0])


def test_beta_is_infinite_when_the_first_lag_is_negative():
    ks = torch.arange(1, 9)
    # two local minima of sum (c - exp(-beta k))^2: which one wins depends on rounding
    c = torch.tensor([[-0.05, 0.3, 0.28, 0.25, 0.2, 0.18, 0.15, 0.1], [0.5, 0.25, 0.12, 0.06, 0.03, 0.0, 0.0, 0.0]])
    beta, mae = fit_exponential_decay(c.double(), ks)
    assert beta[0].item() == math.inf and mae[0].item() == pytest.approx(c[0].abs().mean().item())
    assert beta[1].item() == pytest.approx(math.log(2), rel=0.05)
    again, _ = fit_exponential_decay((c.double() * (1 + 1e-15)), ks)
    assert again[0].item() == math.inf


# ----------------------------------------------------------------------------- 9. text as text


def test_special_token_text_stays_text():
    tokenizer = byte_tokenizer()
    plain = tlg.corpus.from_texts(["a <eos> b <bos> c " * 4], seq_len=32).windows(tokenizer, 0, 1)
    ids = plain[0, 1:].tolist()
    assert 0 not in ids and 1 not in ids  # no BOS / EOS made from the text
    assert tokenizer.decode(ids).startswith("a <eos> b <bos> c")


def test_files_and_texts_give_the_same_windows_for_crlf(tmp_path):
    text = "line one\r\nline two\r\n" * 20
    path = tmp_path / "crlf.txt"
    path.write_bytes(text.encode())
    tokenizer = byte_tokenizer()
    from_file = tlg.corpus.from_files(path, seq_len=32).windows(tokenizer, 0, 1)
    from_text = tlg.corpus.from_texts([text], seq_len=32).windows(tokenizer, 0, 1)
    assert from_file.equal(from_text)
    assert "\r\n" in tokenizer.decode(from_file[0, 1:].tolist())
