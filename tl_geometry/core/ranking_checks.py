"""The rankings and distances by name, and the checks of ``rank_by``, ``distance``, ``n_random`` and ``seed``.

Plain Python and numpy, no torch: the settings and the command line's options are built from these
without loading torch (``tl-geometry --help`` stays fast). :mod:`tl_geometry.core.rankings` holds
the rankings themselves.

Examples
--------
>>> check_rankings(["attention", "random", "attention"]), check_distance("cosine")
(('attention', 'random'), 'cosine')
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np

from tl_geometry.errors import InputError

#: Every ranking ``rank_by`` may name (definitions §7).
RANKINGS = ("attention", "contribution", "random", "sink_window")
#: The rankings whose order depends on the row's own numbers only (one "draw").
DETERMINISTIC_RANKINGS = ("attention", "contribution", "sink_window")
#: Every distance ``distance`` may name (definitions §7).
DISTANCES = ("euclidean", "cosine")
#: Default number of random draws per row for ``rank_by="random"``.
DEFAULT_N_RANDOM = 16


def check_rank_by(rank_by: Any) -> str:
    """``rank_by`` if it names a ranking; otherwise one :class:`InputError` listing them."""
    if not isinstance(rank_by, str) or rank_by not in RANKINGS:
        raise InputError(f"rank_by={rank_by!r} is not a ranking: use one of {', '.join(map(repr, RANKINGS))}")
    return rank_by


def check_rankings(rank_by: Any) -> tuple[str, ...]:
    """One ranking or several (a string or a sequence of strings) as a tuple without duplicates, in order.

    >>> check_rankings("attention"), check_rankings(["attention", "random", "attention"])
    (('attention',), ('attention', 'random'))
    """
    names = [rank_by] if isinstance(rank_by, str) else rank_by
    if not isinstance(names, (Sequence, np.ndarray)) or len(names) == 0:
        raise InputError(
            f"rank_by must be a ranking or a non-empty list of them ({', '.join(RANKINGS)}), got {rank_by!r}"
        )
    return tuple(dict.fromkeys(check_rank_by(name) for name in names))


def check_distance(distance: Any) -> str:
    """``distance`` if it names a distance; otherwise one :class:`InputError` listing them."""
    if not isinstance(distance, str) or distance not in DISTANCES:
        raise InputError(f"distance={distance!r} is not a distance: use one of {', '.join(map(repr, DISTANCES))}")
    return distance


def check_n_random(n_random: Any) -> int:
    """``n_random`` (draws of the random control) as an int >= 1; otherwise one :class:`InputError`."""
    if isinstance(n_random, (bool, np.bool_)) or not isinstance(n_random, numbers.Integral) or n_random < 1:
        raise InputError(f"n_random must be an integer >= 1 (the number of random draws per row), got {n_random!r}")
    return int(n_random)


#: Seeds are 64-bit words: any integer in ``[SEED_MIN, SEED_MAX]`` (its two's-complement bits).
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1


def check_seed(seed: Any) -> int:
    """``seed`` as an int in ``[-2^63, 2^64 - 1]``; otherwise one :class:`InputError`.

    A seed is hashed as the 64 bits of its two's complement, so ``2^64 - 1`` and ``-1`` are the
    same seed (see :func:`seed_word`).

    >>> check_seed(2**64)
    Traceback (most recent call last):
    ...
    tl_geometry.errors.InputError: seed must be an integer from -2**63 to 2**64 - 1 (a 64-bit word), got 18446744073709551616
    """
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise InputError(f"seed must be an integer, got {seed!r}")
    if not SEED_MIN <= int(seed) <= SEED_MAX:
        raise InputError(f"seed must be an integer from -2**63 to 2**64 - 1 (a 64-bit word), got {seed!r}")
    return int(seed)


def seed_word(seed: int) -> int:
    """The signed int64 holding the 64 bits of ``seed`` (``seed`` as checked by :func:`check_seed`).

    >>> seed_word(2**64 - 1), seed_word(7)
    (-1, 7)
    """
    seed = check_seed(seed)
    return seed - (1 << 64) if seed > (1 << 63) - 1 else seed


__all__ = [
    "DEFAULT_N_RANDOM",
    "DETERMINISTIC_RANKINGS",
    "DISTANCES",
    "RANKINGS",
    "SEED_MAX",
    "SEED_MIN",
    "check_distance",
    "check_n_random",
    "check_rank_by",
    "check_rankings",
    "check_seed",
    "seed_word",
]
