"""Collectors, as TorchRL's test_collector.py checks them (async Collector and the sync
SyncDataCollector facade)."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from aenv.collectors import Collector, SyncDataCollector, split_trajectories
from aenv.pool import AsyncEnvPool
from aenv.sync import SerialEnv
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(60)


def ones_policy(td):
    td.set("action", torch.ones_like(td.get("observation"), dtype=torch.int64))
    return td


def test_sync_collector_batches_and_total_frames():
    collector = SyncDataCollector(
        partial(CountingEnv, max_steps=3), ones_policy, frames_per_batch=5, total_frames=20
    )
    batches = list(collector)
    collector.shutdown()
    assert len(batches) == 4
    assert all(b.batch_size == (5,) for b in batches)
    assert (torch.cat([b["action"] for b in batches]) == 1).all()
    obs = torch.cat([b["next", "observation"] for b in batches]).squeeze(-1)
    assert obs[:6].tolist() == [1, 2, 3, 1, 2, 3]


def test_sync_collector_with_a_module_policy_on_a_batched_env():
    env = CountingEnv(batch_size=(2,), max_steps=4)
    module = nn.Sequential(nn.Linear(1, 1), nn.Sigmoid())
    policy = TensorDictModule(
        lambda obs: (module(obs) > 2).long(), in_keys=["observation"], out_keys=["action"]
    )
    collector = SyncDataCollector(env, policy, frames_per_batch=8, total_frames=16)
    batch = next(iter(collector))
    collector.shutdown()
    assert batch.batch_size == (2, 4) and batch.names == [None, "time"]
    assert (batch["action"] == 0).all()


async def test_trajectory_ids_and_split_trajectories():
    c = Collector(CountingEnv(max_steps=3), ones_policy, frames_per_batch=8, total_frames=8)
    (batch,) = [b async for b in c]
    await c.ashutdown()
    assert batch["collector", "traj_ids"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    split = split_trajectories(batch)
    assert split.batch_size == (3, 3)
    assert split["collector", "mask"].sum(-1).tolist() == [3, 3, 2]
    assert split["next", "observation"][0].squeeze(-1).tolist() == [1, 2, 3]


async def test_max_frames_per_traj_truncates():
    c = Collector(
        CountingEnv(max_steps=100),
        ones_policy,
        frames_per_batch=6,
        total_frames=6,
        max_frames_per_traj=2,
    )
    (batch,) = [b async for b in c]
    await c.ashutdown()
    assert batch["next", "truncated"].squeeze(-1).tolist() == [False, True] * 3
    assert batch["next", "observation"].squeeze(-1).tolist() == [1, 2] * 3


async def test_reset_at_each_iter_starts_fresh_episodes():
    c = Collector(
        CountingEnv(max_steps=100),
        ones_policy,
        frames_per_batch=3,
        total_frames=6,
        reset_at_each_iter=True,
    )
    got = [b async for b in c]
    await c.ashutdown()
    assert [b["observation"].squeeze(-1).tolist() for b in got] == [[0, 1, 2], [0, 1, 2]]


async def test_collector_on_a_pool_streams_env_indices():
    # aenv differs on purpose: on a pool the async Collector streams, each frame with its
    # env's index, in arrival order (TorchRL's collectors step envs in lockstep)
    pool = AsyncEnvPool([partial(CountingEnv, max_steps=3)] * 2)
    c = Collector(pool, ones_policy, frames_per_batch=4, total_frames=8)
    got = [b async for b in c]
    await c.ashutdown()
    assert sum(b.numel() for b in got) >= 8
    indices = torch.cat([b["env_index"].reshape(-1) for b in got])
    assert set(indices.tolist()) == {0, 1}


def test_collector_seed_returns_the_last_envs_seed():
    # TorchRL's collector example: 3 envs seeded from 1 get 1, 2, 3 and 3 comes back
    env = SerialEnv(3, CountingEnv)
    collector = SyncDataCollector(env, None, frames_per_batch=3, total_frames=3)
    assert collector.set_seed(1) == 3
    assert env.seed == [1, 2, 3]
    collector.shutdown()
