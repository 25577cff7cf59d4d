"""Mergeable first and second moments: ``(count, mean, M2)`` states, exact for any batching.

A state holds, per element, the number of observations ``n``, their mean and
``M2 = sum (x - mean)^2``; the population standard deviation is ``sqrt(M2 / n)``. A batch's state
is computed in two passes (mean first, then squared deviations), and two states merge with Chan
et al.'s parallel update::

    n = n_a + n_b    delta = mean_b - mean_a
    mean = mean_a + delta n_b / n    M2 = M2_a + M2_b + delta^2 n_a n_b / n

Every term of ``M2`` is non-negative, so one process, any batching, any resume and any number of
ranks agree to rounding: a standard deviation to about ``eps |mean|`` absolute, ``eps |mean| / std``
relative (``1e-12`` for a spread down to ``1e-4`` of the mean; a spread within
:data:`ROUNDING_SPREAD` of the mean, equal values included, is exactly 0), where sums of squares
(``E[x^2] - E[x]^2``) lose ``eps (mean / std)^2``, all of it below a spread of ``1e-8`` of the
mean. Derivation: docs/architecture.md ("Exact merges").

Examples
--------
>>> import torch
>>> x = torch.tensor([1e8 + 1, 1e8 + 2, 1e8 + 3, 1e8 + 4], dtype=torch.float64)
>>> a, b = Moments.of(x[:1]), Moments.of(x[1:])
>>> merged = a.merge(b)
>>> float(merged.mean), float(merged.std())      # sqrt(1.25), exactly
(100000002.5, 1.118033988749895)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: The dtype of every state.
MOMENTS_DTYPE = torch.float64
#: A standard deviation at most this fraction of its mean (256 units in the last place of float64)
#: is reported as exactly 0: below it the merges' rounding (about ``eps |mean|``) is a large part
#: of the value, so that one process and torchrun would give different numbers for no spread.
ROUNDING_SPREAD = 2.0**-44


@dataclass(frozen=True)
class Moments:
    """Count, mean and sum of squared deviations of some observations, element by element.

    Attributes
    ----------
    count, mean, m2 : Tensor [...] float64
        ``n``, ``mean`` and ``M2 = sum (x - mean)^2`` of each element's observations (one shape
        for the three). Where ``n = 0`` the mean and ``M2`` are 0.
    """

    count: Tensor
    mean: Tensor
    m2: Tensor

    @classmethod
    def zeros(cls, shape: tuple[int, ...] | torch.Size) -> "Moments":
        """The state of no observation."""
        zero = torch.zeros(shape, dtype=MOMENTS_DTYPE)
        return cls(zero, zero.clone(), zero.clone())

    @classmethod
    def of(cls, x: Tensor, dim: int = 0, defined: Tensor | None = None) -> "Moments":
        """The state of the observations of ``x`` along ``dim`` (two passes, in float64).

        Parameters
        ----------
        x : Tensor
            Observations; ``dim`` indexes them, the other axes are the elements.
        dim : int, default 0
            The axis of the observations (it disappears from the state).
        defined : bool Tensor of ``x``'s shape or None, default None
            Which observations count (None: every one). Those not defined may hold anything,
            NaN included.
        """
        x = x.to(MOMENTS_DTYPE)
        if defined is None:
            defined = torch.ones((), dtype=torch.bool, device=x.device).expand(x.shape)
        x = torch.where(defined, x, 0.0)
        count = defined.sum(dim).to(MOMENTS_DTYPE)
        safe = count.clamp_min(1)
        mean = x.sum(dim) / safe
        # one refinement: the mean of the deviations corrects the rounding of the sum, so equal
        # values give exactly their value (and M2 = 0) for any count
        deviation = torch.where(defined, x - mean.unsqueeze(dim), 0.0)
        mean = torch.where(count > 0, mean + deviation.sum(dim) / safe, 0.0)
        m2 = torch.where(defined, x - mean.unsqueeze(dim), 0.0).square().sum(dim)
        return cls(count, mean, m2)

    def merge(self, other: "Moments") -> "Moments":
        """The state of both sets of observations (Chan et al.'s parallel update)."""
        n = self.count + other.count
        safe = n.clamp_min(1)
        delta = other.mean - self.mean
        mean = torch.where(n > 0, self.mean + delta * (other.count / safe), 0.0)
        m2 = self.m2 + other.m2 + delta.square() * (self.count * other.count / safe)
        return Moments(n, mean, m2)

    def reduce(self, dim: int) -> "Moments":
        """Merge the states along ``dim`` into one (the axis disappears): every group at once.

        ``n = sum n_i``, ``mean = sum n_i mean_i / n``, ``M2 = sum M2_i + sum n_i (mean_i - mean)^2``.
        """
        n = self.count.sum(dim)
        safe = n.clamp_min(1)
        mean = torch.where(n > 0, (self.count * self.mean).sum(dim) / safe, 0.0)
        spread = (self.count * (self.mean - mean.unsqueeze(dim)).square()).sum(dim)
        return Moments(n, mean, self.m2.sum(dim) + spread)

    def std(self) -> Tensor:
        """Population standard deviation ``sqrt(M2 / n)``; NaN where ``n = 0``; exactly 0 where it is
        at most :data:`ROUNDING_SPREAD` of the mean (a spread of a few units in the last place:
        the rounding of the values and of the merges, which differs with the order of the merges)."""
        std = (self.m2 / self.count.clamp_min(1)).sqrt()
        std = torch.where(std <= ROUNDING_SPREAD * self.mean.abs(), 0.0, std)
        return torch.where(self.count > 0, std, torch.nan)

    def mean_or_nan(self) -> Tensor:
        """The mean; NaN where ``n = 0``."""
        return torch.where(self.count > 0, self.mean, torch.nan)

    def state_dict(self) -> dict[str, Tensor]:
        """Copies of the three tensors (``torch.save``-able)."""
        return {"count": self.count.clone(), "mean": self.mean.clone(), "m2": self.m2.clone()}

    @classmethod
    def from_state_dict(cls, state: dict[str, Tensor]) -> "Moments":
        """The state saved by :meth:`state_dict`."""
        return cls(*(state[k].to(MOMENTS_DTYPE).clone() for k in ("count", "mean", "m2")))


__all__ = ["MOMENTS_DTYPE", "ROUNDING_SPREAD", "Moments"]
