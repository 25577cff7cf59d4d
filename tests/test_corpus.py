"""Corpora: deterministic windows, BOS first, files and local datasets."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import byte_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

import tl_geometry as tlg

TOK = byte_tokenizer()


def test_python_docs_is_deterministic_and_starts_with_bos() -> None:
    a = tlg.corpus.python_docs(n_seqs=3, seq_len=64).windows(TOK, TOK.bos_token_id, TOK.eos_token_id)
    b = tlg.corpus.python_docs(n_seqs=3, seq_len=64).windows(TOK, TOK.bos_token_id, TOK.eos_token_id)
    assert a.shape == (3, 64) and torch.equal(a, b)
    assert torch.all(a[:, 0] == TOK.bos_token_id)
    assert not torch.any(a[:, 1:] == TOK.bos_token_id)
    # consecutive windows continue the same token stream
    stream = TOK(tlg.corpus.python_docs_texts()[0], add_special_tokens=False)["input_ids"]
    assert a[0, 1:].tolist() == stream[:63] and a[1, 1:].tolist() == stream[63:126]


def test_python_docs_is_large() -> None:
    text = "\n".join(tlg.corpus.python_docs_texts())
    assert len(text) > 400_000  # about 110k tokens of prose for a BPE tokenizer


def test_without_bos_windows_are_plain_slices() -> None:
    w = tlg.corpus.from_texts(["abcdefghij" * 3], n_seqs=2, seq_len=10).windows(TOK, None)
    assert w.shape == (2, 10) and TOK.decode(w[1].tolist()) == "abcdefghij"


def test_documents_are_separated_by_eos() -> None:
    w = tlg.corpus.from_texts(["ab", "cd"], seq_len=6).windows(TOK, TOK.bos_token_id, TOK.eos_token_id)
    assert w.tolist() == [[TOK.bos_token_id] + TOK("ab", add_special_tokens=False)["input_ids"]
                          + [TOK.eos_token_id] + TOK("cd", add_special_tokens=False)["input_ids"]]  # fmt: skip


def test_from_files(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("first file " * 20)
    (tmp_path / "b.txt").write_text("second file " * 20)
    corpus = tlg.corpus.from_files([tmp_path / "a.txt", tmp_path / "b.txt"], seq_len=32)
    w = corpus.windows(TOK, TOK.bos_token_id, TOK.eos_token_id)
    assert w.shape[0] == (220 + 1 + 240) // 31
    with pytest.raises(tlg.InputError, match="do not exist"):
        tlg.corpus.from_files([tmp_path / "missing.txt"])


def test_from_dataset_on_a_local_file(tmp_path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"document number {i} " * 5}) for i in range(10)))
    corpus = tlg.corpus.from_dataset("json", n_seqs=4, seq_len=32, data_files=str(path))
    w = corpus.windows(TOK, TOK.bos_token_id, TOK.eos_token_id)
    assert w.shape == (4, 32)
    assert TOK.decode(w[0, 1:20].tolist()) == ("document number 0 " * 5)[:19]
    bad = tlg.corpus.from_dataset("json", n_seqs=1, seq_len=8, data_files=str(path), text_column="body")
    with pytest.raises(tlg.InputError, match="no column 'body'"):
        bad.windows(TOK, TOK.bos_token_id)


def test_from_tokens_checks_its_input() -> None:
    t = tlg.corpus.from_tokens(torch.arange(12).reshape(2, 6))
    assert (t.n_seqs, t.seq_len) == (2, 6)
    with pytest.raises(tlg.InputError, match="integer ids"):
        tlg.corpus.from_tokens(torch.rand(2, 6))


def test_numpy_integer_sizes_are_accepted_as_ints_and_bools_refused() -> None:
    import numpy as np

    corpus = tlg.corpus.from_texts(["hello world " * 10], n_seqs=np.int64(2), seq_len=np.int32(8))
    assert type(corpus.n_seqs) is int and type(corpus.seq_len) is int
    assert corpus.windows(byte_tokenizer(), 0).shape == (2, 8)
    assert json.dumps({"n_seqs": corpus.n_seqs, "seq_len": corpus.seq_len}) == '{"n_seqs": 2, "seq_len": 8}'
    with pytest.raises(tlg.InputError, match="n_seqs must be a positive integer"):
        tlg.corpus.from_texts(["hello"], n_seqs=True, seq_len=8)
    with pytest.raises(tlg.InputError, match="seq_len must be an integer >= 2"):
        tlg.corpus.from_texts(["hello"], n_seqs=1, seq_len=8.0)


class SpyTokenizer:
    """The byte tokenizer, recording the length of every text it is given."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def __call__(self, text, **kwargs):
        self.lengths.append(len(text))
        return TOK(text, **kwargs)


