"""Rollout semantics TorchRL users rely on, on every loop a rollout may take (the generic
loop, GymWrapper's whole rollout, the process pool's overlapped one): out-of-place and plain
``nn.Module`` policies, rollouts chained from the last step of another, and a long rollout of
sync envs letting the event loop run.
"""

from __future__ import annotations

import asyncio
import sys
from functools import partial

import cloudpickle
import pytest
import torch
from tensordict import TensorDict

from aenv import AsyncEnvPool, EnvBase, GymEnv, step_mdp
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(120)
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # envs built in workers


def _loops() -> list[tuple[str, object]]:
    return [
        ("counting", partial(CountingEnv, max_steps=2)),
        ("gym", partial(GymEnv, "CartPole-v1")),
    ]


@pytest.mark.parametrize(("name", "make"), _loops(), ids=[n for n, _ in _loops()])
async def test_an_out_of_place_policy_is_merged_into_its_input(name, make):
    env = make()
    action = env.full_action_spec["action"].rand()  # (a valid one: one-hot on CartPole)

    def policy(td):
        return td.empty().set("action", action.clone())

    r = await env.rollout(3, policy, break_when_any_done=False)
    # the root observation and done flags are still there (TorchRL merges the output)
    assert "observation" in r.keys() and "done" in r.keys()
    assert r.batch_size == torch.Size([3])
    assert torch.equal(r["action"][0], action)
    await env.aclose()


async def test_a_plain_module_policy_reads_the_observation_and_writes_the_action():
    env = GymEnv("Pendulum-v1")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    r = await env.rollout(5, net)
    assert r["action"].shape == (5, 1)
    with torch.no_grad():
        assert torch.allclose(r["action"], net(r["observation"]))
    await env.aclose()


