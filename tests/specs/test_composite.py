from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, TensorDict

from aenv.exceptions import LockedSpecError, SpecError, SpecViolationError
from aenv.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    CompositeSpec,
    NonTensor,
    OneHot,
    Unbounded,
    make_composite_from_td,
)


def make_spec(batch=(4,)):
    b = tuple(batch)
    return Composite(
        obs=Unbounded((*b, 3)),
        action=Bounded(-1.0, 1.0, (*b, 2)),
        next=Composite(
            reward=Unbounded((*b, 1)),
            done=Categorical(2, (*b, 1), dtype=torch.bool),
            info=Composite(text=NonTensor(b, example_data="ok"), shape=b),
            shape=b,
        ),
        shape=b,
    )


class TestConstruction:
    def test_shape_and_batch_size(self):
        assert Composite().shape == torch.Size([])
        assert Composite(batch_size=(3,)).shape == torch.Size([3])
        assert Composite(shape=[2, 3]).shape == torch.Size([2, 3])
        with pytest.raises(SpecError):
            Composite(shape=(2,), batch_size=(3,))
        assert CompositeSpec is Composite

    def test_dict_and_kwargs(self):
        spec = Composite({"a": Unbounded((1,))}, b=Unbounded((2,)))
        assert list(spec.keys()) == ["a", "b"]
        assert len(spec) == 2

    def test_child_shape_mismatch(self):
        with pytest.raises(ValueError) as info:
            Composite(obs=Unbounded((3,)), shape=(4,))
        msg = str(info.value)
        assert "'obs'" in msg and "(3,)" in msg and "(4,)" in msg

    def test_none_child_rejected(self):
        with pytest.raises(SpecError, match="TensorSpec"):
            Composite(obs=None)

    def test_bad_key(self):
        spec = Composite()
        with pytest.raises(SpecError):
            spec[3] = Unbounded()
        with pytest.raises(SpecError):
            spec.set(("a", 1), Unbounded())

    def test_device_casts_children(self):
        spec = Composite(obs=Unbounded((3,)), device="cpu")
        assert spec["obs"].device == torch.device("cpu")
        assert spec.zero().device == torch.device("cpu")


class TestMapping:
    def test_nested_get_set(self):
        spec = Composite(shape=(2,))
        spec["a", "b", "c"] = Unbounded((2, 1))
        assert isinstance(spec["a"], Composite) and spec["a"].shape == torch.Size([2])
        assert spec["a", "b"].shape == torch.Size([2])
        assert spec[("a", "b", "c")] == Unbounded((2, 1))
        assert ("a", "b", "c") in spec
        assert ("a", "x") not in spec
        assert ("a",) in spec
        assert spec[("a",)] is spec["a"]

    def test_set_under_leaf_fails(self):
        spec = Composite(a=Unbounded((1,)))
        with pytest.raises(SpecError, match="leaf"):
            spec["a", "b"] = Unbounded((1,))

    def test_get_pop_del(self):
        spec = make_spec()
        assert spec.get("missing") is None
        assert spec.get("missing", 3) == 3
        assert spec.get(("next", "reward")).shape == torch.Size([4, 1])
        popped = spec.pop(("next", "reward"))
        assert popped.shape == torch.Size([4, 1])
        assert ("next", "reward") not in spec
        assert spec.pop("missing", None) is None
        with pytest.raises(KeyError):
            spec.pop("missing")
        del spec["obs"]
        assert "obs" not in spec
        with pytest.raises(KeyError):
            del spec["obs"]
        with pytest.raises(KeyError, match="missing"):
            spec["missing"]

    def test_keys_values_items(self):
        spec = make_spec()
        assert list(spec.keys()) == ["obs", "action", "next"]
        assert list(spec.keys(True)) == [
            "obs",
            "action",
            "next",
            ("next", "reward"),
            ("next", "done"),
            ("next", "info"),
            ("next", "info", "text"),
        ]
        assert list(spec.keys(True, True)) == [
            "obs",
            "action",
            ("next", "reward"),
            ("next", "done"),
            ("next", "info", "text"),
        ]
        assert list(spec.keys(False, True)) == ["obs", "action"]
        vals = spec.values(True, True)
        assert len(vals) == 5 and isinstance(vals[-1], NonTensor)
        items = dict(spec.items(True, True))
        assert items["obs"] is spec["obs"]
        # a custom is_leaf: treat composites as leaves
        keys = spec.keys(True, True, is_leaf=lambda cls: True)
        assert list(keys) == ["obs", "action", "next"]
        assert list(iter(spec)) == ["obs", "action", "next"]

    def test_update(self):
        spec = make_spec()
        spec.update({"extra": Unbounded((4, 2))})
        spec.update(Composite(next=Composite(bonus=Unbounded((4, 1)), shape=(4,)), shape=(4,)))
        assert "extra" in spec
        assert ("next", "bonus") in spec and ("next", "reward") in spec

    def test_empty_and_is_empty(self):
        spec = make_spec()
        empty = spec.empty()
        assert empty.shape == spec.shape and len(empty) == 0 and empty.is_empty()
        assert not spec.is_empty()
        nested_empty = Composite(a=Composite(b=Composite()))
        assert nested_empty.is_empty()
        assert not nested_empty.is_empty(recurse=False)

    def test_select_exclude(self):
        spec = make_spec()
        sel = spec.select("obs", ("next", "reward"))
        assert list(sel.keys(True, True)) == ["obs", ("next", "reward")]
        exc = spec.exclude("obs", ("next", "done"))
        assert "obs" not in exc and ("next", "done") not in exc
        assert ("next", "done") in spec


