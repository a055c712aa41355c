"""The env of the fault suite: a counting env whose action picks a fault."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

import anyio
import cloudpickle
from tensordict import TensorDictBase

from aenv.specs import Categorical
from aenv.testing import CountingEnv

cloudpickle.register_pickle_by_value(sys.modules[__name__])

NORMAL, RAISE, EXIT, SIGKILL, SEGV, HANG_ASYNC, HANG_BLOCKING = range(7)
CRASHES = {"raise": RAISE, "exit": EXIT, "sigkill": SIGKILL, "segfault": SEGV}


def _fault(a: int) -> None:
    if a == RAISE:
        raise RuntimeError("injected fault")
    if a == EXIT:
        os._exit(7)
    if a == SIGKILL:
        os.kill(os.getpid(), signal.SIGKILL)
    if a == SEGV:
        ctypes.string_at(0)
    if a == HANG_BLOCKING:
        time.sleep(3600)


class FaultEnv(CountingEnv):
    """Counts its steps (never done); its action (one per env) picks a fault. Async: an
    async hang awaits forever; a blocking hang blocks the loop it runs on."""

    def __init__(self) -> None:
        super().__init__(max_steps=10**9)
        self.action_spec = Categorical(7, shape=(1,))

    async def _step(self, tensordict: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        a = int(tensordict["action"])
        if a == HANG_ASYNC:
            await anyio.sleep_forever()
        _fault(a)
        return CountingEnv._step(self, tensordict)


class BlockingFaultEnv(CountingEnv):
    """As :class:`FaultEnv`, with a sync step declared blocking (run in a thread on the
    coroutine backend): its hangs are blocking calls."""

    blocking = True

    def __init__(self) -> None:
        super().__init__(max_steps=10**9)
        self.action_spec = Categorical(7, shape=(1,))

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        a = int(tensordict["action"])
        _fault(HANG_BLOCKING if a == HANG_ASYNC else a)
        return CountingEnv._step(self, tensordict)
