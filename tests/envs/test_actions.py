"""The action dtype rule: a value the spec's dtype holds exactly is cast; others raise."""

from __future__ import annotations

import pytest
import torch

from aenv.envs._actions import cast_action
from aenv.exceptions import SpecViolationError
from aenv.specs import Binary, Bounded, Categorical, Unbounded


@pytest.mark.parametrize(
    "spec, value",
    [
        (Binary(n=3, dtype=torch.int8), torch.tensor([1.0, 0.0, 1.0])),
        (Categorical(4, shape=(2,)), torch.tensor([3, 0], dtype=torch.int32)),
        (Binary(n=2, dtype=torch.bool), torch.tensor([1, 0])),
        (Bounded(-1.0, 1.0, shape=(2,)), torch.tensor([0.1, -0.3], dtype=torch.float64)),
        (Unbounded((2,)), torch.tensor([1, 2])),
        (Unbounded((2,), dtype=torch.complex64), torch.tensor([1.5, 2.0])),
        (Unbounded((2,)), torch.tensor([1 + 0j, 2 + 0j])),
    ],
)
def test_values_the_dtype_holds_are_cast(spec, value):
    out = cast_action("action", spec, value)
    assert out.dtype == spec.dtype
    torch.testing.assert_close(
        out.to(torch.complex128), value.to(torch.complex128), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize(
    "spec, value, shown",
    [
        (Categorical(4, shape=(2,)), torch.tensor([0.5, 1.0]), "0.5"),
        (Binary(n=2, dtype=torch.int8), torch.tensor([300, 1]), "300"),
        (Binary(n=2, dtype=torch.bool), torch.tensor([2.0, 1.0]), "2.0"),
        (Categorical(4, shape=(1,)), torch.tensor([float("nan")]), "nan"),
        (Unbounded((1,), dtype=torch.float16), torch.tensor([1e6]), "1000000.0"),
        (Unbounded((1,)), torch.tensor([1 + 1j]), "(1+1j)"),
    ],
)
def test_values_the_dtype_cannot_hold_raise_naming_key_spec_and_value(spec, value, shown):
    with pytest.raises(SpecViolationError) as info:
        cast_action(("agents", "action"), spec, value)
    message = str(info.value)
    assert "('agents', 'action')" in message and type(spec).__name__ in message
    assert shown in message and info.value.key == ("agents", "action")
