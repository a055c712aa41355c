"""Collector in lockstep mode: outputs, trajectory ids, and every argument."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

import aenv
from aenv.collectors import Collector, Interruptor
from aenv.envs import ExplorationType
from aenv.testing import CountingEnv, DynamicSpecEnv, LatencyEnv

pytestmark = pytest.mark.timeout(60)


def ones_policy(td):
    td.set("action", torch.ones_like(td.get("observation"), dtype=torch.int64))
    return td


async def batches(collector: Collector) -> list:
    out = [b async for b in collector]
    await collector.ashutdown()
    return out


async def test_outputs_and_traj_ids_continue_across_batches():
    c = Collector(CountingEnv(max_steps=3), ones_policy, frames_per_batch=4, total_frames=12)
    got = await batches(c)
    assert len(got) == 3 == len(c)
    b = got[0]
    assert b.batch_size == torch.Size([4]) and b.names == ["time"]
    assert b["next", "observation"].squeeze(-1).tolist() == [1, 2, 3, 1]
    assert b["action"].squeeze(-1).tolist() == [1, 1, 1, 1]  # the policy's output
    assert b["next", "done"].squeeze(-1).tolist() == [False, False, True, False]
    ids = torch.cat([g["collector", "traj_ids"] for g in got]).tolist()
    assert ids == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]  # trajectory 1 spans batches 0 and 1


async def test_batched_env_shape_and_ids():
    env = CountingEnv(max_steps=torch.tensor([2, 3]), batch_size=(2,))
    c = Collector(env, None, frames_per_batch=8, total_frames=16)
    got = await batches(c)
    b0, b1 = got
    assert b0.batch_size == torch.Size([2, 4]) and b0.names == [None, "time"]
    assert b0["collector", "traj_ids"].tolist() == [[0, 0, 2, 2], [1, 1, 1, 3]]
    assert b1["collector", "traj_ids"].tolist() == [[4, 4, 5, 5], [3, 3, 6, 6]]


def test_frames_per_batch_rounds_up_with_a_warning():
    with pytest.warns(UserWarning, match="102 frames"):
        c = Collector(CountingEnv(batch_size=(6,)), None, frames_per_batch=100, total_frames=300)
    assert c.frames_per_batch == 102 and len(c) == 3


def test_total_frames_must_be_a_multiple():
    with pytest.raises(ValueError, match="multiple of frames_per_batch"):
        Collector(CountingEnv(), None, frames_per_batch=4, total_frames=10)
    with pytest.raises(ValueError, match="frames_per_batch"):
        Collector(CountingEnv(), None, frames_per_batch=0)


async def test_endless_collector():
    c = Collector(CountingEnv(max_steps=100), None, frames_per_batch=2, total_frames=-1)
    assert c.total_frames == -1
    with pytest.raises(TypeError):
        len(c)
    n = 0
    async for _ in c:
        n += 1
        if n == 7:
            break
    assert c._frames == 14
    await c.ashutdown()


async def test_max_frames_per_traj_truncates():
    c = Collector(CountingEnv(max_steps=100), None, frames_per_batch=7, max_frames_per_traj=3)
    b = await c.rollout()
    assert b["next", "step_count"].squeeze(-1).tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert b["next", "truncated"].squeeze(-1).tolist() == [0, 0, 1, 0, 0, 1, 0]
    assert b["next", "observation"].squeeze(-1).tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert b["collector", "traj_ids"].tolist() == [0, 0, 0, 1, 1, 1, 2]
    await c.ashutdown()


async def test_init_random_frames_rounds_up_to_batches():
    calls = []

    def policy(td):
        calls.append(td.batch_size)
        td.set("action", torch.full_like(td.get("observation"), 7, dtype=torch.int64))
        return td

    c = Collector(
        CountingEnv(max_steps=100),
        policy,
        frames_per_batch=4,
        total_frames=12,
        init_random_frames=6,
    )
    got = await batches(c)
    assert all(int(g["action"].max()) <= 1 for g in got[:2])  # random actions in {0, 1}
    assert got[2]["action"].squeeze(-1).tolist() == [7, 7, 7, 7]
    assert len(calls) == 4  # the policy only ran for the last batch


async def test_reset_at_each_iter():
    c = Collector(
        CountingEnv(max_steps=100),
        None,
        frames_per_batch=3,
        total_frames=6,
        reset_at_each_iter=True,
    )
    b0, b1 = await batches(c)
    assert b0["next", "observation"].squeeze(-1).tolist() == [1, 2, 3]
    assert b1["next", "observation"].squeeze(-1).tolist() == [1, 2, 3]
    assert b1["collector", "traj_ids"].tolist() == [1, 1, 1]


async def test_postproc_split_trajs_and_replay_buffer():
    seen = []

    def postproc(td):
        seen.append(td.batch_size)
        td.set("tag", torch.ones(td.batch_size))
        return td

    c = Collector(
        CountingEnv(max_steps=3),
        None,
        frames_per_batch=5,
        total_frames=5,
        split_trajs=True,
        postproc=postproc,
    )
    (b,) = await batches(c)
    assert seen == [torch.Size([2, 3])]  # postproc runs after the split
    assert b[("collector", "mask")].tolist() == [[True] * 3, [True, True, False]]
    assert b.names == [None, "time"] and "tag" in b.keys()

    class Buffer:
        def __init__(self):
            self.items = []

        async def extend(self, td):  # async extend is awaited
            self.items.append(td)

    rb = Buffer()
    c = Collector(CountingEnv(), None, frames_per_batch=4, total_frames=8, replay_buffer=rb)
    assert [b async for b in c] == [None, None]
    assert [t.batch_size for t in rb.items] == [torch.Size([4])] * 2


@pytest.mark.parametrize("use_buffers", [True, False])
async def test_return_same_td_and_buffers(use_buffers):
    c = Collector(
        CountingEnv(max_steps=100),
        None,
        frames_per_batch=2,
        total_frames=6,
        return_same_td=True,
        use_buffers=use_buffers,
    )
    got = []
    async for b in c:
        got.append((b, b["next", "observation"].squeeze(-1).tolist()))
    assert got[0][0] is got[1][0] is got[2][0]
    assert [g[1] for g in got] == [[1, 2], [3, 4], [5, 6]]
    c = Collector(
        CountingEnv(max_steps=100),
        None,
        frames_per_batch=2,
        total_frames=4,
        use_buffers=use_buffers,
    )
    b0, b1 = await batches(c)
    assert b0 is not b1 and b0["next", "observation"].squeeze(-1).tolist() == [1, 2]


async def test_dynamic_specs_default_to_no_buffers():
    c = Collector(DynamicSpecEnv(max_count=3), None, frames_per_batch=3, total_frames=3)
    assert c.use_buffers is False
    (b,) = await batches(c)
    assert [b[i]["observation"].shape[1] for i in range(3)] == [1, 2, 3]


async def test_interruptor_ends_batch_early():
    interruptor = Interruptor()

    def policy(td):
        if td["observation"].item() == 2:
            interruptor.stop_collection()
        return ones_policy(td)

    c = Collector(CountingEnv(max_steps=100), policy, frames_per_batch=10, interruptor=interruptor)
    b = await c.rollout()
    assert b.batch_size == torch.Size([3])  # the step after stop_collection() is not taken
    interruptor.start_collection()
    assert (await c.rollout()).batch_size == torch.Size([10])
    await c.ashutdown()


async def test_set_truncated():
    env = LatencyEnv(0.0)
    c = Collector(env, None, frames_per_batch=4, set_truncated=True)
    b = await c.rollout()
    assert b["next", "truncated"].squeeze(-1).tolist() == [False, False, False, True]
    assert b["next", "done"].squeeze(-1).tolist() == [False, False, False, True]
    with pytest.raises(RuntimeError, match="add_truncated_keys"):
        Collector(CountingEnv(), None, frames_per_batch=4, set_truncated=True)
    await c.ashutdown()


async def test_exploration_type_and_devices():
    seen = []

    def policy(td):
        seen.append(aenv.exploration_type())
        return ones_policy(td)

    c = Collector(
        CountingEnv(),
        policy,
        frames_per_batch=2,
        exploration_type=ExplorationType.DETERMINISTIC,
        device="cpu",
    )
    b = await c.rollout()
    assert seen == [ExplorationType.DETERMINISTIC] * 2
    assert c.storing_device == c.policy_device == c.env_device == torch.device("cpu")
    assert b.device == torch.device("cpu")
    await c.ashutdown()


async def test_reset_index_and_set_seed():
    env = CountingEnv(max_steps=100, batch_size=(3,))
    c = Collector(env, None, frames_per_batch=6)
    b = await c.rollout()
    assert b["next", "observation"][..., -1, 0].tolist() == [2, 2, 2]
    await c.reset(index=1)
    b = await c.rollout()
    assert b["next", "observation"][..., 0, 0].tolist() == [3, 1, 3]
    assert b["collector", "traj_ids"][:, 0].tolist() == [0, 3, 2]
    assert await c.set_seed(5) == 5  # a single (batched) env: its own seed
    assert env.seed == 5
    await c.ashutdown()


async def test_state_dict_round_trip_restores_counters_and_weights():
    net = TensorDictModule(nn.Linear(1, 1), in_keys=["observation"], out_keys=["action"])
    c = Collector(LatencyEnv(0.0, obs_dim=1), net, frames_per_batch=5, max_frames_per_traj=2)
    await c.rollout()
    await c.rollout()
    sd = c.state_dict()
    assert sd["frames"] == 10 and sd["iter"] == 2 and sd["traj_id"] == 6
    assert "policy_state_dict" in sd

    net2 = TensorDictModule(nn.Linear(1, 1), in_keys=["observation"], out_keys=["action"])
    c2 = Collector(LatencyEnv(0.0, obs_dim=1), net2, frames_per_batch=5, total_frames=20)
    c2.load_state_dict(sd)
    assert c2._frames == 10 and c2._iter == 2
    assert torch.equal(net2.module.weight, net.module.weight)
    got = await batches(c2)
    assert len(got) == 2  # 10 of 20 frames were already counted
    assert int(got[0]["collector", "traj_ids"].min()) >= 6  # ids never reused
    await c.ashutdown()


async def test_update_policy_weights():
    net = TensorDictModule(nn.Linear(1, 1), in_keys=["observation"], out_keys=["action"])
    c = Collector(LatencyEnv(0.0, obs_dim=1), net, frames_per_batch=2)
    new = TensorDict.from_module(net).clone().zero_()
    c.update_policy_weights_(new)
    assert float(net.module.weight.detach()) == 0.0 == float(net.module.bias.detach())
    await c.ashutdown()


async def test_shutdown_closes_env_and_is_idempotent():
    env = CountingEnv()
    async with Collector(env, None, frames_per_batch=2) as c:
        await c.rollout()
    assert env.is_closed
    await c.ashutdown()
    with pytest.raises(aenv.EnvClosedError):
        await c.rollout()


async def test_reset_when_done_false_keeps_stepping():
    c = Collector(CountingEnv(max_steps=2), None, frames_per_batch=4, reset_when_done=False)
    b = await c.rollout()
    assert b["next", "observation"].squeeze(-1).tolist() == [1, 2, 3, 4]
    assert b["collector", "traj_ids"].tolist() == [0, 0, 0, 0]
    await c.ashutdown()


async def test_progress_bar(capsys):
    c = Collector(CountingEnv(), None, frames_per_batch=4, total_frames=8, progress=True)
    assert len([b async for b in c]) == 2
    err = capsys.readouterr().err
    assert "100%" in err and "frames/s" in err
    with pytest.raises(ValueError, match="progress"):
        [b async for b in Collector(CountingEnv(), None, frames_per_batch=4, progress="bar")]
    await c.ashutdown()


@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_batches_are_the_plain_step_loop(backend):
    """A lockstep batch is a run of the shared rollout loop that goes on from the batch
    before: its frames equal a plain ``step_and_maybe_reset`` loop's, episodes ending at
    a batch's last step included (their reset waits for the next batch)."""
    from functools import partial

    from aenv.pool import AsyncEnvPool

    fns = [partial(CountingEnv, max_steps=m) for m in (2, 3, 4, 5)]
    pool = AsyncEnvPool(fns, backend=backend)
    try:
        c = Collector(pool, ones_policy, frames_per_batch=20, total_frames=60, streaming=False)
        got = [b async for b in c]
        frames = []
        td = await pool.reset()
        for _ in range(15):
            stepped, td = await pool.step_and_maybe_reset(ones_policy(td))
            frames.append(stepped)
        want = torch.stack(frames, 1)
    finally:
        await pool.aclose()
    assert [b.batch_size for b in got] == [torch.Size([4, 5])] * 3
    data = torch.cat(got, 1)
    for key in ("observation", "action", ("next", "observation"), ("next", "done")):
        assert torch.equal(data[key], want[key]), key
    # a new id for each episode, in the order they started
    assert data["collector", "traj_ids"][:, :6].tolist() == [
        [0, 0, 4, 4, 6, 6],
        [1, 1, 1, 5, 5, 5],
        [2, 2, 2, 2, 7, 7],
        [3, 3, 3, 3, 3, 8],
    ]
