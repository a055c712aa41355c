"""The plain-data codec for pool payloads and results between processes: every TensorDict
it takes comes back equal (values, dtypes, shapes, batch sizes, non-tensor values), owning
writable memory; what it cannot take is pickled as it is."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict, is_leaf_nontensor

from aenv.pool._codec import BIG_BYTES, Unpackable, decode, dumps, encode, loads


def _sample() -> TensorDict:
    td = TensorDict(
        {
            "observation": torch.randn(3, 4),
            "strided": torch.arange(24.0).reshape(4, 6)[:3, ::2],  # (a non-contiguous view)
            "empty": torch.zeros(3, 0),
            "flags": torch.tensor([[True], [False], [True]]),
            "small": torch.tensor([[1], [-2], [3]], dtype=torch.int8),
            "half": torch.ones(3, 2, dtype=torch.float16),
            "wide": torch.ones(3, 1, dtype=torch.uint16),
            "complex": torch.ones(3, 1, dtype=torch.complex64),
            "nested": TensorDict({"h": torch.arange(6).reshape(3, 2)}, batch_size=[3]),
        },
        batch_size=[3],
    )
    td.set_non_tensor("label", {"prompt": "1 + 2 =", "ids": [1, 2]})
    return td


def _assert_equal(got: TensorDict, want: TensorDict) -> None:
    assert type(got) is TensorDict
    assert got.batch_size == want.batch_size and got.device == want.device
    keys = sorted(want.keys(True, True, is_leaf=is_leaf_nontensor), key=str)
    assert sorted(got.keys(True, True, is_leaf=is_leaf_nontensor), key=str) == keys
    for key in keys:
        a, b = got.get(key), want.get(key)
        if isinstance(b, torch.Tensor) and not isinstance(b, NonTensorData):
            assert a.dtype == b.dtype and a.shape == b.shape, key
            assert torch.equal(a, b), key
        else:
            assert got.get_non_tensor(key) == want.get_non_tensor(key), key


def test_round_trip_keeps_every_entry():
    td = _sample()
    _assert_equal(loads(dumps(td)), td)


def test_tuples_of_results_and_none_round_trip():
    nxt, reset = _sample(), _sample()[0]
    got_next, got_reset, nothing = loads(dumps((nxt, reset, None)))
    _assert_equal(got_next, nxt)
    _assert_equal(got_reset, reset)
    assert nothing is None


def test_decoded_tensors_own_writable_memory():
    td = _sample()
    got = loads(dumps(td))
    got["observation"].add_(1)
    got["nested", "h"].zero_()
    assert torch.equal(got["observation"], td["observation"] + 1)
    assert td["nested", "h"].sum() > 0


def test_plain_form_is_much_smaller_than_the_tensordicts_pickle():
    td = TensorDict({"done": torch.zeros(1, dtype=torch.bool)}, batch_size=[])
    td.set_non_tensor("text", "hello")
    assert len(dumps(td)) * 3 < len(pickle.dumps(td, protocol=5))


def test_big_arrays_travel_beside_the_pickle():
    elems = BIG_BYTES // 4 * 2
    td = TensorDict({"image": torch.rand(elems), "reward": torch.ones(1)}, batch_size=[])
    big: list[np.ndarray] = []
    blob = pickle.dumps(encode(td, big), protocol=5)
    assert len(big) == 1 and big[0].nbytes == elems * 4 and len(blob) < BIG_BYTES
    big[0].flags.writeable = False  # (as Ray's object store hands it back)
    got = decode(pickle.loads(blob), big)
    _assert_equal(got, td)
    got["image"].add_(1)  # a copy of the read-only array


@pytest.mark.parametrize(
    "make",
    [
        lambda: TensorDict({"x": torch.ones(2, requires_grad=True)}, batch_size=[]),
        lambda: TensorDict({"x": torch.ones(2, dtype=torch.bfloat16)}, batch_size=[]),
        lambda: LazyStackedTensorDict.lazy_stack(
            [TensorDict({"x": torch.ones(2)}, []), TensorDict({"x": torch.ones(3)}, [])]
        ),
    ],
    ids=["grad", "bfloat16", "lazy-stack"],
)
def test_what_has_no_plain_form_is_pickled_as_it_is(make):
    td = make()
    if type(td) is TensorDict:
        with pytest.raises(Unpackable):
            encode(td)
    got = loads(dumps(td))
    assert type(got) is type(td)
    for a, b in zip(
        got.unbind(0) if got.batch_size else [got], td.unbind(0) if td.batch_size else [td]
    ):
        assert torch.equal(a["x"].detach().float(), b["x"].detach().float())
