"""``torch.stack`` of n references to one spec (a pool's envs sharing their specs) takes
a path that does not look at every reference; it must give what stacking n equal copies
gives."""

from __future__ import annotations

import pytest
import torch

from aenv.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    NonTensor,
    OneHot,
    Stacked,
    StackedComposite,
    TensorSpec,
    Unbounded,
)


class _MyComposite(Composite):
    """A Composite subclass: stacks lazily, as the general path has it."""


def _specs() -> list[TensorSpec]:
    nested = Composite(
        obs=Unbounded((3,)),
        act=Bounded(-1.0, 1.0, (2,)),
        inner=Composite(
            cat=Categorical(4, (1,), mask=torch.tensor([True, False, True, True])),
            hot=OneHot(3),
            text=NonTensor(shape=(), example_data="hi"),
        ),
        bits=Binary(3, shape=(3,), dtype=torch.bool),
        multi=MultiCategorical([2, 3]),
    )
    batched = Composite(
        x=Unbounded((2, 4)), y=Composite(z=Unbounded((2, 1)), shape=(2,)), shape=(2,)
    )
    return [
        Unbounded((3,)),
        Bounded(0.0, 2.0, (2, 2)),
        Categorical(5, (1,), dtype=torch.int32),
        OneHot(4),
        Binary(2, shape=(2,)),
        NonTensor(shape=(), example_data="a"),
        MultiCategorical([2, 2]),
        Unbounded((2, -1, 3)),  # a dynamic dim
        nested,
        batched,
        _MyComposite(a=Unbounded((1,))),
        Composite(),
    ]


def _same_result(a: TensorSpec, b: TensorSpec) -> None:
    assert type(a) is type(b)
    assert a.shape == b.shape
    if isinstance(a, (Stacked, StackedComposite)):
        assert [type(s) for s in a.unbind(a.stack_dim)] == [type(s) for s in b.unbind(b.stack_dim)]
        assert a.stack_dim == b.stack_dim
    else:
        assert a == b
    if isinstance(a, Composite) and not isinstance(a, StackedComposite):
        assert list(a.keys(True, True)) == list(b.keys(True, True))
        for key in a.keys(True, True):
            _same_result(a[key], b[key])


@pytest.mark.parametrize("index", range(len(_specs())))
@pytest.mark.parametrize("dim", [0, -1, 1])
def test_stacking_one_spec_n_times_matches_stacking_copies(index: int, dim: int) -> None:
    spec = _specs()[index]
    if dim != 0 and spec.ndim == 0:
        dim = 0
    n = 5
    same = torch.stack([spec] * n, dim)
    copies = torch.stack([spec.clone() for _ in range(n)], dim)
    _same_result(same, copies)
    # the result is a new spec: changing it leaves the stacked one alone
    if isinstance(same, Composite) and not isinstance(same, StackedComposite):
        same["added"] = Unbounded(same.shape)
        assert "added" not in spec.keys()


def test_stacking_a_locked_shared_spec_gives_an_unlocked_one() -> None:
    spec = Composite(obs=Unbounded((3,)), inner=Composite(x=Unbounded((1,))))._share_()
    out = torch.stack([spec] * 4, 0)
    assert out.shape == (4,) and not out.is_locked
    out["extra"] = Unbounded((4, 1))
    out["inner", "y"] = Unbounded((4, 2))
    assert "extra" not in spec.keys() and "y" not in spec["inner"].keys()
    assert spec.is_locked
