"""The Ray backend's codec (:mod:`aenv.pool._ray_codec`), which needs no cluster: payloads
and results as pickled numpy arrays, big arrays beside the pickle (out of band for Ray)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from aenv.pool._codec import BIG_BYTES
from aenv.pool._ray_codec import FlatRows, pack, unpack


def sample(big_elems: int) -> TensorDict:
    return TensorDict(
        {
            "observation": torch.arange(big_elems, dtype=torch.float32),
            "reward": torch.ones(1),
            "next": TensorDict({"done": torch.zeros(1, dtype=torch.bool)}, batch_size=()),
        },
        batch_size=(),
    )


def test_big_arrays_travel_beside_the_pickle():
    elems = BIG_BYTES // 4 * 3  # three times the limit, in float32
    nxt, reset = sample(elems), sample(8)
    kind, blob, big = pack((nxt, reset))
    assert kind == "p"
    # the big observation is not in the pickle: only the small leaves are
    assert len(big) == 1 and big[0].nbytes == elems * 4 and len(blob) < BIG_BYTES
    # as Ray hands an array back from its object store: a read-only view
    big[0].flags.writeable = False
    got_next, got_reset = unpack((kind, blob, big))
    for got, want in ((got_next, nxt), (got_reset, reset)):
        assert set(got.keys(True, True)) == set(want.keys(True, True))
        for key in want.keys(True, True):
            assert torch.equal(got[key], want[key])
            assert got[key].dtype == want[key].dtype
    got_next["observation"].add_(1)  # writable: a copy, not the read-only array
    assert bool((got_next["observation"] == nxt["observation"] + 1).all())


def test_small_tensors_stay_in_the_pickle_and_others_pass_as_they_are():
    kind, blob, big = pack(sample(8).to("cpu"))
    assert kind == "p" and big == []
    got = unpack((kind, blob, big))
    assert torch.equal(got["observation"], torch.arange(8.0))
    assert got.device == torch.device("cpu") and got["next"].device == torch.device("cpu")
    assert got.batch_size == torch.Size([])
    td = sample(4)
    td.set_non_tensor("text", "hello")  # non-tensor values: plain data too
    assert pack(td)[0] == "p" and unpack(pack(td))["text"] == "hello"
    lazy = LazyStackedTensorDict.lazy_stack([sample(2), sample(3)])  # pickled as it is
    assert type(unpack(pack(lazy))) is LazyStackedTensorDict
    assert unpack(pack((3, None))) == (3, None)
    assert isinstance(unpack(pack(np.zeros(2))), np.ndarray)


def flat_sample() -> TensorDict:
    """A flat TensorDict of every dtype the flat form takes, odd shapes included."""
    return TensorDict(
        {
            "observation": torch.arange(12, dtype=torch.float32).reshape(2, 3, 2),
            "reward": torch.tensor([[1.5], [2.5]], dtype=torch.float64),
            "half": torch.ones(2, 1, dtype=torch.float16),
            "count": torch.tensor([7, -3], dtype=torch.int64),
            "i32": torch.tensor([1, 2], dtype=torch.int32),
            "i16": torch.tensor([1, 2], dtype=torch.int16),
            "i8": torch.tensor([-1, 2], dtype=torch.int8),
            "u8": torch.tensor([[255], [0]], dtype=torch.uint8),
            "done": torch.tensor([[True], [False]]),
            "c64": torch.tensor([1 + 2j, 3j], dtype=torch.complex64),
            "c128": torch.tensor([1 + 2j, 3j], dtype=torch.complex128),
            "empty": torch.zeros(2, 0),
            # a strided view (every other column of a wider tensor)
            "strided": torch.arange(16, dtype=torch.float32).reshape(2, 8)[:, ::2],
        },
        batch_size=(2,),
    )


def assert_same(got: TensorDict, want: TensorDict) -> None:
    assert list(got.keys()) == list(want.keys())  # (order too)
    assert got.batch_size == want.batch_size and got.device == want.device
    for key, value in want.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        assert torch.equal(got[key], value), key


def test_a_flat_tensordict_travels_as_one_blob_through_the_frame_pickle():
    want = flat_sample()
    packed = pack(want)
    assert packed[0] == "f"  # (no pickle of its own: the frame's pickle carries it)
    got = unpack(pickle.loads(pickle.dumps(packed, protocol=5)))
    assert_same(got, want)
    # fresh, writable memory: changing the result leaves the input as it was
    got["observation"].add_(100)
    got["done"].logical_not_()
    assert float(want["observation"].max()) == 11.0 and bool(want["done"][0])
    # a step's env row, as the pool sends it: a view of a stacked TensorDict
    row = torch.stack([want, want])[1]
    assert pack(row)[0] == "f" and torch.equal(unpack(pack(row))["strided"], want["strided"])
    on_cpu = want.to("cpu")
    assert unpack(pack(on_cpu)).device == torch.device("cpu")


def test_tuples_and_lists_of_flat_tensordicts_and_none_take_the_flat_form():
    a, b = flat_sample(), flat_sample()[0]
    kind, got = pack((a, None))
    assert kind == "f"
    got_a, got_none = unpack(pickle.loads(pickle.dumps((kind, got))))
    assert_same(got_a, a) and got_none is None
    got_list = unpack(pack([a, b]))
    assert type(got_list) is list and len(got_list) == 2
    assert_same(got_list[1], b)
    # with plain values beside them (a whole-batch answer's tag and reset flags): flat too
    answer = ("S", a, None, [True, False])
    assert pack(answer)[0] == "f"
    tag, rows, none, flags = unpack(pickle.loads(pickle.dumps(pack(answer))))
    assert (tag, none, flags) == ("S", None, [True, False]) and torch.equal(
        rows["count"], a["count"]
    )
    # a tuple with anything else in it takes the general path (and comes back the same)
    for mixed in ((a, {"k": 1}), (a, [a]), (a, sample(2))):
        assert pack(mixed)[0] == "p"
        assert torch.equal(unpack(pack(mixed))[0]["count"], a["count"])
    assert pack((None, None))[0] != "f" and unpack(pack((None, None))) == (None, None)
    assert unpack(pack(())) == ()


def test_what_the_flat_form_cannot_hold_takes_the_general_path():
    nested = sample(4)  # a nested TensorDict
    assert pack(nested)[0] == "p"
    bf16 = TensorDict({"x": torch.ones(3, dtype=torch.bfloat16)}, batch_size=())
    got = unpack(pack(bf16))
    assert got["x"].dtype == torch.bfloat16 and torch.equal(got["x"], bf16["x"])
    grad = TensorDict({"w": torch.ones(2, requires_grad=True)}, batch_size=())
    assert pack(grad)[0] == "o"  # (no plain form: passed as it is, gradient kept)
    assert unpack(pack(grad))["w"].requires_grad
    big = TensorDict({"x": torch.zeros(BIG_BYTES // 4, dtype=torch.float32)}, batch_size=())
    kind, _, arrays = pack(big)
    assert kind == "p" and len(arrays) == 1  # (beside the pickle: Ray's object store)


def test_flat_parts_land_in_preallocated_rows_along_the_first_dim():
    a, b = flat_sample(), flat_sample()
    b["observation"] += 100
    parts = [unpack_frame(pack(("S", a, None, [True, False])))[1], unpack_frame(pack(b))]
    rows = FlatRows.plan(parts, 4)
    got = rows.land(parts, [2, 2])
    assert_same(got, torch.cat([a, b], 0))
    # the same rows every time: the next parts overwrite them; a None part leaves its rows
    c = flat_sample()
    c["count"] = torch.tensor([40, 41])
    again = rows.land([None, unpack_frame(pack(c))], [2, 2])
    assert again is got
    assert got["count"].tolist() == [7, -3, 40, 41]
    assert torch.equal(got["observation"][:2], a["observation"])
    # parts of another structure: None, and nothing written
    before = got.clone()
    other = TensorDict({"observation": torch.zeros(2, 3, 2)}, batch_size=(2,))
    assert rows.land([parts[0], unpack_frame(pack(other))], [2, 2]) is None
    wider = flat_sample()
    wider["observation"] = torch.zeros(2, 3, 3)
    assert rows.land([parts[0], unpack_frame(pack(wider))], [2, 2]) is None
    assert rows.land(parts, [1, 3]) is None  # (a part of other rows than it says)
    assert_same(got, before)
    # nothing to plan from: None
    scalar = TensorDict({"x": torch.zeros(3)}, batch_size=())
    assert FlatRows.plan([unpack_frame(pack(scalar))], 1) is None
    assert FlatRows.plan([None, None], 4) is None


def test_unpack_reads_only_the_rows_asked_for():
    want = flat_sample()
    packed = pickle.loads(pickle.dumps(pack(want), protocol=5))
    for lo, n in ((0, 2), (1, 1), (0, 1), (2, 0)):
        assert_same(unpack(packed, (lo, n)), want[lo : lo + n])
    nested = sample(4).expand(3).clone()  # (the general path: indexed after unpacking)
    got = unpack(pack(nested), (1, 2))
    assert got.batch_size == (2,) and torch.equal(got["observation"], nested["observation"][1:])
    # rows of what is not a TensorDict: an error, not a slice of something else
    scalar = TensorDict({"x": torch.zeros(3)}, batch_size=())
    for other in (pack((want, want)), pack(scalar)):
        with pytest.raises(ValueError, match="rows"):
            unpack(other, (0, 1))


def test_packing_rows_again_reads_their_views_once_and_sees_new_tensors():
    td = flat_sample()
    views: dict = {}
    first = unpack(pack(td, views))
    assert len(views) == 1
    td["count"].add_(10)  # (in place: the cached views see it)
    assert unpack(pack(td, views))["count"].tolist() == [17, 7]
    td["count"] = torch.tensor([1, 2])  # (a new tensor: read again)
    td["extra"] = torch.zeros(2)
    got = unpack(pack(td, views))
    assert got["count"].tolist() == [1, 2] and "extra" in got.keys()
    assert_same(first, flat_sample())


def unpack_frame(packed):
    """What a flat pack holds once it crossed a frame (pickled and back)."""
    kind, body = pickle.loads(pickle.dumps(packed, protocol=5))
    assert kind == "f"
    return body
