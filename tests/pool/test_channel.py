"""The process backend's framed channel: frames larger than one socket read arrive whole."""

from __future__ import annotations

import select
import socket
import sys
import threading

import cloudpickle
import numpy as np
import pytest

from aenv.pool import AsyncEnvPool
from aenv.pool._channel import Channel
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(60)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_a_frame_bigger_than_one_read_is_reassembled():
    a, b = socket.socketpair()
    left, right = Channel(a), Channel(b)
    big = np.arange(700_000, dtype=np.uint8)  # more than the 256 KiB of one read
    writer = threading.Thread(target=left.flush_blocking, kwargs={"timeout": 20})
    try:
        left.send(("big", big))
        left.send("after")
        writer.start()
        got: list = []
        while len(got) < 2:
            ready, _, _ = select.select([right.fd], [], [], 20)
            assert ready, "no data from the writer"
            got.extend(right.read_frames())
        assert got[0][0] == "big" and np.array_equal(got[0][1], big) and got[1] == "after"
    finally:
        writer.join(timeout=20)
        left.close()
        right.close()


class Framed(CountingEnv):
    def frame(self, n: int) -> np.ndarray:
        return np.full(n, 7, dtype=np.uint8)


async def test_a_large_call_result_from_a_worker():
    # a rendered frame (400 x 600 x 3) is about 720 KB: more than one socket read
    async with AsyncEnvPool([Framed] * 2, backend="process") as pool:
        out = await pool.call("frame", 720_000)
        assert [o.shape for o in out] == [(720_000,)] * 2 and int(out[1][-1]) == 7
        await pool.reset()  # and the pool goes on
