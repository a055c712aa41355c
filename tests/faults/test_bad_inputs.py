"""Bad inputs on every entry point: whole-batch, streamed, per-env and facades refuse the
same inputs with the same error (naming the key, the spec and what came) and change
nothing: no env stepped, no env left busy."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from aenv import SerialEnv, SpecViolationError
from aenv.pool import AsyncEnvPool
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(90)

N = 2


def _bad_inputs(batch: tuple[int, ...]) -> dict[str, TensorDict]:
    """One bad input of each kind, for a batch of ``batch`` envs (() for one env)."""
    return {
        "missing": TensorDict({}, batch),
        "shape": TensorDict(action=torch.zeros(*batch, 2, dtype=torch.int64), batch_size=batch),
        "value": TensorDict(action=torch.full((*batch, 1), 0.5), batch_size=batch),
        "range": TensorDict(action=torch.full((*batch, 1), 2.0**70), batch_size=batch),
    }


def _check(err: SpecViolationError, kind: str) -> None:
    msg = str(err)
    assert err.key == "action" and "'action'" in msg, msg
    assert "Categorical" in msg, msg  # the spec
    if kind == "shape":
        assert "(2,)" in msg or ", 2)" in msg, msg  # what came
    if kind == "value":
        assert "0.5" in msg, msg


async def _entry_points(pool: AsyncEnvPool, td: TensorDict, kind: str) -> None:
    one = td[0]
    calls = {
        "step": lambda: pool.step(td),
        "step_and_maybe_reset": lambda: pool.step_and_maybe_reset(td),
        "async_step_send": lambda: pool.async_step_send(td, env_index=[0, 1]),
        "async_step_send one": lambda: pool.async_step_send(one, env_index=1),
        "async_step_and_maybe_reset_send": lambda: pool.async_step_and_maybe_reset_send(
            td, env_index=[0, 1]
        ),
        "step_one": lambda: pool.step_one(0, one),
        "step_and_maybe_reset_one": lambda: pool.step_and_maybe_reset_one(1, one),
    }
    for name, call in calls.items():
        with pytest.raises(SpecViolationError) as info:
            out = call()
            if out is not None:
                await out
        _check(info.value, kind)
        assert name  # (in the traceback when a case fails)


@pytest.mark.parametrize("backend", ["coroutine", "thread", "process"])
async def test_every_entry_point_refuses_bad_actions_and_changes_nothing(backend: str):
    async with AsyncEnvPool([lambda: CountingEnv(max_steps=100)] * N, backend=backend) as pool:
        await pool.reset()
        for kind, td in _bad_inputs((N,)).items():
            await _entry_points(pool, td, kind)
        # nothing was stepped, nothing is busy: the next good step counts 1 everywhere,
        # streamed and per-env alike
        good = TensorDict(action=torch.zeros(N, 1, dtype=torch.int64), batch_size=[N])
        out = await pool.step(good)
        assert out["next", "observation"].view(-1).tolist() == [1.0, 1.0]
        pool.async_step_send(good, env_index=[0, 1])
        out = await pool.async_step_recv(min_get=N)
        assert out["next", "observation"].view(-1).tolist() == [2.0, 2.0]
        out = await pool.step_one(0, good[0])
        assert out["next", "observation"].item() == 3.0


async def test_a_castable_action_is_cast_on_the_streamed_path_as_on_the_batch_path():
    async with AsyncEnvPool([lambda: CountingEnv(max_steps=100)] * N) as pool:
        await pool.reset()
        td = TensorDict(action=torch.ones(N, 1, dtype=torch.float64), batch_size=[N])
        pool.async_step_send(td, env_index=[0, 1])
        out = await pool.async_step_recv(min_get=N)
        assert out["action"].dtype == torch.int64
        assert out["next", "observation"].view(-1).tolist() == [1.0, 1.0]


def test_the_sync_facade_refuses_bad_actions_and_goes_on():
    env = SerialEnv(N, lambda: CountingEnv(max_steps=100))
    try:
        env.reset()
        for kind, td in _bad_inputs((N,)).items():
            with pytest.raises(SpecViolationError) as info:
                env.step(td)
            _check(info.value, kind)
        out = env.step(TensorDict(action=torch.zeros(N, 1, dtype=torch.int64), batch_size=[N]))
        assert out["next", "observation"].view(-1).tolist() == [1.0, 1.0]
    finally:
        env.close()
