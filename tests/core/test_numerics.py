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
def test_local_errors_are_the_plain_formulas_bit_for_bit(z_shape, centers_shape, mass_dtype):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(z_shape, dtype=torch.float64, generator=g)
    centers = torch.randn(centers_shape, dtype=torch.float64, generator=g).cumsum(-2)
    mass = torch.rand(centers_shape[:-1], dtype=torch.float64, generator=g).cumsum(-1).to(mass_dtype)
    z[0] = 0.0  # NaN where z = 0
    mass[..., 0] = 0.0  # and, for the second, where M_S = 0
    for got, want in zip(local_errors(z, centers, mass), plain_local_errors(z, centers, mass)):
        assert torch.equal(got.nan_to_num(-1.0), want.nan_to_num(-1.0))
        assert bool(got.isnan().any())


@pytest.mark.parametrize(
    ("z_shape", "centers_shape", "mass_dtype"),
    [
        ((3, 1, 1, 5), (3, 2, 7, 5), torch.float64),
        ((3, 4, 5), (4, 5), torch.float64),
        ((3, 1, 5), (3, 7, 5), torch.float32),
    ],
)
def test_local_errors_in_a_given_work_tensor_are_the_same_numbers(z_shape, centers_shape, mass_dtype):
    """``work`` holds the differences (a reused work tensor) and changes no number."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(z_shape, dtype=torch.float64, generator=g)
    centers = torch.randn(centers_shape, dtype=torch.float64, generator=g).cumsum(-2)
    mass = torch.rand(centers_shape[:-1], dtype=torch.float64, generator=g).cumsum(-1).to(mass_dtype)
    z[0], mass[..., 0] = 0.0, 0.0
    work = torch.full(torch.broadcast_shapes(z_shape, centers_shape), torch.nan, dtype=torch.float64)
    for got, want in zip(local_errors(z, centers, mass, work), plain_local_errors(z, centers, mass)):
        assert torch.equal(got.nan_to_num(-1.0), want.nan_to_num(-1.0))
    assert not bool(work.isnan().any())  # written: the differences went there
