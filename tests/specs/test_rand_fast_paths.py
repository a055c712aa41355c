"""The per-step sampling fast paths give what the general ones give, as fresh tensors.

``OneHot.rand`` picks rows of a cached identity matrix (copies of cached numpy rows for a
single one-hot on the CPU) instead of ``one_hot(randint(...))``; ``TensorSpec.rand()`` /
``zero()`` skip the shape work when no extra dims are asked. These tests pin the values (same
random stream as ``torch.randint``), dtype, shape, device, and that no call hands out memory
that a later call (or the cache) shares.
"""

from __future__ import annotations

import pytest
import torch

from aenv.specs import Categorical, MultiOneHot, OneHot, Unbounded
from aenv.specs._discrete import _EYE_MAX_N, _ROWS_MAX_N, one_hot_rows

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int64, torch.float32, torch.float64]


def _reference_one_hot(n: int, batch: tuple[int, ...], dtype: torch.dtype, seed: int):
    torch.manual_seed(seed)
    idx = torch.randint(0, n, batch)
    return torch.nn.functional.one_hot(idx, n).to(dtype)


@pytest.mark.parametrize("dtype", [*DTYPES, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch", [(), (3,), (2, 4), (0,)])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_one_hot_rand_matches_one_hot_of_randint(n, batch, dtype):
    spec = OneHot(n, shape=(*batch, n), dtype=dtype)
    torch.manual_seed(7)
    got = spec.rand()
    want = _reference_one_hot(n, batch, dtype, 7)
    assert got.dtype == dtype and got.shape == torch.Size((*batch, n))
    assert got.device.type == "cpu"
    assert torch.equal(got, want)
    assert spec.is_in(got)


@pytest.mark.parametrize("n", [3, _ROWS_MAX_N + 1, _EYE_MAX_N + 1])
def test_one_hot_rand_with_extra_dims_and_large_n(n):
    spec = OneHot(n)
    torch.manual_seed(3)
    got = spec.rand((4,))
    assert torch.equal(got, _reference_one_hot(n, (4,), torch.bool, 3))
    torch.manual_seed(3)
    single = spec.rand()
    assert torch.equal(single, _reference_one_hot(n, (), torch.bool, 3))


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_hot_rand_values_are_fresh(dtype):
    """Writing into a sampled value changes neither the cache nor later samples."""
    spec = OneHot(3, dtype=dtype)
    first = [spec.rand() for _ in range(20)]
    ptrs = {t.data_ptr() for t in first}
    assert len(ptrs) == len(first)
    for t in first:
        t.fill_(1)
    for _ in range(20):
        v = spec.rand()
        assert int(v.to(torch.int64).sum()) == 1


def test_one_hot_rows_scalar_index_is_not_a_view_of_the_cache():
    for n in (4, _ROWS_MAX_N + 1):
        a = one_hot_rows(torch.tensor(1), n, torch.int64, None)
        a.fill_(9)
        b = one_hot_rows(torch.tensor(1), n, torch.int64, None)
        assert b.tolist() == [0, 1] + [0] * (n - 2)
        c = one_hot_rows(torch.tensor([1, 1]), n, torch.int64, None)
        c.fill_(9)
        assert one_hot_rows(torch.tensor([1]), n, torch.int64, None).sum() == 1


def test_masked_one_hot_rand_respects_the_mask():
    spec = OneHot(4, mask=torch.tensor([False, True, False, True]))
    for _ in range(50):
        v = spec.rand()
        assert v.dtype == torch.bool and v.shape == (4,)
        assert spec.is_in(v) and not (v[0] or v[2])
    batched = OneHot(4, shape=(5, 4), mask=torch.tensor([True, False, False, False]))
    assert torch.equal(batched.rand(), torch.eye(4, dtype=torch.bool)[[0] * 5])


def test_multi_one_hot_rand_matches_reference():
    spec = MultiOneHot([2, 3], shape=(4, 5), dtype=torch.int64)
    torch.manual_seed(11)
    got = spec.rand()
    torch.manual_seed(11)
    a = torch.nn.functional.one_hot(torch.randint(0, 2, (4,)), 2)
    b = torch.nn.functional.one_hot(torch.randint(0, 3, (4,)), 3)
    assert torch.equal(got, torch.cat([a, b], -1))
    assert got.dtype == torch.int64 and spec.is_in(got)


def test_rand_and_zero_without_shape_keep_dynamic_dims_and_extra_dims():
    dyn = Unbounded(shape=(-1, 3))
    for _ in range(10):
        v = dyn.rand()
        assert v.shape[1] == 3 and 1 <= v.shape[0] <= 5
    assert dyn.zero().shape == (1, 3)
    cat = Categorical(4, shape=(2,))
    assert cat.rand().shape == (2,) and cat.rand((3,)).shape == (3, 2)
    assert cat.zero().shape == (2,) and cat.zero((3,)).shape == (3, 2)
    a, b = cat.zero(), cat.zero()
    a.fill_(3)
    assert b.tolist() == [0, 0]
