from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack

from aenv.exceptions import SpecError, SpecViolationError
from aenv.specs import (
    Binary,
    BinaryDiscreteTensorSpec,
    Bounded,
    BoundedTensorSpec,
    NonTensor,
    NonTensorSpec,
    Unbounded,
    UnboundedContinuousTensorSpec,
    UnboundedDiscreteTensorSpec,
)


class TestUnbounded:
    def test_defaults(self):
        spec = Unbounded()
        assert spec.shape == torch.Size([1])
        assert spec.dtype == torch.float32
        assert spec.device is None
        assert spec.ndim == 1

    @pytest.mark.parametrize("shape", [3, (2, 3), torch.Size([4]), [1, 2]])
    def test_shape_forms(self, shape):
        spec = Unbounded(shape)
        expected = torch.Size([shape]) if isinstance(shape, int) else torch.Size(shape)
        assert spec.shape == expected
        assert spec.rand().shape == expected

    @pytest.mark.parametrize(
        "dtype", [torch.float32, torch.float64, torch.int64, torch.uint8, torch.bool]
    )
    def test_dtypes(self, dtype):
        spec = Unbounded((5,), dtype=dtype)
        val = spec.rand()
        assert val.dtype == dtype
        assert spec.is_in(val)
        assert spec.zero().dtype == dtype
        assert spec.one().dtype == dtype

    def test_is_in_rejects_wrong_shape_and_dtype(self):
        spec = Unbounded((3,))
        assert not spec.is_in(torch.zeros(4))
        assert not spec.is_in(torch.zeros(3, dtype=torch.float64))
        assert not spec.is_in([0.0, 0.0, 0.0])
        assert spec.contains(torch.zeros(3))

    def test_extra_shape(self):
        spec = Unbounded((2, 3))
        assert spec.rand((4, 5)).shape == torch.Size([4, 5, 2, 3])
        assert spec.zero(4).shape == torch.Size([4, 2, 3])
        assert torch.equal(spec.one(), torch.ones(2, 3))

    def test_device_and_to(self):
        spec = Unbounded((3,), device="cpu")
        assert spec.device == torch.device("cpu")
        assert spec.rand().device == torch.device("cpu")
        assert spec.cpu() is spec
        assert Unbounded((3,)).to("cpu").device == torch.device("cpu")
        assert spec.to(torch.float64).dtype == torch.float64

    def test_legacy_aliases(self):
        assert UnboundedContinuousTensorSpec((2,)).dtype == torch.float32
        assert UnboundedDiscreteTensorSpec((2,)).dtype == torch.int64
        assert UnboundedDiscreteTensorSpec((2,)) == Unbounded((2,), dtype=torch.int64)
        assert isinstance(UnboundedDiscreteTensorSpec((2,)), Unbounded)

    def test_encode_and_to_numpy(self):
        spec = Unbounded((2, 2), dtype=torch.float64)
        out = spec.encode(np.arange(4))
        assert out.shape == torch.Size([2, 2]) and out.dtype == torch.float64
        assert torch.equal(
            spec.encode([[1, 2], [3, 4]]), torch.tensor([[1.0, 2], [3, 4]], dtype=torch.float64)
        )
        arr = spec.to_numpy(out)
        assert isinstance(arr, np.ndarray) and arr.dtype == np.float64
        with pytest.raises(SpecError):
            spec.encode(np.zeros(3))
        assert Unbounded((1,)).encode(2.5).shape == torch.Size([1])

    def test_repr_and_eq(self):
        spec = Unbounded((2,))
        assert "Unbounded" in repr(spec) and "(2,)" in repr(spec)
        assert spec == Unbounded((2,))
        assert spec != Unbounded((3,))
        assert spec != Unbounded((2,), dtype=torch.float64)
        assert spec != Bounded(-1, 1, (2,))
        assert spec != "spec"


