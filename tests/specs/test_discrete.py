from __future__ import annotations

import pytest
import torch

from aenv.exceptions import SpecError, SpecViolationError
from aenv.specs import (
    Categorical,
    DiscreteTensorSpec,
    MultiCategorical,
    MultiDiscreteTensorSpec,
    MultiOneHot,
    MultiOneHotDiscreteTensorSpec,
    OneHot,
    OneHotDiscreteTensorSpec,
)


class TestCategorical:
    def test_defaults(self):
        spec = Categorical(4)
        assert spec.shape == torch.Size([]) and spec.dtype == torch.int64 and spec.n == 4
        assert DiscreteTensorSpec is Categorical

    @pytest.mark.parametrize("n", [0, -3])
    def test_bad_n(self, n):
        with pytest.raises(ValueError, match="n must be > 0"):
            Categorical(n)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_float_dtype_rejected(self, dtype):
        with pytest.raises(SpecError, match="dtype"):
            Categorical(3, dtype=dtype)

    def test_bool_dtype(self):
        spec = Categorical(2, shape=(4, 1), dtype=torch.bool)
        assert spec.rand().dtype == torch.bool
        assert spec.is_in(spec.zero())
        with pytest.raises(SpecError):
            Categorical(3, dtype=torch.bool)

    def test_rand_and_is_in(self):
        spec = Categorical(3, shape=(100,))
        val = spec.rand()
        assert spec.is_in(val)
        assert set(val.tolist()) == {0, 1, 2}
        assert not spec.is_in(torch.full((100,), 3))
        assert not spec.is_in(torch.full((100,), -1))
        assert not spec.is_in(torch.zeros(100, dtype=torch.int32))

    def test_mask(self):
        spec = Categorical(4, shape=(50,))
        spec.update_mask(torch.tensor([False, True, False, True]))
        val = spec.rand()
        assert set(val.tolist()) <= {1, 3}
        assert not spec.is_in(torch.zeros(50, dtype=torch.int64))
        assert spec.is_in(torch.ones(50, dtype=torch.int64))
        projected = spec.project(torch.zeros(50))
        assert spec.is_in(projected) and set(projected.tolist()) == {1}
        spec.update_mask(None)
        assert spec.is_in(torch.zeros(50, dtype=torch.int64))

    def test_per_element_mask(self):
        mask = torch.tensor([[True, False, False], [False, False, True]])
        spec = Categorical(3, shape=(2,), mask=mask)
        for _ in range(5):
            assert spec.rand().tolist() == [0, 2]
        assert spec.enumerate().shape == torch.Size([3, 2])

    def test_mask_must_allow_something(self):
        with pytest.raises(SpecError):
            Categorical(2, mask=torch.tensor([False, False]))

    def test_project(self):
        spec = Categorical(3, shape=(4,))
        out = spec.project(torch.tensor([-1.2, 0.6, 2.4, 9.0]))
        assert out.tolist() == [0, 1, 2, 2] and out.dtype == torch.int64

    def test_enumerate(self):
        spec = Categorical(3, shape=(2,))
        vals = spec.enumerate()
        assert vals.shape == torch.Size([3, 2])
        assert vals[:, 0].tolist() == [0, 1, 2]
        assert spec.cardinality() == 3

    def test_index(self):
        spec = Categorical(3, shape=(2,))
        table = torch.tensor([[10.0, 11.0, 12.0], [20.0, 21.0, 22.0]])
        assert spec.index(torch.tensor([2, 0]), table).tolist() == [12.0, 20.0]

    def test_one_hot_conversion(self):
        spec = Categorical(3, shape=(2,))
        oh = spec.to_one_hot(torch.tensor([2, 0]))
        assert spec.to_one_hot_spec().is_in(oh)

    def test_eq(self):
        assert Categorical(3) == Categorical(3)
        assert Categorical(3) != Categorical(4)
        masked = Categorical(3, mask=torch.tensor([True, True, False]))
        assert masked != Categorical(3)
        assert masked == masked.clone()

    def test_violation_message(self):
        with pytest.raises(SpecViolationError, match=r"out of \[0, 3\)"):
            Categorical(3).assert_is_in(torch.tensor(5))