class TestLocking:
    def test_lock_is_recursive(self):
        spec = make_spec()
        assert spec.lock_() is spec
        assert spec.is_locked and spec["next"].is_locked and spec["next", "info"].is_locked
        with pytest.raises(LockedSpecError, match="locked"):
            spec["x"] = Unbounded((4,))
        with pytest.raises(LockedSpecError):
            spec["next"]["x"] = Unbounded((4,))
        with pytest.raises(LockedSpecError):
            del spec["obs"]
        with pytest.raises(LockedSpecError):
            spec.pop(("next", "reward"))
        with pytest.raises(LockedSpecError):
            spec.update({"y": Unbounded((4,))})
        with pytest.raises(RuntimeError):
            spec.set(("next", "z"), Unbounded((4,)))
        assert spec.unlock_() is spec
        assert not spec["next"].is_locked
        spec["x"] = Unbounded((4,))
        assert "x" in spec

    def test_key_cache_invalidated(self):
        spec = make_spec().lock_()
        keys = spec.keys(True, True)
        assert spec.keys(True, True) is keys  # cached while locked
        spec.unlock_()
        spec["next", "new"] = Unbounded((4, 1))
        assert ("next", "new") in spec.keys(True, True)
        spec.lock_()
        assert ("next", "new") in spec.keys(True, True)

    def test_unlocked_keys_reflect_nested_changes(self):
        spec = make_spec()
        before = spec.keys(True, True)
        spec["next"]["late"] = Unbounded((4,))
        assert ("next", "late") in spec.keys(True, True)
        assert ("next", "late") not in before

    def test_clone_is_unlocked_copy(self):
        spec = make_spec().lock_()
        clone = spec.clone()
        assert clone == spec and not clone.is_locked
        clone["action"].low.fill_(-5)
        assert spec["action"].low[0, 0] == -1


