"""The building blocks of the diagnostics accumulators: keyed running sums and moments, states, checks, the median.

Sums (means of per-sequence statistics) merge by addition; spreads merge as
:class:`~tl_geometry.core.moments.Moments` (count, mean, ``M2``), never as sums of squares, so a
standard deviation is the same for any batching, resume and number of ranks.
"""

from __future__ import annotations

from typing import Any, TypeVar

from torch import Tensor

from tl_geometry.core.checks import all_finite
from tl_geometry.core.moments import Moments
from tl_geometry.errors import InputError


def median_last(x: Tensor) -> Tensor:
    """The median along the last axis, the mean of the two middle values for an even count.

    ``torch.median`` returns the lower middle value for an even count; definitions §3's median is the
    usual one.
    """
    n = x.shape[-1]
    s = x.sort(dim=-1).values
    mid = n // 2
    if n % 2:
        return s[..., mid]
    return 0.5 * (s[..., mid - 1] + s[..., mid])


def check_finite(x: Tensor, what: str) -> None:
    """Raise :class:`InputError` when ``x`` holds NaN or inf (a diagnostic of it would be NaN)."""
    if not all_finite(x):
        raise InputError(
            f"{what} contain NaN or inf: check the model's dtype (fp16 overflow) or the tensor you passed; "
            "the diagnostics are undefined for non-finite inputs"
        )


def check_same(name: str, mine: Any, theirs: Any, what: str) -> None:
    """Refuse to merge accumulators built with different geometry or settings."""
    if mine != theirs:
        raise InputError(
            f"cannot merge {name} accumulators with different {what} ({mine} vs {theirs}): "
            "merge only results of the same model, window length and settings"
        )


def as_state(obj: Any) -> Any:
    """Tensors are cloned so a saved state never aliases a live accumulator."""
    if isinstance(obj, Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: as_state(v) for k, v in obj.items()}
    return obj


_Sums = TypeVar("_Sums", bound="KeyedSums")


class KeyedSums:
    """Base of the per-layer accumulators that keep named float64 sums and moments over sequences.

    A subclass sets :attr:`name`, creates ``self.sums`` and ``self.moments`` in
    ``_init(n_keys, n_kv_heads)`` (which also checks the geometry of later batches), and adds each
    batch with :meth:`_add` (a tensor is added to the sum of its name, a :class:`Moments` merged). Merging,
    saving and restoring are shared; :meth:`_check_settings` and :meth:`_extra_state` let a
    subclass refuse or save its own settings.
    """

    name = "accumulator"

    def __init__(self) -> None:
        self.n_seqs = 0
        self.n_keys: int | None = None
        self.n_kv_heads: int | None = None
        self.sums: dict[str, Tensor] = {}
        self.moments: dict[str, Moments] = {}

    def _init(self, n_keys: int, n_kv: int) -> None:
        raise NotImplementedError

    def geometry(self) -> tuple[int, int]:
        """``(n_keys, n_kv_heads)`` of the sequences added; an error before the first one."""
        if self.n_keys is None or self.n_kv_heads is None:
            raise InputError(f"the {self.name} accumulator holds no sequence yet")
        return self.n_keys, self.n_kv_heads

    def _start(self, values: Tensor, min_keys: int, needs: str) -> bool:
        """Check a batch ``values`` ``[batch, key, kv_head, d_head]`` and size the sums for it.

        Raises :class:`InputError` ("``needs``, got ``K``") when it has fewer than ``min_keys``
        positions; returns False when it holds no sequence (nothing to add).
        """
        b, n_keys, n_kv, _ = values.shape
        check_finite(values, "value vectors")
        if n_keys < min_keys:
            raise InputError(f"{needs}, got {n_keys}")
        if b == 0:
            return False
        self._init(n_keys, n_kv)
        return True

    def _add(self, add: dict[str, Tensor | Moments], n_seqs: int) -> None:
        for k, v in add.items():
            if isinstance(v, Moments):
                self.moments[k] = self.moments[k].merge(v)
            else:
                self.sums[k] += v
        self.n_seqs += n_seqs

    def _check_settings(self, other: "KeyedSums") -> None:
        """Raise if ``other`` was built with other settings (none by default)."""

    def merge(self: _Sums, other: "KeyedSums") -> _Sums:
        """Add ``other``'s sequences to this accumulator (in place; returns ``self``)."""
        self._check_settings(other)
        if other.n_seqs == 0:
            return self
        if self.n_seqs == 0:
            self._init(*other.geometry())
        geometry = (self.n_keys, self.n_kv_heads), (other.n_keys, other.n_kv_heads)
        check_same(self.name, *geometry, "(n_keys, n_kv_heads)")
        self._add({**other.sums, **other.moments}, other.n_seqs)
        return self

    def _extra_state(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        """A copy of the accumulator's state (tensors and ints), e.g. for ``torch.save``."""
        return as_state(
            {
                **self._extra_state(),
                "n_seqs": self.n_seqs,
                "n_keys": self.n_keys,
                "n_kv_heads": self.n_kv_heads,
                "sums": self.sums,
                "moments": {k: m.state_dict() for k, m in self.moments.items()},
            }
        )

    def _load_state(self: _Sums, state: dict) -> _Sums:
        self.n_seqs = int(state["n_seqs"])
        self.n_keys = state["n_keys"]
        self.n_kv_heads = state["n_kv_heads"]
        self.sums = as_state(dict(state["sums"]))
        self.moments = {k: Moments.from_state_dict(m) for k, m in state["moments"].items()}
        return self