class TestOneHot:
    def test_defaults(self):
        spec = OneHot(4)
        assert spec.shape == torch.Size([4]) and spec.dtype == torch.bool
        assert OneHotDiscreteTensorSpec is OneHot
        with pytest.raises(SpecError, match="last dim"):
            OneHot(4, shape=(2, 3))
        with pytest.raises(ValueError):
            OneHot(0)

    def test_rand_is_one_hot(self):
        spec = OneHot(5, shape=(10, 5))
        val = spec.rand()
        assert spec.is_in(val)
        assert (val.sum(-1) == 1).all()

    def test_is_in_rejects(self):
        spec = OneHot(3, dtype=torch.int64)
        assert spec.is_in(torch.tensor([0, 1, 0]))
        assert not spec.is_in(torch.tensor([1, 1, 0]))
        assert not spec.is_in(torch.tensor([0, 0, 0]))
        assert not spec.is_in(torch.tensor([0, 2, 0]))

    def test_zero(self):
        assert OneHot(3).zero().tolist() == [False, False, False]

    def test_project(self):
        spec = OneHot(3)
        assert spec.project(torch.tensor([0.1, 3.0, -1.0])).tolist() == [False, True, False]

    def test_mask(self):
        spec = OneHot(4, shape=(30, 4))
        spec.update_mask(torch.tensor([True, False, False, False]))
        val = spec.rand()
        assert (val[:, 0]).all()
        bad = torch.zeros(30, 4, dtype=torch.bool)
        bad[:, 1] = True
        assert not spec.is_in(bad)
        proj = spec.project(torch.tensor([0.0, 5.0, 5.0, 5.0]).expand(30, 4))
        assert spec.is_in(proj)

    def test_enumerate_and_index(self):
        spec = OneHot(3, shape=(2, 3))
        vals = spec.enumerate()
        assert vals.shape == torch.Size([3, 2, 3])
        assert all(spec.is_in(v) for v in vals)
        table = torch.tensor([10, 20, 30])
        idx = torch.tensor([[0, 0, 1], [1, 0, 0]], dtype=torch.bool)
        assert spec.index(idx, table).tolist() == [30, 10]
        assert spec.cardinality() == 3

    def test_categorical_conversion(self):
        spec = OneHot(3, shape=(2, 3))
        val = spec.rand()
        cat = spec.to_categorical(val)
        assert spec.to_categorical_spec().is_in(cat)
        assert torch.equal(torch.nn.functional.one_hot(cat, 3).bool(), val)

    def test_batch_ops_keep_last_dim(self):
        spec = OneHot(3, shape=(2, 3))
        assert spec[0].shape == torch.Size([3])
        assert spec.expand(4, 2, 3).shape == torch.Size([4, 2, 3])
        with pytest.raises(SpecError):
            spec.reshape(6)
        assert spec.unsqueeze(-1).shape == torch.Size([2, 1, 3])
        with pytest.raises(SpecError):
            spec[0, 1]


class TestMultiCategorical:
    def test_construction(self):
        spec = MultiCategorical([2, 3, 4])
        assert spec.shape == torch.Size([3]) and spec.dtype == torch.int64
        assert spec.nvec.tolist() == [2, 3, 4]
        assert MultiDiscreteTensorSpec is MultiCategorical
        with pytest.raises(SpecError):
            MultiCategorical([2, 3], shape=(3,))
        with pytest.raises(SpecError):
            MultiCategorical([2, 0])
        with pytest.raises(SpecError):
            MultiCategorical([2, 3], dtype=torch.float32)

    def test_rand_is_in(self):
        spec = MultiCategorical([2, 5], shape=(100, 2))
        val = spec.rand()
        assert spec.is_in(val)
        assert val[:, 0].max() <= 1 and val[:, 1].max() == 4
        assert not spec.is_in(torch.tensor([[2, 0]]).expand(100, 2))

    def test_mask(self):
        spec = MultiCategorical([2, 3], shape=(20, 2))
        spec.update_mask(torch.tensor([False, True, True, False, False]))
        val = spec.rand()
        assert (val[:, 0] == 1).all() and (val[:, 1] == 0).all()
        assert not spec.is_in(torch.zeros(20, 2, dtype=torch.int64))
        assert spec.is_in(spec.project(torch.zeros(20, 2)))

    def test_enumerate(self):
        spec = MultiCategorical([2, 3])
        vals = spec.enumerate()
        assert vals.shape == torch.Size([6, 2])
        assert spec.cardinality() == 6
        assert len({tuple(v.tolist()) for v in vals}) == 6

    def test_project(self):
        spec = MultiCategorical([2, 3])
        assert spec.project(torch.tensor([5.0, -2.0])).tolist() == [1, 0]

    def test_eq(self):
        assert MultiCategorical([2, 3]) == MultiCategorical([2, 3])
        assert MultiCategorical([2, 3]) != MultiCategorical([3, 2])


class TestMultiOneHot:
    def test_construction(self):
        spec = MultiOneHot([2, 3])
        assert spec.shape == torch.Size([5]) and spec.dtype == torch.bool
        assert MultiOneHotDiscreteTensorSpec is MultiOneHot
        with pytest.raises(SpecError):
            MultiOneHot([2, 3], shape=(4,))

    def test_rand_is_in(self):
        spec = MultiOneHot([2, 3], shape=(7, 5))
        val = spec.rand()
        assert spec.is_in(val)
        assert (val[:, :2].sum(-1) == 1).all() and (val[:, 2:].sum(-1) == 1).all()
        bad = val.clone()
        bad[0, :2] = True
        assert not spec.is_in(bad)

    def test_project_enumerate(self):
        spec = MultiOneHot([2, 2])
        assert spec.project(torch.tensor([0.0, 1.0, 3.0, 2.0])).tolist() == [
            False,
            True,
            True,
            False,
        ]
        assert spec.enumerate().shape == torch.Size([4, 4])
        assert spec.cardinality() == 4
        cat = spec.to_categorical(torch.tensor([False, True, True, False]))
        assert cat.tolist() == [1, 0]
        assert spec.to_categorical_spec().is_in(cat)
