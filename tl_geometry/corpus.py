"""Corpora: deterministic, fixed-length token windows for the analysis.

A corpus is a description (texts and window geometry); it becomes token windows only when it
meets a tokenizer, in :func:`tl_geometry.analyze`. Windows are consecutive, non-overlapping
slices of the token stream of all texts (documents separated by the EOS token when the tokenizer
has one), taken from the start, so the same corpus and tokenizer always give the same windows.

Every window starts with the model's BOS token when it has one (the window then holds
``seq_len - 1`` text tokens). Position 0 is therefore a real attention-sink candidate, as in the
paper's setting, rather than an arbitrary mid-document token.

Text is tokenised as text: special-token text inside a document (a literal ``<|im_start|>``)
is split like any other characters, so the only special tokens of a window are the BOS at
position 0 and the EOS between documents. Files are read with their line endings as written
(``from_files`` keeps CRLF, as ``from_texts`` keeps it in a string).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from tl_geometry.core.checks import is_integer
from tl_geometry.errors import InputError
from tl_geometry.models import ModelInfo, describe_model


@dataclass(frozen=True)
class Corpus:
    """Texts to cut into ``n_seqs`` windows of ``seq_len`` tokens.

    Attributes
    ----------
    name : str
        A readable name, recorded with the results.
    texts : callable returning an iterable of str
        Called each time windows are made, so a corpus can be reused and streams large inputs.
    n_seqs : int or None
        Number of windows; None takes every whole window the texts give.
    seq_len : int
        Tokens per window, the BOS token included.
    """

    name: str
    texts: Callable[[], Iterable[str]] = field(repr=False)
    n_seqs: int | None
    seq_len: int

    def __post_init__(self) -> None:
        n_seqs, seq_len = _check_geometry(self.n_seqs, self.seq_len)
        object.__setattr__(self, "n_seqs", n_seqs)  # numpy integers become ints: the corpus is saved as JSON
        object.__setattr__(self, "seq_len", seq_len)

    def windows(
        self, tokenizer: Any, bos_token_id: int | None, eos_token_id: int | None = None
    ) -> Int[Tensor, "seq pos"]:
        """Tokenise and cut the texts into windows: int64 tensor ``[n_seqs, seq_len]``."""
        if tokenizer is None:
            raise InputError(
                f"corpus {self.name!r} is text but the model has no tokenizer: attach one to the model, "
                "or pass token ids with tl_geometry.corpus.from_tokens(...)"
            )
        body = self.seq_len - (1 if bos_token_id is not None else 0)
        if body < 1:
            raise InputError(f"seq_len={self.seq_len} leaves no room for text after the BOS token; use seq_len >= 2")
        needed = None if self.n_seqs is None else self.n_seqs * body
        stream = _token_stream(self.texts(), tokenizer, eos_token_id, needed)
        n_available = len(stream) // body
        if n_available == 0:
            if not stream:
                raise InputError(f"corpus {self.name!r} is empty: it holds no text to analyse")
            raise InputError(
                f"corpus {self.name!r} has only {len(stream)} tokens, fewer than one window of {self.seq_len}; "
                "use a smaller seq_len or more text"
            )
        n_seqs = n_available if self.n_seqs is None else self.n_seqs
        if n_seqs > n_available:
            raise InputError(
                f"corpus {self.name!r} gives {n_available} windows of {self.seq_len} tokens "
                f"({len(stream)} tokens), not the {n_seqs} asked for: lower n_seqs or seq_len, or pass n_seqs=None"
            )
        body_tokens = torch.tensor(stream[: n_seqs * body], dtype=torch.int64).reshape(n_seqs, body)
        if bos_token_id is None:
            return body_tokens
        return torch.cat([torch.full((n_seqs, 1), bos_token_id, dtype=torch.int64), body_tokens], dim=1)


@dataclass(frozen=True)
class TokenCorpus:
    """Windows given directly as token ids, ``[n_seqs, seq_len]``; used as they are."""

    name: str
    tokens: Int[Tensor, "seq pos"] = field(repr=False)

    @property
    def n_seqs(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])

    def windows(
        self, tokenizer: Any = None, bos_token_id: int | None = None, eos_token_id: int | None = None
    ) -> Tensor:
        return self.tokens


def _check_geometry(n_seqs: Any, seq_len: Any) -> tuple[int | None, int]:
    """``n_seqs`` and ``seq_len`` as Python ints (numpy integers accepted, bools and floats not)."""
    if n_seqs is not None and (not is_integer(n_seqs) or n_seqs < 1):
        raise InputError(f"n_seqs must be a positive integer or None (all windows), got {n_seqs!r}")
    if not is_integer(seq_len) or seq_len < 2:
        raise InputError(f"seq_len must be an integer >= 2 (BOS plus at least one token), got {seq_len!r}")
    return (None if n_seqs is None else int(n_seqs)), int(seq_len)


def _token_stream(texts: Iterable[str], tokenizer: Any, eos_token_id: int | None, needed: int | None) -> list[int]:
    """Concatenate the token ids of ``texts`` (EOS between documents), stopping once ``needed``."""
    stream: list[int] = []
    for text in texts:
        if not isinstance(text, str):
            raise InputError(f"corpus texts must be str, got {type(text).__name__}")
        if not text.strip():
            continue
        if stream and eos_token_id is not None:
            stream.append(int(eos_token_id))
        stream.extend(_encode_prefix(tokenizer, text, None if needed is None else needed - len(stream)))
        if needed is not None and len(stream) >= needed:
            break
    return stream


#: Characters of a long text tokenised first when only its first tokens are needed (doubled until enough).
PREFIX_CHARS = 1 << 16


def _encode_prefix(tokenizer: Any, text: str, needed: int | None) -> list[int]:
    """The token ids of ``text``, or a prefix of them holding at least ``needed`` tokens.

    A text longer than :data:`PREFIX_CHARS` is not tokenised whole when only ``needed`` tokens are
    used: its first ``c`` and ``2c`` characters are tokenised and the tokens on which the two agree
    are kept, ``c`` doubling until enough tokens agree. The tokens are those of the whole text
    whenever a cut changes only tokens within ``2c`` characters before it (BPE tokenizers split the
    text into words first, so a cut changes only the word it falls in). A 5 MB one-line file gives
    its first windows in milliseconds instead of being tokenised whole (54 s).
    """
    if needed is None or len(text) <= PREFIX_CHARS:
        return _encode_as_text(tokenizer, text)
    chars = max(PREFIX_CHARS, 8 * needed)
    shorter = _encode_as_text(tokenizer, text[:chars])
    while 2 * chars < len(text):
        longer = _encode_as_text(tokenizer, text[: 2 * chars])
        agree = next((i for i, (a, b) in enumerate(zip(shorter, longer)) if a != b), len(shorter))
        if agree > needed:  # the token after the needed ones agrees too: the needed ones are settled
            return shorter[:agree]
        chars, shorter = 2 * chars, longer
    return _encode_as_text(tokenizer, text)


def _encode_as_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` read as plain text: a literal ``<|im_start|>`` or ``<bos>`` inside it is
    split like any other characters, never turned into the special token (``split_special_tokens``)."""
    try:
        return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    except TypeError:  # a tokenizer without the option: encode, then refuse special tokens found in the text
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        if special.intersection(ids):
            raise InputError(
                "the corpus text contains special-token text (e.g. '<|im_start|>') that this tokenizer turns "
                "into special tokens and cannot read as plain text: remove it from the text or pass token ids"
            ) from None
        return ids


