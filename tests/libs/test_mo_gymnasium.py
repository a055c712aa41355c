"""MOGymEnv / MOGymWrapper over MO-Gymnasium's envs (vector rewards)."""

from __future__ import annotations

import functools

import gymnasium
import numpy as np
import pytest
import torch

mo_gymnasium = pytest.importorskip(
    "mo_gymnasium", reason="MO-Gymnasium is not installed (pip install 'aenv[mo-gymnasium]')"
)

from aenv import (  # noqa: E402
    AsyncEnvPool,
    SyncEnv,
    acheck_env_specs,
    check_env_specs,
    get_available_libraries,
)
from aenv.libs.mo_gymnasium import MOGymEnv, MOGymWrapper  # noqa: E402
from aenv.specs import Bounded  # noqa: E402

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore::UserWarning"),  # gymnasium's notes on vector rewards
]


def _push(velocity: torch.Tensor | float) -> torch.Tensor:
    """Push the way the car moves (a deterministic policy that reaches the hill)."""
    return (torch.as_tensor(velocity) > 0).long() * 2


def _policy(td):
    td["action"] = _push(td["observation"][..., 1])
    return td


def _library_loop(seed: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    env = mo_gymnasium.make("mo-mountaincar-v0")
    obs, _ = env.reset(seed=seed)
    seen, rewards = [obs], []
    for _ in range(steps):
        obs, reward, term, trunc, _ = env.step(int(_push(float(obs[1]))))
        seen.append(obs)
        rewards.append(reward)
        if term or trunc:
            break
    env.close()
    return np.stack(seen), np.stack(rewards)


def test_available_libraries_lists_mo_gymnasium():
    assert get_available_libraries()["mo_gymnasium"] is True


async def test_vector_reward_rollout_matches_library_loop():
    env = MOGymEnv("mo-mountaincar-v0", categorical_action_encoding=True)
    await acheck_env_specs(env)
    assert env.reward_spec.shape == (3,) and isinstance(env.reward_spec, Bounded)
    await env.set_seed(3)
    ours = await env.rollout(40, _policy)
    obs, rewards = _library_loop(3, 40)
    assert torch.equal(ours["observation"], torch.as_tensor(obs[:-1]))
    assert torch.equal(ours["next", "observation"][-1], torch.as_tensor(obs[-1]))
    assert torch.equal(ours["next", "reward"], torch.as_tensor(rewards, dtype=torch.float32))
    # the objectives differ: time penalty always, a reverse/forward penalty only when pushed
    assert (ours["next", "reward"][:, 0] == -1).all()
    assert set(ours["next", "reward"][:, 1:].unique().tolist()) <= {-1.0, 0.0}
    await env.aclose()


def test_sync_two_objectives_and_wrapper():
    env = SyncEnv(MOGymWrapper(mo_gymnasium.make("deep-sea-treasure-v0")))
    check_env_specs(env)
    td = env.rollout(5, break_when_any_done=False)
    assert td["next", "reward"].shape == (5, 2)
    assert (td["next", "reward"][:, 1] == -1).all()  # the time objective
    env.close()


@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_in_a_pool_matches_a_single_env(backend):
    make = functools.partial(MOGymEnv, "mo-mountaincar-v0", categorical_action_encoding=True)
    async with AsyncEnvPool([make] * 2, backend=backend) as pool:
        await pool.set_seed(10)  # env i: seed 10 + i
        out = await pool.rollout(20, _policy, break_when_any_done=False)
    assert out["next", "reward"].shape == (2, 20, 3)
    for i in range(2):
        obs, rewards = _library_loop(10 + i, 20)
        assert torch.equal(out["observation"][i], torch.as_tensor(obs[:-1]))
        assert torch.equal(out["next", "reward"][i], torch.as_tensor(rewards))


async def test_pixels_from_render():
    env = MOGymEnv("mo-mountaincar-v0", from_pixels=True, categorical_action_encoding=True)
    td = await env.reset(seed=0)
    assert td["pixels"].dtype == torch.uint8 and td["pixels"].shape[-1] == 3
    td = await env.step(_policy(td))
    assert td["next", "pixels"].shape == td["pixels"].shape
    await env.aclose()


def test_a_scalar_reward_env_is_refused():
    with pytest.raises(TypeError, match="1-D reward_space"):
        MOGymWrapper(gymnasium.make("CartPole-v1"))
