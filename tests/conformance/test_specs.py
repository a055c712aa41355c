"""Specs, as TorchRL's test_specs.py checks them."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from aenv.exceptions import LockedSpecError, SpecError
from aenv.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    OneHot,
    StackedComposite,
    Unbounded,
    make_composite_from_td,
)

pytestmark = pytest.mark.timeout(30)


def test_multi_categorical_to_one_hot_and_back():
    # issue 24 item 1: the conversion the other discrete specs have
    spec = MultiCategorical([2, 3, 4], shape=(5, 3))
    one_hot_spec = spec.to_one_hot_spec()
    assert isinstance(one_hot_spec, MultiOneHot) and one_hot_spec.shape == (5, 9)
    value = spec.rand()
    encoded = spec.to_one_hot(value)
    assert one_hot_spec.is_in(encoded)
    assert torch.equal(one_hot_spec.to_categorical(encoded), value)
    assert one_hot_spec.to_categorical_spec() == spec


@pytest.mark.parametrize(
    "spec, leaf",
    [
        (Bounded(-1.0, 1.0, shape=(3,)), lambda s: s),
        (Composite(a=Bounded(-1.0, 1.0, shape=(2, 3)), shape=(2,)), lambda s: s["a"]),
        (
            torch.stack([Bounded(-1.0, 1.0, shape=(3,)), Bounded(-1.0, 1.0, shape=(2,))], 0),
            lambda s: s[0],
        ),
    ],
    ids=["leaf", "composite", "stacked"],
)
def test_expand_to_own_shape_is_a_copy(spec, leaf):
    # issue 24 item 1: writing into the "copy" must leave the original alone
    copy = spec.expand(spec.shape)
    assert copy == spec and copy is not spec
    leaf(copy).low.view(-1)[0] = -2.0
    assert float(leaf(spec).low.reshape(-1)[0]) == -1.0


def test_expand_prepends_dims_and_samples_inside():
    spec = Categorical(4, shape=(2,))
    big = spec.expand(5, 2)
    assert big.shape == (5, 2) and big.is_in(big.rand()) and big[0] == spec
    with pytest.raises(SpecError, match="end with"):
        spec.expand(5, 3)


def test_categorical_and_one_hot_round_trip():
    cat = Categorical(5, shape=(4,))
    one_hot = cat.to_one_hot_spec()
    assert isinstance(one_hot, OneHot) and one_hot.shape == (4, 5)
    value = cat.rand()
    assert torch.equal(one_hot.to_categorical(cat.to_one_hot(value)), value)
    assert one_hot.to_categorical_spec() == cat


def test_one_hot_rand_has_one_element_set():
    spec = OneHot(6, shape=(10, 6))
    sample = spec.rand()
    assert sample.dtype == torch.bool and (sample.sum(-1) == 1).all()


def test_multi_one_hot_encodes_category_indices():
    # a smaller difference of issue 24: indices are one-hot encoded, as in TorchRL
    spec = MultiOneHot([2, 3])
    assert spec.encode([1, 2]).tolist() == [False, True, False, False, True]
    assert spec.encode(torch.tensor([0, 1, 0, 0, 1])).tolist() == [
        False,
        True,
        False,
        False,
        True,
    ]
    with pytest.raises(SpecError, match="nvec"):
        spec.encode([2, 0])


def test_bounded_is_in_and_project():
    spec = Bounded(-1.0, 1.0, shape=(3,))
    outside = torch.tensor([-3.0, 0.5, 3.0])
    assert not spec.is_in(outside)
    projected = spec.project(outside)
    assert spec.is_in(projected) and projected.tolist() == [-1.0, 0.5, 1.0]


def test_binary_and_categorical_dtypes():
    assert Binary(n=4, dtype=torch.int8).rand().dtype == torch.int8
    cat = Categorical(3, shape=(2,), dtype=torch.int32)
    assert cat.rand().dtype == torch.int32 and cat.n == 3
    assert not cat.is_in(torch.tensor([0, 3], dtype=torch.int32))


def test_composite_nested_keys_rand_and_zero():
    spec = Composite(
        obs=Unbounded((4, 3)),
        agents=Composite(action=Categorical(2, shape=(4, 2, 1)), shape=(4, 2)),
        shape=(4,),
    )
    assert set(spec.keys(include_nested=True, leaves_only=True)) == {"obs", ("agents", "action")}
    assert spec["agents", "action"].shape == (4, 2, 1)
    sample = spec.rand()
    assert sample.batch_size == (4,) and spec.is_in(sample)
    assert (spec.zero() == 0).all()


def test_composite_index_and_unbind():
    spec = Composite(obs=Unbounded((4, 3)), shape=(4,))
    assert spec[0].shape == () and spec[0]["obs"].shape == (3,)
    parts = spec.unbind(0)
    assert len(parts) == 4 and all(p == spec[0] for p in parts)


def test_locked_composite_refuses_writes():
    spec = Composite(obs=Unbounded((3,))).lock_()
    with pytest.raises(LockedSpecError):
        spec["other"] = Unbounded((1,))
    spec.unlock_()
    spec["other"] = Unbounded((1,))
    assert "other" in spec.keys()


def test_clone_is_independent():
    spec = Composite(obs=Bounded(0.0, 1.0, shape=(2,)))
    clone = spec.clone()
    assert clone == spec
    clone["obs"].high[0] = 5.0
    assert float(spec["obs"].high[0]) == 1.0


def test_stack_of_equal_specs_is_dense_and_of_different_specs_keeps_each():
    a, b = Unbounded((3,)), Unbounded((3,))
    dense = torch.stack([a, b], 0)
    assert dense.shape == (2, 3) and not hasattr(dense, "_stack")
    mixed = torch.stack([Composite(x=Unbounded((3,))), Composite(x=Unbounded((2,)))], 0)
    assert isinstance(mixed, StackedComposite)
    assert mixed.shape == (2,) and mixed[1]["x"].shape == (2,) and mixed["x"].shape == (2, -1)
    sample = mixed.rand()
    assert sample[0]["x"].shape == (3,) and sample[1]["x"].shape == (2,)
    assert mixed.is_in(sample)


def test_composite_from_data():
    data = TensorDict(
        {
            "obs": torch.randn(3),
            "action": torch.zeros(2, dtype=torch.int32),
            "next": {"obs": torch.randn(3), "done": torch.zeros(1, dtype=torch.bool)},
        },
        [],
    )
    spec = make_composite_from_td(data)
    assert (spec.zero() == data.clone().zero_()).all()
    for key, value in data.items(True, True):
        assert spec[key].dtype == value.dtype and spec[key].shape == value.shape


def test_composite_rejects_none_entries():
    # aenv differs on purpose: TorchRL keeps None as an empty placeholder; aenv asks for a
    # spec, so that every key of a composite has a shape and dtype
    with pytest.raises((SpecError, TypeError)):
        Composite(obs=None)
