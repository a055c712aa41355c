"""A hung blocking env never keeps the interpreter from exiting (its threads are daemons)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = """
import asyncio, threading, warnings
import torch
from tensordict import TensorDict
from aenv import AsyncEnvPool, Composite, EnvBase, Unbounded
from aenv.exceptions import PoolError, StepTimeoutError

warnings.simplefilter("ignore")

class Hang(EnvBase):
    blocking = True

    def __init__(self):
        super().__init__()
        self.observation_spec = Composite(obs=Unbounded((1,)))
        self.action_spec = Unbounded((1,))

    def _set_seed(self, seed):
        pass

    def _reset(self, td, **kwargs):
        return TensorDict(obs=torch.zeros(1))

    def _step(self, td):
        threading.Event().wait()  # a sync call that never returns

async def main():
    async with AsyncEnvPool([Hang], step_timeout=0.3) as pool:
        td = await pool.reset()
        try:
            await pool.step(pool.rand_action(td))
        except PoolError as err:
            assert isinstance(err.errors[0], StepTimeoutError), err.errors
            print("timed out", flush=True)
    td = await Hang().reset()
    try:
        async with asyncio.timeout(0.3):
            await asyncio.shield(asyncio.ensure_future(Hang().step(Hang().rand_action(td))))
    except TimeoutError:
        print("gave up", flush=True)

asyncio.run(main())
print("main returned", flush=True)
"""


def test_a_hung_blocking_step_does_not_keep_the_interpreter_alive():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["timed", "out", "gave", "up", "main", "returned"]