def python_docs_texts() -> list[str]:
    """CPython's reference documentation topics (``pydoc_data.topics``), in sorted topic order."""
    from pydoc_data.topics import topics

    return [topics[key].strip() for key in sorted(topics)]


def python_docs(n_seqs: int | None = 8, seq_len: int = 512) -> Corpus:
    """The embedded default corpus: CPython's reference documentation (about 110k tokens of prose).

    Parameters
    ----------
    n_seqs : int or None, default 8
        Number of windows; None for every whole window (about 107 of 1024 tokens with SmolLM2's
        tokenizer).
    seq_len : int, default 512
        Tokens per window, BOS included.
    """
    return Corpus(name="python-docs", texts=python_docs_texts, n_seqs=n_seqs, seq_len=seq_len)


def from_texts(
    texts: str | Sequence[str], n_seqs: int | None = None, seq_len: int = 512, name: str = "texts"
) -> Corpus:
    """A corpus from strings (one string is one document).

    Parameters
    ----------
    texts : str or sequence of str
    n_seqs : int or None, default None (every whole window)
    seq_len : int, default 512
    name : str, default "texts"
    """
    items = [texts] if isinstance(texts, str) else list(texts)
    if not items or not any(isinstance(t, str) and t.strip() for t in items):
        raise InputError("from_texts got no text: pass at least one non-empty string")
    return Corpus(name=name, texts=lambda: items, n_seqs=n_seqs, seq_len=seq_len)


