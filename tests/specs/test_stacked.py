from __future__ import annotations

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from aenv.exceptions import SpecError, SpecViolationError
from aenv.specs import (
    Bounded,
    Categorical,
    Composite,
    NonTensor,
    OneHot,
    Stacked,
    StackedComposite,
    Unbounded,
    stack_specs,
)


class TestLeafStack:
    def test_identical_gives_plain(self):
        spec = torch.stack([Unbounded((3,)), Unbounded((3,))], 0)
        assert type(spec) is Unbounded and spec.shape == torch.Size([2, 3])
        spec = torch.stack([OneHot(4), OneHot(4), OneHot(4)], dim=0)
        assert type(spec) is OneHot and spec.shape == torch.Size([3, 4])

    def test_dim_argument(self):
        spec = torch.stack([Unbounded((2, 3))] * 4, dim=1)
        assert spec.shape == torch.Size([2, 4, 3])
        spec = torch.stack([Unbounded((2, 3))] * 4, dim=-1)
        assert spec.shape == torch.Size([2, 3, 4])

    def test_different_bounds_stack_params(self):
        a = Bounded(0.0, 1.0, (2,))
        b = Bounded(-5.0, 5.0, (2,))
        spec = torch.stack([a, b], 0)
        assert type(spec) is Bounded and spec.shape == torch.Size([2, 2])
        assert spec.low[:, 0].tolist() == [0.0, -5.0]
        assert spec[1] == b

    def test_masks_stack(self):
        a = Categorical(3, mask=torch.tensor([True, False, False]))
        b = Categorical(3)
        spec = torch.stack([a, b], 0)
        assert type(spec) is Categorical and spec.mask.shape == torch.Size([2, 3])
        for _ in range(5):
            assert spec.rand()[0] == 0

    def test_different_shapes_give_stacked(self):
        a, b = Unbounded((2, 3)), Unbounded((4, 3))
        spec = torch.stack([a, b], 0)
        assert isinstance(spec, Stacked)
        assert spec.shape == torch.Size([2, -1, 3])
        assert spec[0] == a and spec[1] == b
        assert spec.unbind(0) == (a, b)
        assert len(spec) == 2
        val = spec.rand()
        assert val.is_nested
        assert spec.is_in(val)
        assert spec.is_in([a.zero(), b.zero()])
        assert not spec.is_in([b.zero(), a.zero()])
        assert "Stacked" in repr(spec)

    def test_stacked_same_shape_dense(self):
        spec = torch.stack([Categorical(2), Categorical(5)], 0)
        assert isinstance(spec, Stacked) and spec.shape == torch.Size([2])
        val = spec.rand((3,))
        assert val.shape == torch.Size([3, 2])
        assert spec.expand(3, 2).is_in(val)
        assert spec.is_in(torch.tensor([1, 4]))
        assert not spec.is_in(torch.tensor([2, 4]))
        with pytest.raises(SpecViolationError, match="element 0"):
            spec.assert_is_in(torch.tensor([2, 4]))
        assert spec.project(torch.tensor([9, 9])).tolist() == [1, 4]

    def test_stacked_ops(self):
        spec = torch.stack([Unbounded((2,)), Unbounded((3,))], 0)
        exp = spec.expand(5, 2, -1)
        assert exp.shape == torch.Size([5, 2, -1]) and exp.stack_dim == 1
        assert exp[0].shape == torch.Size([2, -1])
        assert exp[0][1] == Unbounded((3,))
        assert spec.unsqueeze(0).shape == torch.Size([1, 2, -1])
        assert spec.clone() == spec
        with pytest.raises(SpecError):
            spec.reshape(4)

    def test_mixed_kinds_rejected(self):
        with pytest.raises(SpecError):
            torch.stack([Unbounded((2,)), Composite()], 0)
        with pytest.raises(SpecError):
            torch.stack([Unbounded((2,)), Unbounded((2, 2))], 0)
        with pytest.raises(SpecError):
            stack_specs([])


def _agent(i: int) -> Composite:
    return Composite(obs=Unbounded((i + 1,)), action=Bounded(-1.0, 1.0, (2,)))


