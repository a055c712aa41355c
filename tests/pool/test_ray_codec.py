"""The Ray backend's codec (:mod:`aenv.pool._ray_actor`), which needs no cluster: payloads
and results as pickled numpy arrays, big arrays beside the pickle (out of band for Ray)."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from aenv.pool._codec import BIG_BYTES
from aenv.pool._ray_actor import pack, unpack


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