class TestSampling:
    def test_zero_rand_one(self):
        spec = make_spec()
        for method in ("zero", "rand", "one"):
            td = getattr(spec, method)()
            assert isinstance(td, TensorDict)
            assert td.batch_size == torch.Size([4])
            assert td["next", "done"].dtype == torch.bool
            assert td["next", "info", "text"] == ["ok"] * 4
            assert spec.is_in(td)

    def test_extra_shape(self):
        spec = make_spec()
        td = spec.rand((2, 3))
        assert td.batch_size == torch.Size([2, 3, 4])
        assert td["obs"].shape == torch.Size([2, 3, 4, 3])
        assert spec.expand(2, 3, 4).is_in(td)

    def test_empty_zero(self):
        td = Composite(shape=(3,)).zero()
        assert td.batch_size == torch.Size([3]) and len(td.keys()) == 0

    def test_unbatched_non_tensor(self):
        spec = Composite(text=NonTensor(example_data="a"))
        td = spec.zero()
        assert isinstance(td.get("text"), NonTensorData)
        assert td["text"] == "a"


class TestMembership:
    def test_missing_key(self):
        spec = make_spec()
        td = spec.zero()
        del td["next", "reward"]
        assert not spec.is_in(td)
        with pytest.raises(SpecViolationError) as info:
            spec.assert_is_in(td)
        assert "('next', 'reward')" in str(info.value) and "missing" in str(info.value)
        assert info.value.key == ("next", "reward")

    def test_extra_keys_allowed(self):
        spec = make_spec()
        td = spec.zero()
        td["unrelated"] = torch.zeros(4)
        assert spec.is_in(td)

    def test_bad_value_message(self):
        spec = make_spec()
        td = spec.zero()
        td["action"] = torch.full((4, 2), 3.0)
        with pytest.raises(SpecViolationError) as info:
            spec.assert_is_in(td)
        msg = str(info.value)
        assert "'action'" in msg and "Bounded" in msg and "max=3.0" in msg and "(4, 2)" in msg

    def test_nested_bad_dtype(self):
        spec = make_spec()
        td = spec.zero()
        td["next", "done"] = torch.zeros(4, 1, dtype=torch.int64)
        with pytest.raises(SpecViolationError, match=r"\('next', 'done'\).*dtype"):
            spec.assert_is_in(td)

    def test_not_a_td(self):
        assert not make_spec().is_in(torch.zeros(4))

    def test_accepts_dict(self):
        spec = Composite(a=Unbounded((2,)))
        assert spec.is_in({"a": torch.zeros(2)})


class TestConversions:
    def test_encode_dict(self):
        spec = Composite(a=Bounded(0, 5, (2,), dtype=torch.int64), b=Composite(c=Unbounded((1,))))
        td = spec.encode({"a": np.array([1, 2]), "b": {"c": 0.5}})
        assert isinstance(td, TensorDict)
        assert td["a"].dtype == torch.int64 and td["b", "c"].tolist() == [0.5]
        assert spec.is_in(td)
        with pytest.raises(SpecError):
            spec.encode({"zzz": 1})

    def test_to_numpy(self):
        spec = Composite(a=Unbounded((2,)), b=Composite(c=Unbounded((1,))))
        out = spec.to_numpy(spec.zero())
        assert isinstance(out["a"], np.ndarray) and isinstance(out["b"]["c"], np.ndarray)

    def test_project(self):
        spec = Composite(a=Bounded(0.0, 1.0, (2,)), b=OneHot(3))
        td = TensorDict(a=torch.tensor([3.0, -1.0]), b=torch.tensor([0.2, 0.9, 0.1]))
        out = spec.project(td)
        assert spec.is_in(out)
        assert out["a"].tolist() == [1.0, 0.0]
        assert td["a"].tolist() == [3.0, -1.0]


