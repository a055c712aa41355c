"""One env's slow policy call never blocks the others' frames (streaming collector)."""

from __future__ import annotations

from functools import partial

import anyio
import pytest
import torch

from aenv.collectors import Collector
from aenv.pool import AsyncEnvPool
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(90)  # a process pool starts slowly on a loaded machine


@pytest.mark.parametrize("backend", ["coroutine", "thread", "process"])
async def test_a_slow_policy_call_does_not_gate_other_envs(backend):
    others_went_on = anyio.Event()
    frames_of = {0: 0, 1: 0, 2: 0}

    async def policy(td):
        (i,) = td["env_index"].tolist()
        frames_of[i] += 1
        if i == 0 and frames_of[0] == 2:
            # env 0's second call hangs until the others made progress without it
            await others_went_on.wait()
        if frames_of[1] + frames_of[2] >= 6:
            # (a sum: how the other two envs share the batch depends on scheduling; a
            # condition on each could wait for ever on an uneven split)
            others_went_on.set()
        td["action"] = torch.zeros(1, 1, dtype=torch.int64)
        return td

    pool = AsyncEnvPool([partial(CountingEnv, max_steps=100)] * 3, backend=backend)
    c = Collector(pool, policy, frames_per_batch=12, per_env_policy=True, trust_policy=True)
    batch = await c.rollout()
    idx = batch["env_index"].tolist()
    assert len(idx) == 12 and idx.count(1) + idx.count(2) >= 6
    # (with the policy calls awaited one after the other, env 0's hung call would have
    # stopped every env, and the event would never be set: a timeout)
    await c.ashutdown()


async def test_policy_error_is_raised_unwrapped():
    async def policy(td):
        raise ValueError("policy broke")

    c = Collector(AsyncEnvPool([CountingEnv] * 2), policy, frames_per_batch=4, trust_policy=True)
    with pytest.raises(ValueError, match="policy broke"):
        await c.rollout()
    await c.ashutdown()
