"""A whole-batch step_and_maybe_reset writes the reset envs' non-tensor entries (text) into
the next input, as it writes their tensors."""

from __future__ import annotations

from functools import partial

import pytest
from tensordict import NonTensorData, NonTensorStack

from aenv import AsyncEnvPool
from aenv.testing import TextEnv

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("backend", ["coroutine", "thread", "process"])
async def test_a_reset_env_gets_its_reset_text(backend):
    fns = [partial(TextEnv, max_steps=1, prompt="p0"), partial(TextEnv, max_steps=3, prompt="p1")]
    async with AsyncEnvPool(fns, backend=backend) as pool:
        td = await pool.reset()
        td.set("action", NonTensorStack(NonTensorData("x"), NonTensorData("y")))
        stepped, nxt = await pool.step_and_maybe_reset(td)
        assert stepped["next", "history"].tolist() == ["p0 x", "p1 y"]
        assert stepped["next", "done"].squeeze(-1).tolist() == [True, False]
        # env 0 ended its episode: its next input is its reset's prompt; env 1 goes on
        assert nxt["history"].tolist() == ["p0", "p1 y"]
        nxt.set("action", NonTensorStack(NonTensorData("u"), NonTensorData("v")))
        stepped, _ = await pool.step_and_maybe_reset(nxt)
        assert stepped["next", "history"].tolist() == ["p0 u", "p1 y v"]
