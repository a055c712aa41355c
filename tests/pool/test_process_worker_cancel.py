"""The worker's serving loop survives an op cancelled before its task ever ran.

Regression test: a command frame holding ``op``, ``cancel`` for it and the next ``op`` for
the same env made the worker queue the second op behind a task that never ran its body
(asyncio does not run a coroutine cancelled before its first step), so the pool waited for
ever. Driven in-process against the worker's runtime, with a recording channel.
"""

from __future__ import annotations

import asyncio
import pickle

from _support.process import Recorder

from aenv.pool import _codec as codec
from aenv.pool._process_worker import FAILED, PICKLED, _Runtime
from aenv.testing import LatencyEnv


async def _replies(chan: Recorder, seq: int) -> tuple:
    while True:
        for msg in chan.sent:
            if msg[0] == "r" and msg[2] == seq:
                return msg
        chan.arrived.clear()
        await chan.arrived.wait()


async def test_op_cancelled_before_it_started_does_not_block_the_next():
    env = LatencyEnv(latency=0.001)
    td = env.rand_action(await env.reset())
    data = pickle.dumps(td)
    chan = Recorder()
    rt = _Runtime(chan, {0: env}, {0: lambda: LatencyEnv(latency=0.001)}, {0: None})  # type: ignore[arg-type]
    rt.loop = asyncio.get_running_loop()
    rt._handle_frames([[("op", 0, 1, "step", data), ("cancel", 0, 1), ("op", 0, 2, "step", data)]])
    msg = await asyncio.wait_for(_replies(chan, 2), timeout=10)
    assert msg[3] == PICKLED, pickle.loads(msg[4]) if msg[3] == FAILED else msg
    assert "observation" in codec.loads(msg[4]).keys()
    # the cancelled op never answers, and no task is left behind
    assert not any(m[0] == "r" and m[2] == 1 for m in chan.sent)
    assert rt.tasks == {}
