"""bAbI qa1-style retrieval examples: "X moved to the Y." facts, "Where is X?", six candidate places.

:func:`babi_examples` draws seeded examples (people and places of bAbI task 1); each carries its
supporting fact, the question, the answer among its candidates, and the same-format facts about
*other* people that fill the background of the "competitors" condition. :func:`read_examples`
reads your own from JSON with a schema that refuses what it does not understand. Protocol:
docs/competition.md#retrieval-under-competition.

Examples
--------
>>> example = babi_examples(1, seed=0)[0]
>>> example.question.startswith("Question: Where is ") and example.answer in example.candidates
True
>>> len(example.candidates)
6
"""

from __future__ import annotations

import hashlib
import json
import numbers
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tl_geometry.errors import InputError

#: The people and places of bAbI task 1 (single supporting fact).
PEOPLE = ("Mary", "John", "Sandra", "Daniel")
PLACES = ("bathroom", "hallway", "garden", "office", "kitchen", "bedroom")
FACT_TEMPLATE = "{person} moved to the {place}."
QUESTION_TEMPLATE = "Question: Where is {person}? Answer: {person} is in the"
#: Competitor facts drawn per example: about 7 tokens each, enough for 4 K tokens of background.
DEFAULT_COMPETITORS = 640
#: The keys a JSON example may hold (``fact``, ``question``, ``answer`` required).
EXAMPLE_KEYS = ("fact", "question", "answer", "candidates", "competitors")


@dataclass(frozen=True)
class RetrievalExample:
    """One retrieval example.

    Attributes
    ----------
    fact : the supporting fact (its tokens are the support keys).
    question : the question; the query that predicts the answer is its last token.
    answer : the correct candidate, continuing the question (e.g. ``" bathroom"``).
    candidates : every candidate answer, ``answer`` among them; each is scored by the logit of its
        first token, and the first tokens must differ.
    competitors : same-format facts that do not answer the question (the "competitors"
        background, used in order and repeated if too short).
    """

    fact: str
    question: str
    answer: str
    candidates: tuple[str, ...]
    competitors: tuple[str, ...] = ()