class TestBounded:
    def test_scalar_bounds_with_shape(self):
        spec = Bounded(-1.0, 2.0, shape=(3,))
        assert spec.shape == torch.Size([3])
        assert torch.equal(spec.low, torch.full((3,), -1.0))
        assert torch.equal(spec.high, torch.full((3,), 2.0))
        assert spec.dtype == torch.float32
        assert spec.minimum is spec.low and spec.maximum is spec.high

    def test_shape_inferred_from_tensors(self):
        spec = Bounded(torch.zeros(2, 1), torch.ones(3))
        assert spec.shape == torch.Size([2, 3])
        assert spec.low.shape == spec.high.shape == torch.Size([2, 3])

    def test_dtype_from_numpy_bounds(self):
        spec = Bounded(np.zeros(2), np.ones(2))
        assert spec.dtype == torch.float64

    def test_low_greater_than_high(self):
        with pytest.raises(ValueError, match="low"):
            Bounded(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 1.0]))
        with pytest.raises(SpecError, match=r"low\[\(1,\)\]"):
            Bounded(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 1.0]))

    def test_bool_dtype_rejected(self):
        with pytest.raises(SpecError):
            Bounded(0, 1, (2,), dtype=torch.bool)

    def test_non_broadcastable(self):
        with pytest.raises(SpecError):
            Bounded(torch.zeros(2), torch.ones(3))

    def test_rand_in_bounds(self):
        spec = Bounded(torch.tensor([-1.0, 0.0]), torch.tensor([0.0, 10.0]))
        for _ in range(20):
            val = spec.rand((7,))
            assert val.shape == torch.Size([7, 2])
            assert bool((val >= spec.low).all() and (val <= spec.high).all())

    def test_int_bounds(self):
        spec = Bounded(0, 3, (1000,), dtype=torch.int64)
        val = spec.rand()
        assert val.dtype == torch.int64 and spec.is_in(val)
        assert set(val.unique().tolist()) == {0, 1, 2, 3}
        assert spec.cardinality() == 4

    def test_infinite_bounds_rand(self):
        spec = Bounded(torch.tensor([-np.inf, 0.0, -np.inf]), torch.tensor([np.inf, np.inf, 5.0]))
        val = spec.rand((50,))
        assert torch.isfinite(val).all()
        assert spec.is_in(spec.rand())

    def test_huge_finite_bounds(self):
        big = torch.finfo(torch.float32).max
        spec = Bounded(-big, big, (10,))
        assert spec.is_in(spec.rand())

    def test_is_in_and_violation_message(self):
        spec = Bounded(0.0, 1.0, (2,))
        assert spec.is_in(torch.tensor([0.0, 1.0]))
        assert not spec.is_in(torch.tensor([0.0, 1.5]))
        assert not spec.is_in(torch.tensor([float("nan"), 0.5]))
        with pytest.raises(SpecViolationError) as info:
            spec.assert_is_in(torch.tensor([0.0, 1.5]), key="action")
        msg = str(info.value)
        assert "'action'" in msg and "Bounded" in msg and "max=1.5" in msg and "low=0.0" in msg
        assert info.value.key == "action"

    def test_project(self):
        spec = Bounded(-1.0, 1.0, (3,))
        out = spec.project(torch.tensor([-5.0, 0.5, float("nan")]))
        assert spec.is_in(out)
        assert out[:2].tolist() == [-1.0, 0.5]
        ispec = Bounded(0, 5, (2,), dtype=torch.int32)
        assert ispec.project(torch.tensor([2.6, 9.0])).tolist() == [3, 5]

    def test_zero_is_zero(self):
        assert torch.equal(Bounded(1.0, 2.0, (2,)).zero(), torch.zeros(2))

    def test_eq_uses_bounds(self):
        assert Bounded(0, 1, (2,)) == BoundedTensorSpec(0, 1, (2,))
        assert Bounded(0, 1, (2,)) != Bounded(0, 2, (2,))

    def test_clone_is_independent(self):
        spec = Bounded(0.0, 1.0, (2,))
        other = spec.clone()
        other.high[0] = 5.0
        assert spec.high[0] == 1.0
        assert other != spec

    def test_repr_shows_bounds(self):
        assert "low=-1.0" in repr(Bounded(-1.0, 1.0, (2,)))
        assert "[0.0, 1.0]" in repr(Bounded(torch.tensor([0.0, 1.0]), 2.0))


