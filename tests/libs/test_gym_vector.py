from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from aenv import acheck_env_specs
from aenv.exceptions import ResetNeededError
from aenv.libs.gym import DefaultInfoDictReader, GymEnv, GymWrapper
from aenv.specs import Composite, Unbounded

MODES = ["next_step", "same_step", "disabled"]


def _one_hot(idx: list[int]) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(idx), 2)


def _reference(seed: int, n: int, actions: list[list[int]]):
    """Per sub-env trajectories of independent CartPoles (seed + i), reset on done."""
    envs = [gym.make("CartPole-v1") for _ in range(n)]
    first = [e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]
    steps = []
    for acts in actions:
        row = []
        for i, e in enumerate(envs):
            obs, r, term, trunc, _ = e.step(acts[i])
            start = e.reset()[0] if term or trunc else None
            row.append((obs, r, term, trunc, start))
        steps.append(row)
    return first, steps


@pytest.mark.parametrize("mode", MODES)
async def test_vector_modes_match_independent_envs(mode):
    n = 3
    env = GymEnv("CartPole-v1", num_envs=n, autoreset_mode=mode)
    assert env.batch_size == (n,)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, size=(60, n)).tolist()
    first, ref = _reference(7, n, actions)
    td = await env.reset(seed=7)
    assert np.allclose(td["observation"].numpy(), np.stack(first))
    saw_done = False
    for t, acts in enumerate(actions):
        td["action"] = _one_hot(acts)
        td, td_next = await env.step_and_maybe_reset(td)
        for i in range(n):
            obs, r, term, trunc, start = ref[t][i]
            # the last observation of an episode is never replaced by the next start
            assert np.allclose(td["next", "observation"][i].numpy(), obs), (t, i)
            assert td["next", "terminated"][i].item() == term
            assert td["next", "truncated"][i].item() == trunc
            assert td["next", "reward"][i].item() == r
            if start is not None:
                saw_done = True
                assert np.allclose(td_next["observation"][i].numpy(), start), (t, i)
                assert not td_next["done"][i].item()
        td = td_next
    assert saw_done
    await env.aclose()


@pytest.mark.parametrize("mode", MODES)
async def test_vector_stepping_finished_env_needs_reset(mode):
    env = GymEnv("CartPole-v1", num_envs=2, autoreset_mode=mode)
    td = await env.reset(seed=0)
    for _ in range(200):
        td["action"] = _one_hot([0, 0])
        td = await env.step(td)
        if td["next", "done"].any():
            break
        td = env._step_mdp(td)
    td = env._step_mdp(td)
    td["action"] = _one_hot([0, 0])
    with pytest.raises(ResetNeededError):
        await env.step(td)


@pytest.mark.parametrize("mode", MODES)
async def test_vector_rollout_break_when_all_done(mode):
    env = GymEnv("CartPole-v1", num_envs=3, autoreset_mode=mode)
    r = await env.rollout(500, break_when_all_done=True)
    done = r["next", "done"].squeeze(-1)
    assert done[:, -1].any()
    for i in range(3):
        first = int(done[i].nonzero()[0])
        # after its episode ended, an env's values are frozen (partial steps)
        assert (r["next", "observation"][i, first:] == r["next", "observation"][i, first]).all()
        assert (r["next", "reward"][i, first + 1 :] == 0).all()


async def test_vector_partial_step_of_live_env_rejected():
    env = GymEnv("CartPole-v1", num_envs=2)
    td = await env.reset(seed=0)
    td["action"] = _one_hot([0, 1])
    td["_step"] = torch.tensor([True, False])
    with pytest.raises(ValueError, match="steps all its sub-envs"):
        await env.step(td)


async def test_vector_async_backend_and_specs():
    env = GymEnv("CartPole-v1", num_envs=2, vectorization_mode="async")
    try:
        await acheck_env_specs(env)
        r = await env.rollout(30, break_when_any_done=False)
        assert r.batch_size == (2, 30)
    finally:
        await env.aclose()


async def test_vector_info_reader_and_wrapper():
    venv = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    env = GymWrapper(venv, categorical_action_encoding=True)
    assert env.action_spec.shape == (2,)
    venv2 = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    )
    # episode statistics appear only when an episode ends: their spec is given
    stats = Composite(
        r=Unbounded((2,), dtype=torch.float64), l=Unbounded((2,), dtype=torch.int64), shape=(2,)
    )
    reader = DefaultInfoDictReader(["episode"], spec={"episode": stats})
    env2 = GymWrapper(venv2).set_info_dict_reader(reader)
    assert ("episode", "r") in env2.observation_keys
    r = await env2.rollout(100)
    done = r["next", "done"].squeeze(-1)
    ep_r = r["next", "episode", "r"]
    ep_l = r["next", "episode", "l"]
    assert done.any()
    i, t = (int(x) for x in done.nonzero()[0])
    assert ep_r[i, t].item() == float(t + 1)  # CartPole: reward 1 per step
    assert ep_l[i, t].item() == t + 1
    assert ep_l[i, :t].eq(0).all()
