"""GymWrapper's step writer: a process worker's step of a GymEnv written straight into the
env's shared-memory result slot (``EnvBase._step_writer``).

Each step written must hold exactly what ``env.step`` gives (values, dtypes, shapes, the env
state it leaves), the writer must step aside whenever the per-step fast path would, and a
process pool of GymEnvs must give the coroutine pool's rollouts, resets inside included.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

import cloudpickle
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.libs.gym import GymEnv
from aenv.pool import AsyncEnvPool

pytestmark = pytest.mark.timeout(120)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = ("observation", "reward", "terminated", "truncated", "done")
ENVS = [
    ("CartPole-v1", {}),
    ("CartPole-v1", {"categorical_action_encoding": True}),
    ("Pendulum-v1", {}),
    ("MountainCarContinuous-v0", {}),
    ("FrozenLake-v1", {}),  # discrete observation: the reader path, not a plain array copy
]


def leaves_for(env: GymEnv) -> dict[str, torch.Tensor]:
    """Zeroed tensors shaped as a result slot's leaves for ``env``."""
    out = {}
    for group in (env.full_observation_spec, env.full_reward_spec, env.full_done_spec):
        for key in group.keys():
            out[key] = group[key].zero()
    return out


@pytest.mark.parametrize(("env_id", "kwargs"), ENVS, ids=[f"{e}{k}" for e, k in ENVS])
async def test_written_steps_equal_env_steps(env_id, kwargs):
    written, stepped = GymEnv(env_id, **kwargs), GymEnv(env_id, **kwargs)
    leaves = leaves_for(written)
    write = written._step_writer(leaves)
    assert write is not None
    torch.manual_seed(0)
    tds = [await written.reset(seed=3), await stepped.reset(seed=3)]
    episodes = 0
    for _ in range(250):
        action = written.rand_action(tds[0].clone())
        done = write(action)
        expected = (await stepped.step(action.clone()))["next"]
        assert type(done) is bool
        for key in KEYS:
            got, want = leaves[key], expected[key]
            assert got.dtype == want.dtype and got.shape == want.shape, key
            assert torch.equal(got, want), key
        assert done == bool(expected["done"])
        if done:
            episodes += 1
            tds = [await written.reset(seed=episodes), await stepped.reset(seed=episodes)]
    if env_id == "CartPole-v1":
        assert episodes > 3  # episode ends were written too


async def test_the_writer_steps_aside_where_the_fast_path_would():
    env = GymEnv("CartPole-v1")
    leaves = leaves_for(env)
    assert env._step_writer(leaves) is not None
    # a leaf more, a leaf less, another dtype or shape
    assert env._step_writer({**leaves, "extra": torch.zeros(1)}) is None
    assert env._step_writer({k: v for k, v in leaves.items() if k != "truncated"}) is None
    assert env._step_writer({**leaves, "reward": torch.zeros(1, dtype=torch.float64)}) is None
    assert env._step_writer({**leaves, "observation": torch.zeros(5)}) is None
    # type checks on, info readers, a replaced step (class or instance): the generic path
    env.run_type_checks = True
    assert env._step_writer(leaves) is None
    env.run_type_checks = False

    class Subclass(GymEnv):
        def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
            return super()._step(tensordict)

    assert Subclass("CartPole-v1")._step_writer(leaves) is None
    other = GymEnv("CartPole-v1")
    other._step = other._step  # type: ignore[method-assign]
    assert other._step_writer(leaves) is None
    pixels = GymEnv("CartPole-v1", from_pixels=True, pixels_only=False, render_mode="rgb_array")
    assert pixels._step_writer(leaves_for(pixels)) is None


async def test_an_observation_off_its_spec_comes_back_as_a_tensordict():
    # a reader giving another shape than the slot's: nothing half-written is passed off
    # as the step, the caller gets the step's TensorDict to finish as usual
    env = GymEnv("CartPole-v1")
    leaves = leaves_for(env)
    shape = env._fast_obs[2]
    env._fast_obs = (lambda obs: torch.zeros(2), None, shape)
    write = env._step_writer(leaves)
    assert write is not None
    await env.reset(seed=0)
    out = write(TensorDict({"action": torch.tensor([0, 1])}, []))
    assert isinstance(out, TensorDictBase)
    assert torch.equal(out["observation"], torch.zeros(2))
    assert set(out.keys()) == set(KEYS)


async def _pool_rollouts(backend: str) -> list[TensorDictBase]:
    options: dict[str, Any] = {}
    if backend == "process":
        options = {"num_workers": 2, "start_method": "forkserver"}
    fns = [partial(GymEnv, "CartPole-v1") for _ in range(4)]
    async with AsyncEnvPool(fns, backend=backend, backend_options=options) as pool:
        await pool.set_seed(11)
        torch.manual_seed(2)
        out = [await pool.rollout(60, break_when_any_done=False)]
        td = await pool.reset()
        for _ in range(30):
            stepped, td = await pool.step_and_maybe_reset(pool.rand_action(td))
            out.append(stepped.clone())
        out.append(await pool.step(pool.rand_action(td)))
        return out


async def test_process_pool_of_gym_envs_equals_the_coroutine_pool():
    expected = await _pool_rollouts("coroutine")
    got = await _pool_rollouts("process")
    # episodes ended inside the rollout (resets written by the workers)
    assert expected[0]["next", "done"].any()
    for a, b in zip(expected, got, strict=True):
        assert sorted(a.keys(True, True), key=str) == sorted(b.keys(True, True), key=str)
        for key in a.keys(True, True):
            x, y = a.get(key), b.get(key)
            assert x.dtype == y.dtype and x.shape == y.shape, key
            assert torch.equal(x, y), key
