"""Issue 22 item 10: a sub-env receives what a bare env receives, on every backend and every
entry point. The README's ``RemoteToolEnv`` reads ``td["obs"]`` in its ``_step``; process
workers used to get only the action and state keys of their input (``KeyError: 'obs'`` on
``pool.step``, ``pool.rollout``, the streamed sends and ``ParallelEnv``).

The env below also reports what it saw (``seen`` = the ``obs`` of its step input, ``saw_done``
= its ``done``), so every test checks the values, not only that the key was there: a step
fed a stale observation (the rollout's next input of an env that was just reset, say) fails.
"""

from __future__ import annotations

import os

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenv import Composite, EnvBase, ParallelEnv, SerialEnv, Unbounded
from aenv.pool import AsyncEnvPool

os.environ.setdefault("AENV_START_METHOD", "forkserver")

pytestmark = pytest.mark.timeout(120)

BACKENDS = ["coroutine", "thread", "process"]
N = 3


class ReadsObs(EnvBase):
    """``obs`` grows by each action; episodes of ``3 + seed`` steps start at ``10 * seed``."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.seed = seed
        self.observation_spec = Composite(
            obs=Unbounded((1,)), seen=Unbounded((1,)), saw_done=Unbounded((1,))
        )
        self.action_spec = Unbounded((1,))
        self.t = 0

    def _set_seed(self, seed: int | None) -> None:
        pass

    async def _reset(self, td: TensorDictBase | None, **kwargs: object) -> TensorDictBase:
        self.t = 0
        start = torch.full((1,), 10.0 * self.seed)
        return TensorDict(obs=start, seen=-torch.ones(1), saw_done=-torch.ones(1))

    async def _step(self, td: TensorDictBase) -> TensorDictBase:
        self.t += 1
        return TensorDict(
            obs=td["obs"] + td["action"],
            seen=td["obs"].clone(),
            saw_done=td["done"].float(),
            reward=torch.ones(1),
            done=torch.tensor([self.t >= 3 + self.seed]),
        )


def _fns() -> list:
    return [lambda i=i: ReadsObs(i) for i in range(N)]


def _check_saw_inputs(steps: TensorDictBase) -> None:
    """Every recorded step's env saw that step's input observation and done flag."""
    torch.testing.assert_close(steps["next", "seen"], steps["obs"])
    torch.testing.assert_close(steps["next", "saw_done"], steps["done"].float())
    torch.testing.assert_close(steps["next", "obs"], steps["obs"] + steps["action"])


@pytest.mark.parametrize("backend", BACKENDS)
async def test_whole_batch_calls(backend: str) -> None:
    async with AsyncEnvPool(_fns(), backend=backend) as pool:
        td = await pool.reset()
        for _ in range(5):  # through the envs' first resets
            td = pool.rand_action(td)
            stepped, td = await pool.step_and_maybe_reset(td)
            _check_saw_inputs(stepped)
        td = pool.rand_action(td)
        out = await pool.step(td)
        _check_saw_inputs(out)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_rollouts(backend: str) -> None:
    """Random rollouts with resets (the process backend's overlapped loop: each step's
    input observation is the last step's, or the reset's where the env was done), rollouts
    that stop at a done, and rollouts under a policy."""
    async with AsyncEnvPool(_fns(), backend=backend) as pool:
        _check_saw_inputs(await pool.rollout(12, break_when_any_done=False))
        _check_saw_inputs(await pool.rollout(12))

        def policy(td: TensorDictBase) -> TensorDictBase:
            return td.set("action", td["obs"] * 0 + 0.5)

        _check_saw_inputs(await pool.rollout(9, policy, break_when_any_done=False))


@pytest.mark.parametrize("backend", BACKENDS)
async def test_streamed_and_per_env_calls(backend: str) -> None:
    async with AsyncEnvPool(_fns(), backend=backend) as pool:
        td = await pool.reset()
        pool.async_step_send(pool.rand_action(td), env_index=list(range(N)))
        for _ in range(8):
            out = await pool.async_step_recv(min_get=1)
            _check_saw_inputs(out)
            nxt = pool.step_mdp(out)
            pool.async_step_and_maybe_reset_send(pool.rand_action(nxt))
            out = await pool.async_step_and_maybe_reset_recv(min_get=len(nxt))
            _check_saw_inputs(out[0] if isinstance(out, tuple) else out)
            nxt = out[1] if isinstance(out, tuple) else pool.step_mdp(out)
            pool.async_step_send(pool.rand_action(nxt))
        await pool.async_step_recv(min_get=N)
        one = (await pool.reset())[1]
        one["action"] = torch.ones(1)
        _check_saw_inputs(await pool.step_one(1, one))


@pytest.mark.parametrize("facade", [SerialEnv, ParallelEnv])
def test_sync_facades(facade: type) -> None:
    env = facade(N, _fns())
    try:
        _check_saw_inputs(env.rollout(10, break_when_any_done=False))
        td = env.rand_action(env.reset())
        _check_saw_inputs(env.step(td))
    finally:
        env.close()


async def test_an_input_without_the_observation_gives_what_a_bare_env_gives() -> None:
    """An input that lacks a key the env reads fails as it fails on a bare env (the step
    is not fed a stale observation from the env's slot)."""
    bare = ReadsObs()
    await bare.reset()
    action = TensorDict(action=torch.ones(1))
    with pytest.raises(KeyError, match="obs"):
        await bare.step(action.clone())
    async with AsyncEnvPool(_fns(), backend="process") as pool:
        await pool.reset()
        actions = TensorDict(action=torch.ones(N, 1), batch_size=[N])
        with pytest.raises(Exception, match="obs") as info:
            await pool.step(actions)
        assert "KeyError" in repr(info.value) or "KeyError" in str(info.value.__cause__)
