"""The shared numerical kernels of core/numerics.py."""

from __future__ import annotations

import pytest
import torch

from tl_geometry.core.numerics import local_errors


def plain_local_errors(z, centers, mass):
    """The definitions' formulas, one tensor expression each (definitions §7)."""
    z_norm = torch.linalg.vector_norm(z, dim=-1)
    deletion = torch.linalg.vector_norm(z - centers, dim=-1) / z_norm
    renormalised = torch.linalg.vector_norm(z - centers / mass[..., None], dim=-1) / z_norm
    nan = torch.full_like(deletion, torch.nan)
    return torch.where(z_norm > 0, deletion, nan), torch.where((z_norm > 0) & (mass > 0), renormalised, nan)


@pytest.mark.parametrize(
    ("z_shape", "centers_shape", "mass_dtype"),
    [
        ((3, 1, 1, 5), (3, 2, 7, 5), torch.float64),  # the engines' shapes: one temporary reused
        ((3, 4, 5), (4, 5), torch.float64),  # z broadcasts wider than the centres
        ((3, 1, 5), (3, 7, 5), torch.float32),  # a mass of another dtype
    ],
)
@pytest.mark.parametrize("given_work", [False, True])
def test_local_errors_are_the_plain_formulas_bit_for_bit(z_shape, centers_shape, mass_dtype, given_work):
    """The plain formulas' numbers, with a new temporary or in a given ``work`` tensor (a reused
    work tensor, which then holds the differences)."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(z_shape, dtype=torch.float64, generator=g)
    centers = torch.randn(centers_shape, dtype=torch.float64, generator=g).cumsum(-2)
    mass = torch.rand(centers_shape[:-1], dtype=torch.float64, generator=g).cumsum(-1).to(mass_dtype)
    z[0] = 0.0  # NaN where z = 0
    mass[..., 0] = 0.0  # and, for the second, where M_S = 0
    work = torch.full(torch.broadcast_shapes(z_shape, centers_shape), torch.nan, dtype=torch.float64)
    for got, want in zip(
        local_errors(z, centers, mass, work if given_work else None), plain_local_errors(z, centers, mass)
    ):
        assert torch.equal(got.nan_to_num(-1.0), want.nan_to_num(-1.0))
        assert bool(got.isnan().any())
    assert bool(work.isnan().any()) != given_work  # written only when given: the differences went there
