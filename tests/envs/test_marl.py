"""Multi-agent: MarlGroupMapType, check_marl_grouping, a grouped env through pools and collectors."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch

from aenv import (
    AsyncEnvPool,
    Collector,
    MarlGroupMapType,
    ParallelEnv,
    SerialEnv,
    SyncDataCollector,
    SyncEnv,
    acheck_env_specs,
    check_env_specs,
    check_marl_grouping,
)
from aenv.testing import MultiAgentCountingEnv

pytestmark = pytest.mark.timeout(90)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TEAMS = {"red": ["agent_0"], "blue": ["agent_1", "agent_2"]}


def make_teams() -> MultiAgentCountingEnv:
    return MultiAgentCountingEnv(3, TEAMS)


def test_group_map_types():
    names = ["a", "b", "c"]
    assert MarlGroupMapType.ALL_IN_ONE_GROUP.get_group_map(names) == {"agents": names}
    assert MarlGroupMapType.ONE_GROUP_PER_AGENT.get_group_map(names) == {
        "a": ["a"],
        "b": ["b"],
        "c": ["c"],
    }
    for kind in MarlGroupMapType:
        check_marl_grouping(kind.get_group_map(names), names)


@pytest.mark.parametrize(
    ("group_map", "names", "match"),
    [
        ({}, ["a"], "empty"),
        ({"g": []}, ["a"], "no agent"),
        ({"g": ["a"], "h": ["a", "b"]}, ["a", "b"], "two groups"),
        ({"g": ["a"]}, ["a", "b"], r"\['b'\] are in no group"),
        ({"g": ["a", "z"]}, ["a"], "unknown agents"),
        ({"g": ["a"]}, ["a", "a"], "unique"),
    ],
)
def test_check_marl_grouping_errors(group_map, names, match):
    with pytest.raises(ValueError, match=match):
        check_marl_grouping(group_map, names)


def test_env_rejects_a_bad_group_map():
    with pytest.raises(ValueError, match="no group"):
        MultiAgentCountingEnv(3, {"red": ["agent_0"]})


def test_all_in_one_group_sync():
    env = SyncEnv(MultiAgentCountingEnv(3, MarlGroupMapType.ALL_IN_ONE_GROUP))
    check_env_specs(env)
    assert env.action_keys == [("agents", "action")]
    assert env.reward_keys == [("agents", "reward")]
    assert ("agents", "done") in env.done_keys and "done" in env.done_keys
    assert env.full_action_spec["agents"].shape == (3,)
    r = env.rollout(10, break_when_any_done=False)
    obs = r["next", "agents", "observation"].squeeze(-1)
    assert obs.shape == (10, 3)
    # agent i is done after 5 + i steps and is then reset alone (per-agent "_reset")
    assert obs[:, 0].tolist() == [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    assert obs[:, 2].tolist() == [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    expected_reward = 1 + r["agents", "action"].float()
    assert torch.equal(r["next", "agents", "reward"], expected_reward)
    assert torch.equal(r["next", "state"].squeeze(-1), obs.sum(-1))


async def test_one_group_per_agent_async():
    env = MultiAgentCountingEnv(3, MarlGroupMapType.ONE_GROUP_PER_AGENT)
    await acheck_env_specs(env)
    assert sorted(env.group_map) == ["agent_0", "agent_1", "agent_2"]
    r = await env.rollout(20)
    # the rollout stops at the first done flag of any group (agent_0 after 5 steps)
    assert r.shape == (5,)
    assert r["next", "agent_0", "done"][-1].all() and not r["next", "agent_2", "done"].any()
    assert not r["next", "done"].any()
    assert r["next", "agent_1", "observation"].shape == (5, 1, 1)


async def test_partial_reset_of_one_group_member():
    env = MultiAgentCountingEnv(3, TEAMS)
    td = await env.reset()
    for _ in range(3):
        td = env._step_mdp(await env.rand_step(td))
    td["blue", "_reset"] = torch.tensor([[False], [True]])
    out = await env.reset(td)
    assert out["blue", "observation"].squeeze(-1).tolist() == [3, 0]
    # the seeds' convention: a done level without "_reset" is reset whole
    assert out["red", "observation"].squeeze(-1).tolist() == [0]
    td = await env.reset()
    td = env._step_mdp(await env.rand_step(td))
    td["blue", "_reset"] = torch.tensor([[True], [False]])
    td["red", "_reset"] = torch.tensor([[False]])
    out = await env.reset(td)
    assert out["blue", "observation"].squeeze(-1).tolist() == [0, 1]
    assert out["red", "observation"].squeeze(-1).tolist() == [1]


@pytest.mark.parametrize("backend", ["coroutine", "thread", "process"])
async def test_grouped_env_through_a_pool_async(backend):
    async with AsyncEnvPool([make_teams] * 2, backend=backend) as pool:
        await acheck_env_specs(pool)
        assert pool.full_action_spec["blue", "action"].shape == (2, 2, 1)
        r = await pool.rollout(8, break_when_any_done=False)
        assert r["next", "blue", "observation"].shape == (2, 8, 2, 1)
        assert r["next", "red", "observation"][0].flatten().tolist() == [1, 2, 3, 4, 5, 1, 2, 3]


def test_grouped_env_through_parallel_env_and_sync_collector():
    with ParallelEnv(2, make_teams, num_processes=1) as env:
        check_env_specs(env)
        r = env.rollout(6, break_when_any_done=False)
        assert r["next", "blue", "reward"].shape == (2, 6, 2, 1)
    collector = SyncDataCollector(
        lambda: SerialEnv(2, make_teams), None, frames_per_batch=8, total_frames=16
    )
    batches = list(collector)
    collector.shutdown()
    assert len(batches) == 2
    assert batches[0]["next", "blue", "observation"].shape == (2, 4, 2, 1)
    nxt = batches[1]["next", "red", "observation"][0].flatten().tolist()
    assert nxt == [5, 1, 2, 3]


async def test_grouped_env_through_the_async_collector():
    collector = Collector(
        lambda: AsyncEnvPool([make_teams] * 3), None, frames_per_batch=12, total_frames=24
    )
    frames = 0
    async for batch in collector:
        frames += batch.numel()
        assert batch["next", "blue", "reward"].shape[-2:] == (2, 1)
        assert ("collector", "traj_ids") in batch.keys(True)
    await collector.ashutdown()
    assert frames == 24