def check_count(value: Any, name: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise InputError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def babi_examples(
    n_examples: int = 16,
    seed: int = 0,
    *,
    people: Sequence[str] = PEOPLE,
    places: Sequence[str] = PLACES,
    n_competitors: int = DEFAULT_COMPETITORS,
    space_in_answer: bool = True,
) -> list[RetrievalExample]:
    """``n_examples`` seeded examples: person ``X`` and place ``Y`` drawn uniformly, the fact
    ``"X moved to the Y."``, the question ``"Question: Where is X? Answer: X is in the"``, the
    candidates ``" " + place`` for every place (answer ``" Y"``) and ``n_competitors`` facts
    ``"Z moved to the W."`` with ``Z != X`` (``W`` any place), all from ``numpy.random.default_rng(seed)``.
    ``space_in_answer=False`` moves the space from the candidates to the question's end (for a
    byte-level tokenizer, where a leading space would be every candidate's first token).
    """
    n_examples = check_count(n_examples, "n_examples")
    n_competitors = check_count(n_competitors, "n_competitors", 0)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise InputError(f"seed must be an integer >= 0, got {seed!r}")
    people, places = list(people), list(places)
    if len(set(people)) < 2 or len(set(places)) < 2:
        raise InputError("babi_examples needs at least two distinct people and two distinct places")
    if not isinstance(space_in_answer, bool):
        raise InputError(f"space_in_answer must be True or False, got {space_in_answer!r}")
    space = " " if space_in_answer else ""
    rng = np.random.default_rng(int(seed))
    examples = []
    for _ in range(n_examples):
        person, place = people[int(rng.integers(len(people)))], places[int(rng.integers(len(places)))]
        others = [p for p in people if p != person]
        competitors = tuple(
            FACT_TEMPLATE.format(
                person=others[int(rng.integers(len(others)))], place=places[int(rng.integers(len(places)))]
            )
            for _ in range(n_competitors)
        )
        examples.append(
            RetrievalExample(
                fact=FACT_TEMPLATE.format(person=person, place=place),
                question=QUESTION_TEMPLATE.format(person=person) + ("" if space else " "),
                answer=space + place,
                candidates=tuple(space + p for p in places),
                competitors=competitors,
            )
        )
    return examples


def check_examples(examples: Any) -> list[RetrievalExample]:
    """``examples`` as a non-empty list of :class:`RetrievalExample`, each checked (strings, answer among candidates)."""
    items = [examples] if isinstance(examples, RetrievalExample) else examples
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
        raise InputError(f"examples must be a non-empty list of RetrievalExample, got {examples!r:.80}")
    for item in items:
        if not isinstance(item, RetrievalExample):
            raise InputError(f"every example must be a RetrievalExample, got {item!r:.80}")
        texts = [item.fact, item.question, item.answer, *item.candidates, *item.competitors]
        if not all(isinstance(s, str) and s.strip() for s in texts):
            raise InputError(f"every text of an example must be a non-empty string: {item!r:.120}")
        if len(set(item.candidates)) != len(item.candidates) or item.answer not in item.candidates:
            raise InputError(f"the answer {item.answer!r} must be one of distinct candidates {item.candidates!r}")
    return list(items)


def parse_examples(data: Any, source: str = "examples") -> list[RetrievalExample]:
    """Examples from JSON data: a non-empty list of objects with the keys of :data:`EXAMPLE_KEYS`.

    ``fact``, ``question`` and ``answer`` are required non-empty strings; ``candidates`` (a list of
    at least two distinct strings holding the answer) defaults to every distinct answer in the
    list; ``competitors`` (a list of strings) defaults to the other examples' facts. Any other key,
    type or shape is refused with one :class:`InputError` naming the item (``source`` names the file).
    """
    if not isinstance(data, list) or not data:
        raise InputError(
            f"{source}: expected a non-empty JSON list of objects like "
            '{"fact": "Mary moved to the garden.", "question": "Where is Mary? In the", "answer": " garden"}'
        )
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise InputError(
                f"{source}: item {i} is {json.dumps(item)[:60]}, not an object with fact, question, answer"
            )
        unknown = sorted(set(item) - set(EXAMPLE_KEYS))
        if unknown:
            raise InputError(f"{source}: item {i} has unknown keys {unknown}; allowed: {', '.join(EXAMPLE_KEYS)}")
        for key in ("fact", "question", "answer"):
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise InputError(f"{source}: item {i} needs {key!r} as a non-empty string")
        for key in ("candidates", "competitors"):
            value = item.get(key, [])
            if not isinstance(value, list) or not all(isinstance(s, str) and s.strip() for s in value):
                raise InputError(f"{source}: item {i}: {key!r} must be a list of non-empty strings")
    answers = tuple(dict.fromkeys(item["answer"] for item in data))
    examples = []
    for i, item in enumerate(data):
        candidates = tuple(item.get("candidates") or answers)
        if len(candidates) < 2 or len(set(candidates)) != len(candidates) or item["answer"] not in candidates:
            raise InputError(
                f"{source}: item {i} needs at least two distinct candidates holding its answer {item['answer']!r} "
                f"(got {list(candidates)}): give 'candidates', or more examples with other answers"
            )
        competitors = item.get("competitors") or [other["fact"] for j, other in enumerate(data) if j != i]
        examples.append(
            RetrievalExample(item["fact"], item["question"], item["answer"], candidates, tuple(competitors))
        )
    return examples


def read_examples(path: str | Path) -> list[RetrievalExample]:
    """:func:`parse_examples` of a UTF-8 JSON file; a missing or malformed file is one :class:`InputError`."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path}: cannot read a JSON list of examples ({type(exc).__name__}: {exc})") from None
    return parse_examples(data, str(path))


def examples_sha256(examples: Sequence[RetrievalExample]) -> str:
    """SHA-256 of the examples' JSON form: the examples' part of a run's identity."""
    text = json.dumps([asdict(e) for e in examples], sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


__all__ = [
    "DEFAULT_COMPETITORS",
    "EXAMPLE_KEYS",
    "PEOPLE",
    "PLACES",
    "RetrievalExample",
    "babi_examples",
    "check_examples",
    "examples_sha256",
    "parse_examples",
    "read_examples",
]