class TestBinary:
    def test_construction(self):
        assert Binary(3).shape == torch.Size([3])
        assert Binary(shape=(2, 4)).n == 4
        assert Binary(3).dtype == torch.int8
        assert BinaryDiscreteTensorSpec is Binary
        with pytest.raises(SpecError):
            Binary(3, shape=(2, 4))
        with pytest.raises(SpecError):
            Binary()

    def test_values(self):
        spec = Binary(4, shape=(5, 4), dtype=torch.bool)
        val = spec.rand()
        assert val.dtype == torch.bool and spec.is_in(val)
        ispec = Binary(2)
        assert ispec.is_in(torch.tensor([0, 1], dtype=torch.int8))
        assert not ispec.is_in(torch.tensor([0, 2], dtype=torch.int8))
        assert ispec.project(torch.tensor([0.7, -3.0])).tolist() == [1, 0]

    def test_enumerate_cardinality(self):
        spec = Binary(2, shape=(3, 2))
        vals = spec.enumerate()
        assert spec.cardinality() == 4
        assert vals.shape == torch.Size([4, 3, 2])
        assert all(spec.is_in(v) for v in vals)
        assert len({tuple(v[0].tolist()) for v in vals}) == 4


class TestNonTensor:
    def test_zero_unbatched(self):
        spec = NonTensor(example_data="hi")
        val = spec.zero()
        assert isinstance(val, NonTensorData) and val.data == "hi"
        assert spec.rand().data == "hi"
        assert spec.is_in(val)
        assert NonTensorSpec is NonTensor

    def test_zero_batched(self):
        spec = NonTensor(shape=(2, 3), example_data="x")
        val = spec.zero()
        assert isinstance(val, NonTensorStack)
        assert val.batch_size == torch.Size([2, 3])
        assert val.tolist() == [["x"] * 3] * 2
        assert spec.is_in(val)
        assert not spec.is_in(NonTensor(shape=(3,)).zero())

    def test_default_example_is_none(self):
        assert NonTensor().zero().data is None

    def test_encode(self):
        spec = NonTensor(shape=(2,))
        val = spec.encode(["a", "b"])
        assert isinstance(val, NonTensorStack) and val.tolist() == ["a", "b"]
        assert spec.to_numpy(val) == ["a", "b"]
        single = NonTensor().encode({"k": 1})
        assert isinstance(single, NonTensorData) and single.data == {"k": 1}
        assert NonTensor().to_numpy(single) == {"k": 1}

    def test_is_in(self):
        spec = NonTensor()
        assert spec.is_in("plain string")
        assert not spec.is_in(torch.zeros(2))
        assert NonTensor(shape=(2,)).is_in(["a", "b"])
        assert not NonTensor(shape=(2,)).is_in(["a"])
        assert NonTensor(shape=(-1,)).is_in(NonTensor(shape=(4,)).zero())

    def test_expand_and_index(self):
        spec = NonTensor(example_data=1).expand(3)
        assert spec.shape == torch.Size([3])
        assert spec[0].shape == torch.Size([])
        assert spec.zero().tolist() == [1, 1, 1]

    def test_eq(self):
        assert NonTensor(example_data="a") == NonTensor(example_data="a")
        # example_data is what zero() gives, not what the spec admits: not part of equality
        assert NonTensor(example_data="a") == NonTensor(example_data="b")
        assert torch.stack([NonTensor(example_data="a"), NonTensor(example_data="b")]) == (
            NonTensor(shape=(2,))
        )
        assert NonTensor(shape=(2,)) != NonTensor()


def test_bounded_to_dtype_moves_bounds_and_still_samples():
    import torch

    from aenv.specs import Bounded

    spec = Bounded(-1.0, 1.0, shape=(3,), dtype=torch.float64).to(torch.float32)
    assert spec.low.dtype == torch.float32 and spec.high.dtype == torch.float32
    sample = spec.rand()
    assert sample.dtype == torch.float32 and spec.is_in(sample)