def from_files(
    paths: str | Path | Sequence[str | Path], n_seqs: int | None = None, seq_len: int = 512, encoding: str = "utf-8"
) -> Corpus:
    """A corpus from text files (one file is one document), read lazily in the order given."""
    files = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not files:
        raise InputError("from_files got no paths")
    folders = [str(p) for p in files if p.is_dir()]
    if folders:
        raise InputError(f"corpus {folders[0]} is a directory, not a text file: pass the text files inside it")
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise InputError(f"these corpus files do not exist: {missing[:5]}")
    for p in files:
        _check_text_file(p, encoding)

    def read() -> Iterator[str]:
        for p in files:
            with open(p, encoding=encoding, newline="") as f:  # CRLF kept, as from_texts keeps it
                yield f.read()

    name = files[0].name if len(files) == 1 else f"{len(files)} files"
    return Corpus(name=name, texts=read, n_seqs=n_seqs, seq_len=seq_len)


#: The end of the advice for a file in another encoding: the API's way (the CLI reads UTF-8 and drops it).
ENCODING_HINT = "encoding= to from_files"


def _check_text_file(path: Path, encoding: str) -> None:
    """Raise :class:`InputError` unless ``path`` decodes as ``encoding`` text with no NUL byte.

    Read in 1 MiB chunks before the model is loaded, so a binary or wrongly encoded file is one
    clear error instead of a traceback in the middle of the run.
    """
    try:
        decoder = codecs.getincrementaldecoder(encoding)()
    except LookupError:
        raise InputError(f"unknown text encoding {encoding!r}: use e.g. 'utf-8' or 'latin-1'") from None
    offset, has_text = 0, False
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                if offset == 0 and chunk.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
                    if not codecs.lookup(encoding).name.startswith("utf-16"):
                        raise InputError(
                            f"corpus {path} is UTF-16 text (it starts with a UTF-16 byte-order mark), not "
                            f"{encoding}: convert it (e.g. iconv -f utf-16 -t utf-8), or pass {ENCODING_HINT}"
                        )
                if b"\x00" in chunk:
                    raise InputError(
                        f"corpus {path} is not a text file (it holds NUL bytes at byte {offset + chunk.index(0)}): "
                        "pass a plain text file"
                    )
                has_text = bool(decoder.decode(chunk).strip()) or has_text
                offset += len(chunk)
            has_text = bool(decoder.decode(b"", final=True).strip()) or has_text
    except UnicodeDecodeError as exc:
        raise InputError(
            f"corpus {path} is not {encoding} text (byte {offset + exc.start} cannot be decoded): convert it "
            f"(e.g. iconv -f latin1 -t utf-8), or pass {ENCODING_HINT}"
        ) from None
    except OSError as exc:
        raise InputError(f"cannot read corpus {path}: {exc.strerror or exc}") from None
    if not has_text:
        raise InputError(f"corpus {path} is empty (it holds no text, only whitespace): pass a file with text in it")


def from_dataset(
    path: str,
    n_seqs: int | None = 8,
    seq_len: int = 512,
    *,
    split: str = "train",
    text_column: str = "text",
    streaming: bool = True,
    **load_kwargs: Any,
) -> Corpus:
    """A corpus from a Hugging Face ``datasets`` data set (needs the internet for Hub names).

    ``path`` and ``load_kwargs`` go to ``datasets.load_dataset`` (e.g. ``"openwebtext"``, or
    ``"json"`` with ``data_files=...`` for a local file). Rows are read in order, streaming by
    default, until ``n_seqs`` windows are filled.
    """

    def read() -> Iterator[str]:
        try:
            import datasets
        except ImportError as exc:  # pragma: no cover - datasets comes with transformer-lens
            raise InputError("from_dataset needs the `datasets` package: pip install datasets") from exc
        try:
            ds = datasets.load_dataset(path, split=split, streaming=streaming, **load_kwargs)
        except Exception as exc:  # network, missing files, unknown name: all one message
            raise InputError(
                f"could not load dataset {path!r} (split {split!r}): {type(exc).__name__}: {str(exc)[:200]}"
            ) from exc
        for row in ds:
            if text_column not in row:
                raise InputError(f"dataset {path!r} has no column {text_column!r}; its columns are {sorted(row)}")
            yield row[text_column]

    return Corpus(name=f"dataset:{path}", texts=read, n_seqs=n_seqs, seq_len=seq_len)


