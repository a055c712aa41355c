"""CatTensors and CatFrames."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import aenv
from aenv.specs import Bounded, Unbounded
from aenv.testing import CountingEnv, LatencyEnv
from aenv.transforms import CatFrames, CatTensors, Compose, TransformedEnv


async def test_cat_tensors_pendulum_keeps_state():
    env = TransformedEnv(
        aenv.PendulumEnv(seed=0), CatTensors(["thdot", "th"], "obs", del_keys=False)
    )
    spec = env.observation_spec["obs"]
    assert isinstance(spec, Bounded) and spec.shape == (2,)
    # sorted keys: th first, then thdot
    torch.testing.assert_close(spec.high, torch.tensor([torch.pi, 8.0]))
    r = await env.rollout(3)
    torch.testing.assert_close(r["obs"], torch.stack([r["th"], r["thdot"]], -1))
    await aenv.acheck_env_specs(env)
    td = await env.reset(TensorDict({}, batch_size=[5]))
    assert td["obs"].shape == (5, 2)


async def test_cat_tensors_deletes_keys():
    env = TransformedEnv(LatencyEnv(obs_dim=3), CatTensors(["observation", "latency"], "vec"))
    assert "observation" not in env.observation_spec and "latency" not in env.observation_spec
    assert isinstance(env.observation_spec["vec"], Unbounded)
    assert env.observation_spec["vec"].shape == (4,)
    td = await env.rand_step(await env.reset())
    assert "observation" not in td["next"].keys() and td["next", "vec"].shape == (4,)
    await aenv.acheck_env_specs(env)


async def test_cat_tensors_default_keys_and_unsorted():
    env = TransformedEnv(LatencyEnv(obs_dim=2), CatTensors(out_key="vec", sort=False))
    assert env.transform[0].in_keys == ["observation", "latency"]
    await aenv.acheck_env_specs(env)
    with pytest.raises(ValueError):
        CatTensors(["a"], dim=0)


def _counting_frames(n=3, batch_size=(), **kwargs):
    return TransformedEnv(
        CountingEnv(max_steps=100, batch_size=batch_size),
        CatFrames(n, -1, in_keys=["observation"], **kwargs),
    )


async def test_cat_frames_steps_and_spec():
    env = _counting_frames(3)
    assert env.observation_spec["observation"].shape == (3,)
    td = await env.reset()
    assert td["observation"].tolist() == [0.0, 0.0, 0.0]
    for expected in ([0.0, 0.0, 1.0], [0.0, 1.0, 2.0], [1.0, 2.0, 3.0], [2.0, 3.0, 4.0]):
        td = await env.rand_step(td)
        assert td["next", "observation"].tolist() == expected
        td = env._step_mdp(td)
    await aenv.acheck_env_specs(env)


async def test_cat_frames_constant_padding_and_out_key():
    env = TransformedEnv(
        CountingEnv(max_steps=100, start_val=5),
        CatFrames(
            3,
            -1,
            in_keys=["observation"],
            out_keys=["stack"],
            padding="constant",
            padding_value=-1.0,
        ),
    )
    td = await env.reset()
    assert td["stack"].tolist() == [-1.0, -1.0, 5.0]
    assert td["observation"].tolist() == [5.0]
    td = await env.rand_step(td)
    assert td["next", "stack"].tolist() == [-1.0, 5.0, 6.0]
    await aenv.acheck_env_specs(env)


async def test_cat_frames_partial_reset():
    env = _counting_frames(3, batch_size=(3,))
    td = await env.reset()
    for _ in range(3):
        td = env._step_mdp(await env.rand_step(td))
    assert td["observation"][0].tolist() == [1.0, 2.0, 3.0]
    td["_reset"] = torch.tensor([[False], [True], [False]])
    td = await env.reset(td)
    assert td["observation"].tolist() == [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [1.0, 2.0, 3.0]]
    td = env._step_mdp(await env.rand_step(td))
    # the reset element restarted its stack; the others kept theirs
    assert td["observation"].tolist() == [[2.0, 3.0, 4.0], [0.0, 0.0, 1.0], [2.0, 3.0, 4.0]]


async def test_cat_frames_rollout_with_auto_resets():
    env = TransformedEnv(
        CountingEnv(max_steps=2, batch_size=(2,)), CatFrames(2, -1, in_keys=["observation"])
    )
    r = await env.rollout(4, break_when_any_done=False)
    # done at count 2: the env resets, the stack restarts from (0, 0)
    assert r["observation"][0].tolist() == [[0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 1.0]]
    assert r["next", "observation"][0].tolist() == [[0.0, 1.0], [1.0, 2.0], [0.0, 1.0], [1.0, 2.0]]


async def test_cat_frames_forward_on_rollout_data_matches_env():
    base = TransformedEnv(CountingEnv(max_steps=3), Compose())
    raw = await base.rollout(7, break_when_any_done=False)
    online = await TransformedEnv(
        CountingEnv(max_steps=3), CatFrames(3, -1, in_keys=["observation"])
    ).rollout(7, break_when_any_done=False)
    offline = CatFrames(3, -1, in_keys=["observation"])(raw.clone())
    torch.testing.assert_close(offline["observation"], online["observation"])
    torch.testing.assert_close(offline["next", "observation"], online["next", "observation"])


async def test_cat_frames_clone_shares_buffer():
    t = CatFrames(2, -1, in_keys=["observation"])
    env = TransformedEnv(CountingEnv(max_steps=100), t)
    td = await env.reset()
    td = env._step_mdp(await env.rand_step(td))
    clone = t.clone()
    assert clone.parent is None
    td = await env.rand_step(td)
    # the clone sees the buffer updated in place by the env's transform
    assert clone._get_buffer(0).tolist() == [1.0, 2.0]
    with pytest.raises(RuntimeError):
        TransformedEnv(CountingEnv(), t)
    TransformedEnv(CountingEnv(), clone)


async def test_cat_frames_and_traj_counter_on_and_in_pools():
    from aenv.pool import AsyncEnvPool
    from aenv.transforms import TrajCounter

    # on top of a pool: envs finish at different steps, so resets are partial
    pool = AsyncEnvPool([lambda m=m: CountingEnv(max_steps=m) for m in (2, 3)], backend="coroutine")
    env = TransformedEnv(pool, Compose(CatFrames(2, -1, in_keys=["observation"]), TrajCounter()))
    r = await env.rollout(4, break_when_any_done=False)
    assert r["observation"].tolist() == [
        [[0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 1.0]],
        [[0.0, 0.0], [0.0, 1.0], [1.0, 2.0], [0.0, 0.0]],
    ]
    assert r["traj_count"].squeeze(-1).tolist() == [[0, 0, 2, 2], [1, 1, 1, 3]]
    await aenv.acheck_env_specs(env)
    await env.aclose()
    # inside a pool: each sub-env keeps its own frames
    pool = AsyncEnvPool(
        [
            lambda: TransformedEnv(
                CountingEnv(max_steps=3), CatFrames(2, -1, in_keys=["observation"])
            )
            for _ in range(2)
        ],
        backend="coroutine",
    )
    r = await pool.rollout(4, break_when_any_done=False)
    assert r["observation"][1].tolist() == [[0.0, 0.0], [0.0, 1.0], [1.0, 2.0], [0.0, 0.0]]
    await aenv.acheck_env_specs(pool)
    await pool.aclose()