class TestCompositeStack:
    def test_identical_composites(self):
        c = Composite(obs=Unbounded((3,)), next=Composite(r=Unbounded((1,))))
        spec = torch.stack([c, c.clone()], 0)
        assert type(spec) is Composite and spec.shape == torch.Size([2])
        assert spec["next", "r"].shape == torch.Size([2, 1])

    def test_heterogeneous_shapes(self):
        agents = [_agent(i) for i in range(3)]
        spec = torch.stack(agents, 0)
        assert isinstance(spec, StackedComposite)
        assert isinstance(spec, Composite)
        assert spec.shape == torch.Size([3])
        assert spec[1] is agents[1]
        assert spec.unbind(0) == tuple(agents)
        assert list(spec.keys()) == ["obs", "action"]
        assert isinstance(spec["obs"], Stacked)
        assert spec["action"] == Bounded(-1.0, 1.0, (3, 2))
        td = spec.rand()
        assert isinstance(td, LazyStackedTensorDict)
        assert td.batch_size == torch.Size([3])
        assert spec.is_in(td)
        assert spec.is_in(spec.zero())
        assert td[2]["obs"].shape == torch.Size([3])

    def test_heterogeneous_keys(self):
        a = Composite(x=Unbounded((3,)))
        b = Composite(x=Unbounded((3,)), y=Categorical(4))
        spec = torch.stack([a, b], 0)
        assert isinstance(spec, StackedComposite)
        assert list(spec.keys()) == ["x"]
        assert "y" not in spec and "x" in spec
        assert spec.get("y") is None
        assert spec["x"].shape == torch.Size([2, 3])
        td = spec.rand((5,))
        assert td.batch_size == torch.Size([5, 2])
        assert spec.expand(5, 2).is_in(td)
        bad = spec.zero()
        bad.tensordicts[1]["y"] = torch.tensor(7)
        assert not spec.is_in(bad)
        with pytest.raises(SpecViolationError, match="'y'"):
            spec.assert_is_in(bad)

    def test_is_in_rejects_plain_td_of_wrong_size(self):
        spec = torch.stack([_agent(0), _agent(1)], 0)
        assert not spec.is_in(TensorDict(batch_size=[3]))

    def test_lock_and_set(self):
        spec = torch.stack([_agent(0), _agent(1)], 0)
        spec["extra"] = Unbounded((2, 4))
        assert spec[0]["extra"] == Unbounded((4,))
        spec.lock_()
        assert spec[0].is_locked
        with pytest.raises(RuntimeError):
            spec["more"] = Unbounded((2, 1))
        spec.unlock_()
        del spec["extra"]
        assert "extra" not in spec[1]

    def test_ops(self):
        spec = torch.stack([_agent(0), _agent(1)], 0)
        assert spec.clone() == spec
        assert spec.empty().is_empty()
        assert not spec.is_empty()
        exp = spec.expand(4, 2)
        assert exp.shape == torch.Size([4, 2]) and exp.rand().batch_size == torch.Size([4, 2])
        assert spec[0:1].shape == torch.Size([1])
        assert "StackedComposite" in repr(spec)

    def test_multi_agent_leaf_stack_in_composite(self):
        """The seeds' multi-agent pattern: Composite({"action": torch.stack(specs)}, shape=(n,))."""
        specs = [Unbounded((2,)), Unbounded((3,))]
        agents = Composite({"action": torch.stack(specs)}, shape=(2,))
        root = Composite(agents=agents, done=Categorical(2, (1,), dtype=torch.bool))
        td = root.rand()
        assert isinstance(td["agents"], LazyStackedTensorDict)
        assert td["agents"][1]["action"].shape == torch.Size([3])
        assert root.is_in(td)
        assert root.is_in(root.zero())

    def test_nested_stack_with_non_tensor(self):
        a = Composite(text=NonTensor(example_data="a"), x=Unbounded((1,)))
        b = Composite(text=NonTensor(example_data="a"), x=Unbounded((2,)))
        spec = torch.stack([a, b], 0)
        td = spec.zero()
        assert td[0]["text"] == "a"
        assert spec.is_in(td)