def test_a_long_one_line_text_is_not_tokenised_whole() -> None:
    """Issue 23: a 5 MB one-line text was tokenised whole (54 s) before 32 tokens were cut."""
    text = "".join(f"word{i % 97} " for i in range(700_000))  # about 5 MB, one line
    spy = SpyTokenizer()
    windows = tlg.corpus.from_texts(text, n_seqs=1, seq_len=32).windows(spy, TOK.bos_token_id)
    assert max(spy.lengths) <= 4 * tlg.corpus.PREFIX_CHARS
    assert windows[0, 1:].tolist() == TOK(text[:1000], add_special_tokens=False)["input_ids"][:31]


class EndSensitiveTokenizer:
    """Bytes, except that the last ``reach`` tokens of any text become token 0: tokens near a cut change."""

    def __init__(self, reach: int) -> None:
        self.reach = reach

    def __call__(self, text, **kwargs):
        ids = TOK(text, **kwargs)["input_ids"]
        keep = max(0, len(ids) - self.reach)
        return {"input_ids": ids[:keep] + [0] * (len(ids) - keep)}


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(
        st.builds(lambda piece, times: piece * times, st.text(alphabet="ab c\n", max_size=12), st.integers(1, 400)),
        min_size=1,
        max_size=3,
    ),
    seq_len=st.integers(2, 24),
    prefix=st.integers(64, 200),
    reach=st.integers(0, 127),  # a cut changes tokens within 2 x PREFIX_CHARS of it (corpus._encode_prefix)
)
def test_windows_cut_from_prefixes_equal_windows_of_whole_texts(texts, seq_len, prefix, reach) -> None:
    import tl_geometry.corpus as corpus_module

    tok = EndSensitiveTokenizer(reach)

    if not any(t.strip() for t in texts):
        return
    whole = tlg.corpus.from_texts(texts, n_seqs=None, seq_len=seq_len)
    try:
        expected = whole.windows(tok, TOK.bos_token_id, TOK.eos_token_id)
    except tlg.InputError:
        return
    n_seqs = 1 if expected.shape[0] < 4 else 2  # few tokens needed of long texts: the prefixes are cut
    saved = corpus_module.PREFIX_CHARS
    corpus_module.PREFIX_CHARS = prefix
    try:
        cut = tlg.corpus.from_texts(texts, n_seqs=n_seqs, seq_len=seq_len).windows(
            tok, TOK.bos_token_id, TOK.eos_token_id
        )
    finally:
        corpus_module.PREFIX_CHARS = saved
    assert torch.equal(cut, expected[:n_seqs])


def test_a_whitespace_file_is_refused_before_anything_loads(tmp_path) -> None:
    path = tmp_path / "blank.txt"
    path.write_text(" \n\t" * 1000)
    with pytest.raises(tlg.InputError, match="empty"):
        tlg.corpus.from_files(path)


def test_document_stretches_cut_the_joined_texts_into_consecutive_documents() -> None:
    class Model:
        tokenizer = TOK

    texts = ["abcdefgh", "ijklmnop", "qrstuvwx"]
    stretches = tlg.corpus.document_stretches(Model(), tlg.corpus.from_texts(texts), 7)
    stream = []
    for i, text in enumerate(texts):  # the obvious way: EOS between texts, no BOS
        stream += ([TOK.eos_token_id] if i else []) + TOK(text, add_special_tokens=False)["input_ids"]
    assert stretches.tokens.tolist() == [stream[k : k + 7] for k in range(0, len(stream) - 6, 7)]
    assert stretches.tokens.shape == (len(stream) // 7, 7)
    with pytest.raises(tlg.errors.InputError, match="length"):
        tlg.corpus.document_stretches(Model(), tlg.corpus.from_texts(texts), 1)
