from __future__ import annotations

import pytest
import torch

from aenv.exceptions import SpecError
from aenv.specs import (
    Binary,
    Bounded,
    Categorical,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    OneHot,
    Unbounded,
)

ALL_LEAVES = [
    Unbounded((4, 3)),
    Bounded(torch.arange(12.0).reshape(4, 3), 20.0),
    Categorical(5, (4, 3), mask=torch.ones(4, 3, 5, dtype=torch.bool)),
    OneHot(3, (4, 3)),
    Binary(3, (4, 3)),
    MultiCategorical([1, 2, 3], (4, 3)),
    MultiOneHot([1, 2], (4, 3)),
]


@pytest.mark.parametrize("spec", ALL_LEAVES, ids=lambda s: type(s).__name__)
class TestLeafShapeOps:
    def test_expand(self, spec):
        big = spec.expand(2, 4, 3)
        assert big.shape == torch.Size([2, 4, 3])
        assert big.is_in(big.rand())
        assert big[1] == spec
        assert spec.expand((2, 4, 3)) == big
        same = spec.expand(spec.shape)  # a copy, as in TorchRL: editing it leaves spec alone
        assert same == spec and same is not spec
        with pytest.raises(ValueError, match="end with"):
            spec.expand(2, 5, 3)

    def test_index(self, spec):
        sub = spec[1]
        assert sub.shape == spec.shape[1:]
        assert sub.is_in(spec.rand()[1])
        assert spec[1:3].shape == torch.Size([2, 3])
        assert spec[..., 0].shape[0] == 4 or spec._event_ndim == 1

    def test_unsqueeze_squeeze(self, spec):
        un = spec.unsqueeze(0)
        assert un.shape == torch.Size([1, 4, 3])
        assert un.squeeze(0) == spec
        assert un.squeeze() == spec

    def test_reshape_and_unbind(self, spec):
        if spec._event_ndim == 0:
            r = spec.reshape(12)
            assert r.shape == torch.Size([12])
            assert r.is_in(r.rand())
            assert spec.reshape(2, -1, 3).shape == torch.Size([2, 2, 3])
        else:
            r = spec.reshape(2, 2, 3)
            assert r.shape == torch.Size([2, 2, 3])
        parts = spec.unbind(0)
        assert len(parts) == 4 and all(p.shape == spec.shape[1:] for p in parts)
        assert torch.stack(list(parts), 0) == spec

    def test_clone_eq_to(self, spec):
        assert spec.clone() == spec
        assert spec.to("cpu").device == torch.device("cpu")
        assert spec.cpu() == spec.to("cpu")


def test_squeeze_keeps_event_dim():
    spec = OneHot(1, (1, 1))
    assert spec.squeeze().shape == torch.Size([1])


def test_bounded_index_slices_bounds():
    spec = Bounded(torch.tensor([0.0, 1.0, 2.0]), 5.0)
    assert spec[1].low.item() == 1.0
    assert spec[1:].low.tolist() == [1.0, 2.0]


def test_index_too_many():
    with pytest.raises(SpecError):
        Unbounded((2,))[0, 0]


def test_index_not_supported_on_continuous():
    with pytest.raises(SpecError):
        Unbounded((2,)).index(torch.zeros(2), torch.zeros(2))
    with pytest.raises(SpecError):
        Unbounded((2,)).enumerate()


class TestDynamic:
    def test_rand_sizes(self):
        spec = Unbounded((3, -1, 2))
        sizes = {spec.rand().shape[1] for _ in range(60)}
        assert sizes <= set(range(1, 6)) and len(sizes) > 1
        assert spec.zero().shape == torch.Size([3, 1, 2])
        assert spec.one().shape == torch.Size([3, 1, 2])

    def test_is_in_any_size(self):
        spec = Unbounded((3, -1, 2))
        for n in (0, 1, 7):
            assert spec.is_in(torch.zeros(3, n, 2))
        assert not spec.is_in(torch.zeros(4, 2, 2))
        assert not spec.is_in(torch.zeros(3, 2))

    def test_dynamic_bounded(self):
        spec = Bounded(0.0, 1.0, (-1, 2))
        assert spec.is_in(spec.rand())
        assert spec.is_in(torch.full((9, 2), 0.5))
        assert not spec.is_in(torch.full((9, 2), 1.5))
        assert spec.project(torch.full((4, 2), 3.0)).shape == torch.Size([4, 2])

    def test_dynamic_expand_index(self):
        spec = Unbounded((-1, 2))
        big = spec.expand(3, -1, 2)
        assert big.shape == torch.Size([3, -1, 2])
        assert big[0].shape == torch.Size([-1, 2])
        with pytest.raises(SpecError):
            spec.reshape(4)

    def test_dynamic_in_composite(self):
        from aenv.specs import Composite

        spec = Composite(obs=Unbounded((3, -1, 2)))
        td = spec.zero()
        assert td["obs"].shape == torch.Size([3, 1, 2])
        assert spec.is_in(td)

    def test_dynamic_non_tensor(self):
        spec = NonTensor(shape=(-1,))
        assert spec.is_in(["a", "b", "c"])