def from_tokens(tokens: Tensor | Sequence[Sequence[int]], name: str = "tokens") -> TokenCorpus:
    """Windows given as token ids ``[n_seqs, seq_len]`` (for models without a tokenizer, or your own)."""
    try:
        t = torch.as_tensor(tokens)
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:  # ragged rows, ids beyond int64, text
        raise InputError(
            "tokens must be an [n_seqs, seq_len] array of integer ids, every window of one length "
            f"({type(exc).__name__}: {str(exc)[:80]})"
        ) from None
    if t.ndim == 1:
        t = t[None]
    if t.ndim != 2 or t.numel() == 0:
        raise InputError(f"tokens must be a non-empty [n_seqs, seq_len] array, got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        raise InputError(f"tokens must be integer ids, got dtype {t.dtype}")
    if t.shape[1] < 2:
        raise InputError("each token window needs at least 2 tokens")
    return TokenCorpus(name=name, tokens=t.to(torch.int64))


def corpus_tokens(model: Any, corpus: Corpus | TokenCorpus, info: ModelInfo | None = None) -> Tensor:
    """The token windows ``[n_seqs, seq_len]`` that :func:`tl_geometry.analyze` runs ``model`` on.

    Text is tokenised with the model's tokenizer, documents separated by its EOS token, and
    every window starts with its BOS token when it has one (see this module).
    """
    info = info or describe_model(model)
    tokenizer = getattr(model, "tokenizer", None)
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    tokens = corpus.windows(tokenizer, info.bos_token_id, eos)
    vocab = int(getattr(model.cfg, "d_vocab", 0) or 0)
    if tokens.numel() and int(tokens.min()) < 0:
        raise InputError(f"token id {int(tokens.min())} is negative: token ids are indices into the vocabulary (>= 0)")
    if vocab and int(tokens.max()) >= vocab:
        raise InputError(f"token id {int(tokens.max())} is outside the model's vocabulary of {vocab}")
    return tokens


def corpus_documents(model: Any, corpus: Corpus | TokenCorpus) -> list[list[int]]:
    """The token ids of every document of ``corpus``, whole and without BOS (no windows cut).

    A text corpus gives one list per non-empty text, tokenised as text (see this module); a
    :class:`TokenCorpus` gives its rows, each taken as one document. Context scaling
    (definitions §9) cuts its own windows from the ends of these documents.
    """
    if isinstance(corpus, TokenCorpus):
        return [row.tolist() for row in corpus.tokens]
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise InputError(
            f"corpus {corpus.name!r} is text but the model has no tokenizer: attach one to the model, "
            "or pass token ids with tl_geometry.corpus.from_tokens(...) (one row per document)"
        )
    docs = []
    for text in corpus.texts():
        if not isinstance(text, str):
            raise InputError(f"corpus texts must be str, got {type(text).__name__}")
        if text.strip():
            docs.append(_encode_as_text(tokenizer, text))
    if not docs:
        raise InputError(f"corpus {corpus.name!r} is empty: it holds no text to analyse")
    return docs


def document_stretches(model: Any, corpus: Corpus, length: int) -> TokenCorpus:
    """``corpus``'s texts joined (the model's EOS between texts) and cut into consecutive documents of ``length`` tokens.

    For context scaling over a corpus whose texts are shorter than ``max(contexts) + T``: every
    stretch is one document (no BOS; context scaling adds it), the last partial one dropped.
    """
    if not is_integer(length) or length < 2:
        raise InputError(f"length must be an integer >= 2, got {length!r}")
    tokenizer = getattr(model, "tokenizer", None)
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    whole = Corpus(name=corpus.name, texts=corpus.texts, n_seqs=None, seq_len=int(length))
    return TokenCorpus(name=f"{corpus.name} stretches of {length}", tokens=whole.windows(tokenizer, None, eos))


def encode_text(model: Any, text: str) -> list[int]:
    """The token ids of ``text`` under the model's tokenizer, read as plain text (no special tokens added)."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise InputError("the model has no tokenizer: attach one to the model to tokenise text")
    return _encode_as_text(tokenizer, text)


def as_corpus(corpus: Any, default_seq_len: int) -> Corpus | TokenCorpus:
    if isinstance(corpus, (Corpus, TokenCorpus)):
        return corpus
    if isinstance(corpus, Tensor):
        return from_tokens(corpus)
    if isinstance(corpus, str) or (isinstance(corpus, Sequence) and all(isinstance(t, str) for t in corpus)):
        return from_texts(corpus, seq_len=default_seq_len)
    raise InputError(
        f"corpus of type {type(corpus).__name__} is not understood: pass tl_geometry.corpus.python_docs(), "
        "from_texts([...]), from_tokens(tensor), a string or a list of strings"
    )