class TestShapes:
    def test_expand(self):
        spec = make_spec((4,))
        big = spec.expand(2, 4)
        assert big.shape == torch.Size([2, 4])
        assert big["obs"].shape == torch.Size([2, 4, 3])
        assert big["next", "info", "text"].shape == torch.Size([2, 4])
        assert spec.expand((2, 4)) == big
        with pytest.raises(ValueError, match="end with"):
            spec.expand(3, 5)

    def test_index(self):
        spec = make_spec((4, 5))
        assert spec[0].shape == torch.Size([5])
        assert spec[0]["obs"].shape == torch.Size([5, 3])
        assert spec[1:3].shape == torch.Size([2, 5])
        assert spec[:, 0]["action"].shape == torch.Size([4, 2])
        assert spec[..., 0]["action"].shape == torch.Size([4, 2])
        with pytest.raises(SpecError):
            spec[0, 0, 0]

    def test_squeeze_unsqueeze_reshape_unbind(self):
        spec = make_spec((4,))
        un = spec.unsqueeze(0)
        assert un.shape == torch.Size([1, 4]) and un["obs"].shape == torch.Size([1, 4, 3])
        assert un.squeeze() == spec
        assert un.squeeze(0) == spec
        r = spec.reshape(2, 2)
        assert r["next", "reward"].shape == torch.Size([2, 2, 1])
        parts = spec.unbind(0)
        assert len(parts) == 4 and parts[0].shape == torch.Size([])
        assert parts[0]["obs"] == Unbounded((3,))

    def test_eq_and_repr(self):
        assert make_spec() == make_spec()
        other = make_spec()
        other["next", "reward"] = Unbounded((4, 2))
        assert make_spec() != other
        assert make_spec() != make_spec((3,))
        text = repr(make_spec())
        assert "Composite(" in text and "obs" in text and "reward" in text


class TestMakeCompositeFromTd:
    def test_basic(self):
        td = TensorDict(
            obs=torch.zeros(2, 3),
            count=torch.zeros(2, dtype=torch.int64),
            nested=TensorDict(x=torch.ones(2, 4, dtype=torch.float64), batch_size=[2]),
            text=NonTensorData("hi", batch_size=[2]),
            batch_size=[2],
        )
        spec = make_composite_from_td(td)
        assert spec.shape == torch.Size([2])
        assert spec["obs"] == Unbounded((2, 3))
        assert spec["nested", "x"].dtype == torch.float64
        assert isinstance(spec["text"], NonTensor) and spec["text"].example_data == "hi"
        assert spec["count"].shape == torch.Size([2])
        assert spec.is_in(td)

    def test_null_shapes_and_dynamic(self):
        td = TensorDict(r=torch.tensor(1.0), obs=torch.zeros(3, 2))
        assert make_composite_from_td(td)["r"].shape == torch.Size([1])
        assert make_composite_from_td(td, unsqueeze_null_shapes=False)["r"].shape == torch.Size([])
        dyn = make_composite_from_td(td, dynamic_shape=True)
        assert dyn["obs"].shape == torch.Size([-1, -1])
        assert dyn.is_in(TensorDict(r=torch.zeros(1), obs=torch.zeros(5, 7)))


def test_binary_done_spec_pattern():
    """The seed's dynamic-spec env pattern: ``full_done_spec.zero() | done``."""
    done_spec = Composite(
        done=Binary(1, shape=(1,), dtype=torch.bool),
        terminated=Binary(1, shape=(1,), dtype=torch.bool),
    )
    td = done_spec.zero() | True
    assert td["done"].tolist() == [True]
    assert done_spec.is_in(td)


def test_pickle_round_trip_keeps_lock_and_masks():
    import pickle

    import cloudpickle

    spec = make_spec()
    spec["mask_action"] = Categorical(3, (4,), mask=torch.tensor([True, False, True]))
    spec.lock_()
    spec.keys(True, True)  # fill the cache before pickling
    for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, pickle.loads)):
        back = loads(dumps(spec))
        assert back == spec and back.is_locked and back["next"].is_locked
        assert back.keys(True, True) == spec.keys(True, True)
        assert back.is_in(spec.rand())


def test_zero_after_unlock_and_change_sees_new_key():
    spec = make_spec().lock_()
    assert "late" not in spec.zero().keys()
    spec.unlock_()
    spec["late"] = Unbounded((4,))
    spec.lock_()
    assert "late" in spec.zero().keys()


def test_keys_contains_nested_and_one_tuple():
    keys = make_spec().keys(True, True)
    assert ("next", "reward") in keys and ("obs",) in keys and "next" not in keys
