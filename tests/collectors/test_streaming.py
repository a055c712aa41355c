"""Collector in streaming mode on pools: frames as envs finish, faults, truncation."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from aenv import EnvStepError
from aenv.collectors import Collector, split_trajectories
from aenv.pool import AsyncEnvPool
from aenv.testing import CountingEnv, FailingEnv, HangingEnv, LatencyEnv

pytestmark = pytest.mark.timeout(60)


def counting_pool(n: int = 2, max_steps: int = 100, **kw) -> AsyncEnvPool:
    return AsyncEnvPool([partial(CountingEnv, max_steps=max_steps)] * n, **kw)


async def test_streaming_is_the_default_on_pools_and_frames_carry_env_and_traj():
    c = Collector(counting_pool(2, max_steps=2), None, frames_per_batch=5, total_frames=10)
    assert c.streaming
    got = [b async for b in c]
    await c.ashutdown()
    assert [b.batch_size for b in got] == [torch.Size([5])] * 2
    assert got[0].names == ["time"]
    frames = torch.cat(got)
    env = frames["env_index"].tolist()
    traj = frames["collector", "traj_ids"].tolist()
    obs = frames["next", "observation"].squeeze(-1).tolist()
    for e in (0, 1):
        mine = [i for i, x in enumerate(env) if x == e]
        assert [obs[i] for i in mine] == [1, 2] * (len(mine) // 2) + [1] * (len(mine) % 2)
        # a trajectory is two frames of one env; ids are unique across envs and batches
        ids = [traj[i] for i in mine]
        assert all(ids[k] == ids[k + 1] for k in range(0, len(ids) - 1, 2))
    assert sorted(set(traj)) == list(range(len(set(traj))))
    assert traj[:2] == [0, 1]  # a full reset numbers trajectories like the envs


async def test_list_of_factories_builds_a_streaming_pool():
    c = Collector([partial(CountingEnv, max_steps=100)] * 3, None, frames_per_batch=6)
    assert isinstance(c.env, AsyncEnvPool) and c.env.num_envs == 3 and c.streaming
    b = await c.rollout()
    assert sorted(b["env_index"].tolist()) == [0, 0, 1, 1, 2, 2]
    assert await c.set_seed(1) == 3  # env i gets 1 + i: the last env's seed
    assert await c.env.get_attr("seed") == [1, 2, 3]
    await c.ashutdown()
    assert c.env.is_closed


async def test_fast_envs_contribute_more_frames_than_slow_ones():
    fns = [partial(LatencyEnv, 0.001), partial(LatencyEnv, 0.001), partial(LatencyEnv, 0.5)]
    c = Collector(AsyncEnvPool(fns), None, frames_per_batch=40)
    b = await c.rollout()
    counts = torch.bincount(b["env_index"], minlength=3).tolist()
    assert counts[0] + counts[1] >= 39 and counts[2] <= 1
    await c.ashutdown()
    # lockstep on the same envs: every env gives as many frames
    c = Collector(AsyncEnvPool(fns), None, frames_per_batch=3, streaming=False)
    b = await c.rollout()
    assert b.batch_size == torch.Size([3, 1])
    await c.ashutdown()


async def test_max_frames_per_traj_in_streaming():
    c = Collector(counting_pool(2), None, frames_per_batch=12, max_frames_per_traj=3)
    b = await c.rollout()
    for e in (0, 1):
        mine = b[b["env_index"] == e]
        assert mine["next", "observation"].squeeze(-1).tolist() == [1, 2, 3, 1, 2, 3]
        assert mine["next", "truncated"].squeeze(-1).tolist() == [0, 0, 1, 0, 0, 1]
        assert mine["next", "done"].squeeze(-1).tolist() == [0, 0, 1, 0, 0, 1]
        ids = mine["collector", "traj_ids"].tolist()
        assert ids[0] == ids[2] != ids[3] == ids[5]
    assert "truncated" in b.keys()  # every frame has the same keys
    await c.ashutdown()


async def test_failing_env_restarts_truncated_and_collection_goes_on():
    fns = [partial(CountingEnv, max_steps=100), partial(FailingEnv, fail_after=2, message="kaboom")]
    pool = AsyncEnvPool(fns, on_error="restart")
    pool.add_truncated_keys()
    c = Collector(pool, None, frames_per_batch=12, total_frames=24)
    got = [b async for b in c]
    frames = torch.cat(got)
    bad = frames[frames["env_index"] == 1]
    # steps 1, 2 succeed; step 3 fails: reported truncated, then the rebuilt env goes on
    assert bad["next", "truncated"].squeeze(-1).tolist()[:3] == [False, False, True]
    assert bad["next", "done"].squeeze(-1).tolist()[:3] == [False, False, True]
    ids = bad["collector", "traj_ids"].tolist()
    assert ids[0] == ids[2] != ids[3]
    assert bad["next", "observation"].squeeze(-1).tolist()[3:5] == [1, 2]
    assert (frames["env_index"] == 0).sum() >= 12  # the healthy env never stopped
    assert "kaboom" in str(pool.last_errors[1])
    await c.ashutdown()


async def test_failing_env_without_restart_raises():
    fns = [partial(CountingEnv, max_steps=100), partial(FailingEnv, fail_after=1)]
    c = Collector(AsyncEnvPool(fns), None, frames_per_batch=10)
    with pytest.raises(EnvStepError):
        await c.rollout()
    await c.ashutdown()


async def test_split_trajectories_of_a_stream():
    c = Collector(counting_pool(2, max_steps=3), None, frames_per_batch=10, split_trajs=True)
    got = []
    async for b in c:
        got.append(b)
        break
    b = got[0]
    mask = b["collector", "mask"]
    assert b.names == [None, "time"] and mask.shape[1] == 3
    assert mask.sum().item() == 10
    full = b[mask.all(-1)]
    assert full["next", "observation"].squeeze(-1).tolist() == [[1, 2, 3]] * full.batch_size[0]
    for row in range(b.batch_size[0]):  # one env and one trajectory per row
        n = int(mask[row].sum())
        assert b["env_index"][row, :n].unique().numel() == 1
        assert b["collector", "traj_ids"][row, :n].unique().numel() == 1
    await c.ashutdown()


async def test_reset_at_each_iter_and_set_truncated_in_streaming():
    c = Collector(
        counting_pool(2), None, frames_per_batch=4, reset_at_each_iter=True, set_truncated=True
    )
    for _ in range(2):
        b = await c.rollout()
        for e in (0, 1):
            mine = b[b["env_index"] == e]
            assert mine["next", "observation"].squeeze(-1).tolist() == [1, 2]
            assert mine["next", "truncated"].squeeze(-1).tolist() == [False, True]
    await c.ashutdown()


async def test_carry_over_and_reset_index():
    # 3 envs answering together: a batch of 4 leaves 2 frames for the next batch
    c = Collector(counting_pool(3), None, frames_per_batch=4, use_buffers=True)
    b0 = (await c.rollout()).clone()  # rollout() returns the reused buffer
    b1 = await c.rollout()
    assert b0.batch_size == b1.batch_size == torch.Size([4])
    obs = torch.cat([b0, b1])["next", "observation"].squeeze(-1).tolist()
    assert sorted(obs) == [1, 1, 1, 2, 2, 2, 3, 3]
    await c.reset(index=[0])
    b2 = await c.rollout()
    first0 = b2[b2["env_index"] == 0]["next", "observation"].squeeze(-1).tolist()
    assert first0[0] == 1  # env 0 restarted
    await c.ashutdown()


def recording_policy(calls: list[int]):
    def policy(td):
        calls.append(td.batch_size[0])
        td["action"] = torch.zeros(td.batch_size[0], 1, dtype=torch.int64)
        return td

    return policy


async def test_min_batch_waits_for_enough_ready_envs():
    calls: list[int] = []
    fns = [partial(HangingEnv, hang_after=10**6, max_steps=100)] * 3  # async steps, as tasks
    c = Collector(AsyncEnvPool(fns), recording_policy(calls), frames_per_batch=12, min_batch=3)
    await c.rollout()
    assert calls == [3, 3, 3, 3]  # never a partial batch: every call waits for all three
    await c.ashutdown()


async def test_max_wait_runs_the_policy_on_what_is_ready():
    calls: list[int] = []
    # the last env never answers: waiting for a batch of 4 would stall collection forever
    fns = [partial(CountingEnv, max_steps=100)] * 3 + [partial(HangingEnv, hang_after=0)]
    c = Collector(
        AsyncEnvPool(fns), recording_policy(calls), frames_per_batch=9, min_batch=4, max_wait=0.01
    )
    b = await c.rollout()
    assert calls[0] == 4 and max(calls[1:]) <= 3
    assert sorted(set(b["env_index"].tolist())) == [0, 1, 2]
    await c.ashutdown()


def test_streaming_needs_a_pool():
    with pytest.raises(TypeError, match="AsyncEnvPool"):
        Collector(CountingEnv(), None, frames_per_batch=2, streaming=True)
    with pytest.raises(ValueError, match="unbatched"):
        Collector(
            AsyncEnvPool([partial(CountingEnv, batch_size=(2,))] * 2),
            None,
            frames_per_batch=2,
            streaming=True,
        )


async def test_split_trajectories_function_on_lockstep_data():
    c = Collector(
        CountingEnv(max_steps=torch.tensor([2, 3]), batch_size=(2,)), None, frames_per_batch=10
    )
    b = await c.rollout()
    out = split_trajectories(b)
    lengths = out["collector", "mask"].sum(-1).tolist()
    assert lengths == [2, 3, 2, 2, 1] and out.names == [None, "time"]
    # without trajectory ids, they are read from the done flags along time
    out2 = split_trajectories(b.exclude("collector"))
    assert out2["collector", "mask"].sum(-1).tolist() == [2, 2, 1, 3, 2]  # env by env
    await c.ashutdown()


async def test_envs_idle_after_the_last_batch():
    fns = [partial(LatencyEnv, 0.0), partial(LatencyEnv, 0.01)]
    pool = AsyncEnvPool(fns)
    c = Collector(pool, None, frames_per_batch=5, total_frames=10)
    assert len([b async for b in c]) == 2
    assert c._engine.in_flight == 0
    td = await pool.rand_step(await pool.reset())  # the pool is free for other work
    assert td.batch_size == torch.Size([2])
    await c.ashutdown()