class _ResetCounter(CountingEnv):
    """A counting env that counts its resets."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.resets = 0

    def _reset(self, tensordict, **kwargs):
        self.resets += 1
        return super()._reset(tensordict, **kwargs)


async def test_a_chained_rollout_resets_what_the_last_step_ended_and_nothing_more():
    env = _ResetCounter(max_steps=2)
    td = await env.reset()
    r1 = await env.rollout(4, auto_reset=False, break_when_any_done=False, tensordict=td)
    # steps 1, 2 (done), reset, 1, 2 (done): the last step ended an episode, and the env was
    # not reset after it
    assert r1["next", "observation"].squeeze(-1).tolist() == [1, 2, 1, 2]
    assert env.resets == 2
    r2 = await env.rollout(
        2, auto_reset=False, break_when_any_done=False, tensordict=step_mdp(r1[..., -1])
    )
    # the input said done: reset first; then a real transition 0 -> 1, never 2 -> 1
    assert env.resets == 3
    assert r2["observation"].squeeze(-1).tolist() == [0, 1]
    assert r2["next", "observation"].squeeze(-1).tolist() == [1, 2]


async def test_a_gym_rollout_leaves_the_env_where_its_last_step_left_it():
    # CartPole from seed 0 with action 0 ends its episode at step 10: a rollout of exactly
    # that many steps must not reset after it (time rows written by the env's hooks and
    # TensorDicts from the default hooks alike), so the next rollout from its last step
    # starts with a reset
    for generic in (False, True):
        env = GymEnv("CartPole-v1", categorical_action_encoding=True)
        if generic:
            env._step_into = EnvBase._step_into.__get__(env)  # type: ignore[method-assign]
            env._reset_into = EnvBase._reset_into.__get__(env)  # type: ignore[method-assign]
        resets = 0
        base_reset = env._env.reset

        def counted(*args, _base=base_reset, **kwargs):
            nonlocal resets
            resets += 1
            return _base(*args, **kwargs)

        env._env.reset = counted

        def zero(td):
            return td.set("action", torch.zeros((), dtype=torch.int64))

        td = await env.reset(seed=0)
        r = await env.rollout(200, zero, auto_reset=False, break_when_any_done=True, tensordict=td)
        n = r.batch_size[0]
        assert r["next", "done"][-1].item()
        resets = 0
        r = await env.rollout(
            n, zero, auto_reset=False, break_when_any_done=False, tensordict=await env.reset(seed=0)
        )
        assert resets == 1  # the reset above; none after the rollout's last (done) step
        r2 = await env.rollout(
            2, zero, auto_reset=False, break_when_any_done=False, tensordict=step_mdp(r[..., -1])
        )
        assert resets == 2
        assert not r2["done"][0].item()
        await env.aclose()


@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_a_pool_rollout_does_not_reset_after_its_last_step(backend):
    options = {"num_workers": 2} if backend == "process" else {}
    fns = [partial(CountingEnv, max_steps=2)] * 2
    async with AsyncEnvPool(fns, backend=backend, backend_options=options) as pool:
        td = await pool.reset()
        r = await pool.rollout(2, auto_reset=False, break_when_any_done=False, tensordict=td)
        assert r["next", "done"][:, -1].all()
        # the envs were left where the last step left them: stepping on (done flags
        # cleared by hand) counts on to 3, where a reset env would say 1
        nxt = step_mdp(r[..., -1])
        for key in ("done", "terminated"):
            nxt[key] = torch.zeros_like(nxt[key])
        out = await pool.step(pool.rand_action(nxt))
        assert out["next", "observation"].squeeze(-1).tolist() == [3, 3]


async def test_a_long_rollout_of_sync_envs_lets_other_tasks_run():
    env = CountingEnv(max_steps=10_000)
    ticks = 0
    stop = asyncio.Event()

    async def heartbeat():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(heartbeat())
    await asyncio.sleep(0)
    before = ticks
    await env.rollout(1_000)
    during = ticks - before
    stop.set()
    await task
    assert during >= 1_000 // 64 - 1


async def test_a_long_rollout_can_be_cancelled():
    env = CountingEnv(max_steps=10**9)
    started = asyncio.Event()

    async def run():
        started.set()
        await env.rollout(10**7)

    task = asyncio.create_task(run())
    await started.wait()
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # the env is usable again at once
    td = await env.reset()
    assert isinstance(td, TensorDict)


class _FailsAt(CountingEnv):
    """Env 1 of a pool raises on its step number ``at``."""

    def _step(self, tensordict):
        if self.start_val == 1 and int(self.count.max()) - 1 >= 2:
            raise ValueError("env 1 fails at its third step")
        return super()._step(tensordict)


@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_a_pool_rollout_that_fails_keeps_the_steps_it_had(backend):
    from aenv.exceptions import PoolError

    options = {"num_workers": 2} if backend == "process" else {}
    fns = [partial(_FailsAt, max_steps=100, start_val=v) for v in (0, 1)]
    async with AsyncEnvPool(fns, backend=backend, backend_options=options) as pool:
        with pytest.raises(PoolError) as info:
            await pool.rollout(10, break_when_any_done=False)
    kept = info.value.rollout
    assert kept is not None and kept.batch_size == torch.Size([2, 2])
    assert kept["next", "observation"][0].squeeze(-1).tolist() == [1, 2]


async def test_env_index_must_hold_integers():
    async with AsyncEnvPool([CountingEnv] * 3) as pool:
        td = await pool.reset()
        one = pool.rand_action(td)[1]
        for bad in (1.7, True, "1", None):
            with pytest.raises(TypeError, match="env_index must be"):
                pool.async_step_send(one, env_index=bad if bad is not None else [1.5])
        with pytest.raises(TypeError, match="env_index must be"):
            pool.async_step_send(pool.rand_action(td)[:2], env_index=torch.tensor([0.0, 1.0]))
        with pytest.raises(TypeError, match="env_index must be"):
            await pool.step_one(1.7, one)  # type: ignore[arg-type]
        # nothing was sent: every env is free
        pool.async_step_send(pool.rand_action(td), env_index=torch.arange(3))
        out = await pool.async_step_recv(min_get=3)
        assert sorted(out["env_index"].tolist()) == [0, 1, 2]
