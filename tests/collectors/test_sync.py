"""SyncDataCollector: the seed's two examples, run as written, and the facade's methods."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from aenv.collectors import SyncDataCollector
from aenv.libs.gym import GymEnv
from aenv.sync import ParallelEnv, SerialEnv
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(120)


def test_seed_example_pendulum():
    env_maker = lambda: GymEnv("Pendulum-v1", device="cpu")  # noqa: E731 - the seed's code
    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    collector = SyncDataCollector(
        create_env_fn=env_maker,
        policy=policy,
        total_frames=2000,
        max_frames_per_traj=50,
        frames_per_batch=200,
        init_random_frames=-1,
        reset_at_each_iter=False,
        device="cpu",
        storing_device="cpu",
    )
    for i, data in enumerate(collector):  # noqa: B007 - the seed's code; data is used below
        if i == 2:
            break
    assert data.batch_size == torch.Size([200]) and data.device == torch.device("cpu")
    assert data.names[-1] == "time"
    keys = {"action", ("collector", "traj_ids"), "done", "observation", "step_count", "truncated"}
    keys |= {("next", k) for k in ("done", "observation", "reward", "step_count", "truncated")}
    assert keys <= set(data.keys(True, True))
    assert (
        data["observation"].shape == (200, 3) and data["collector", "traj_ids"].dtype == torch.int64
    )
    # batch 2 covers frames 400..599: trajectories of 50 steps, numbered 8..11
    assert data["collector", "traj_ids"].unique().tolist() == [8, 9, 10, 11]
    assert data["next", "step_count"].max().item() == 50
    assert data["next", "truncated"].sum().item() == 4
    collector.shutdown()
    del collector


def test_seed_example_set_seed_parallel():
    env_fn = lambda: GymEnv("Pendulum-v1")  # noqa: E731 - the seed's code
    env_fn_parallel = ParallelEnv(6, env_fn)
    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    with pytest.warns(UserWarning, match="102 frames"):
        collector = SyncDataCollector(
            env_fn_parallel, policy, total_frames=300, frames_per_batch=100
        )
    out_seed = collector.set_seed(1)
    assert out_seed == 6
    batches = list(collector)
    assert [b.batch_size for b in batches] == [torch.Size([6, 17])] * 3
    collector.shutdown()


def test_facade_methods():
    with SyncDataCollector(
        SerialEnv(2, CountingEnv, {"max_steps": 3}), None, frames_per_batch=4, total_frames=8
    ) as collector:
        assert len(collector) == 2 and not collector.streaming
        assert collector.set_seed(10) == 11
        batch = collector.rollout()
        assert batch.batch_size == torch.Size([2, 2])
        collector.reset(index=[1])
        batch = collector.rollout()
        assert batch["next", "observation"][:, 0, 0].tolist() == [3, 1]
        sd = collector.state_dict()
        assert sd["frames"] == 8 and sd["iter"] == 2
        assert list(collector) == []  # total_frames already reached
        collector.load_state_dict({**sd, "frames": 4})
        assert len(list(collector)) == 1
        collector.update_policy_weights_()  # no weights: a no-op
    assert collector.env.is_closed


def test_facade_streaming_on_a_pool():
    collector = SyncDataCollector(
        SerialEnv(3, CountingEnv, {"max_steps": 100}),
        None,
        frames_per_batch=6,
        total_frames=12,
        streaming=True,
    )
    got = list(collector)
    assert [b.batch_size for b in got] == [torch.Size([6])] * 2
    assert sorted(torch.cat(got)["env_index"].tolist()) == [0] * 4 + [1] * 4 + [2] * 4
    collector.shutdown()
