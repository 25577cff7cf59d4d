"""The row checks: each bad weight or value gives its own clear error, whatever its sign."""

from __future__ import annotations

import pytest
import torch

from tl_geometry.core.checks import check_row_inputs
from tl_geometry.errors import InputError


@pytest.mark.parametrize(
    ("weight", "value", "message"),
    [
        (torch.nan, 0.0, "weights contain NaN or inf"),
        (torch.inf, 0.0, "weights contain NaN or inf"),
        (-torch.inf, 0.0, "weights contain NaN or inf"),
        (-0.25, 0.0, "must be non-negative"),
        (0.25, torch.nan, "value vectors contain NaN or inf"),
        (0.25, torch.inf, "value vectors contain NaN or inf"),
        (0.25, -torch.inf, "value vectors contain NaN or inf"),
    ],
)
def test_check_row_inputs_names_each_bad_input(weight: float, value: float, message: str) -> None:
    weights, values = torch.full((1, 2, 3, 4), 0.25, dtype=torch.float64), torch.ones(1, 4, 1, 2, dtype=torch.float64)
    weights[0, 1, 2, 3], values[0, 2, 0, 1] = weight, value
    with pytest.raises(InputError, match=message):
        check_row_inputs(weights, values)
    check_row_inputs(weights.clamp(0, 1).nan_to_num(0.0), values.nan_to_num(0.0, 0.0, 0.0))  # the fixed rows pass
