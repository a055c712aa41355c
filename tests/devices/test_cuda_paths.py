"""The ``device="cuda"`` paths, end to end: envs built on the GPU, pools of them on every
local backend, casting around a pool, collectors with a GPU policy.

CI has no GPU, so this file is skipped there; run it on a machine with one
(``python -m pytest tests/devices``). Each test says where the data must end up.
"""

from __future__ import annotations

import functools

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from aenv import (
    AsyncEnvPool,
    ChessEnv,
    Collector,
    DeviceCastTransform,
    FinancialRegimeEnv,
    GymEnv,
    ParallelEnv,
    PendulumEnv,
    SerialEnv,
    SyncDataCollector,
    TicTacToeEnv,
    TransformedEnv,
    rollout,
)
from aenv.testing import CountingEnv

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.timeout(120),
]

BACKENDS = ["coroutine", "thread", "process"]


def _devices(td: TensorDict) -> set[str]:
    return {v.device.type for v in td.values(True, True) if isinstance(v, torch.Tensor)}


async def test_gym_env_on_cuda():
    r = await GymEnv("Pendulum-v1", device="cuda").rollout(20)
    assert r.device.type == "cuda" and _devices(r) == {"cuda"}
    assert r["next", "observation"].shape == (20, 3)


async def test_pendulum_on_cuda_with_a_cuda_policy():
    env = PendulumEnv(device="cuda")
    net = torch.nn.Linear(1, 1).cuda()

    def act(td):
        return td.set("action", 2 * torch.tanh(net(td["thdot"].unsqueeze(-1))))

    with torch.no_grad():
        r = await env.rollout(10, act)
    assert r.device.type == "cuda" and _devices(r) == {"cuda"}


async def test_device_cast_of_a_cpu_env():
    env = TransformedEnv(PendulumEnv(device="cpu"), DeviceCastTransform("cuda"))
    r = await env.rollout(5)
    assert r["next", "th"].device.type == "cuda"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_pool_of_cuda_envs(backend):
    fn = functools.partial(GymEnv, "CartPole-v1", device="cuda")
    async with AsyncEnvPool([fn] * 4, backend=backend) as pool:
        r = await pool.rollout(10, break_when_any_done=False)
        assert r.batch_size == (4, 10) and _devices(r) == {"cuda"}
        await pool.reset()
        s = await pool.step(TensorDict({"action": pool.action_spec.rand()}, [4], device="cuda"))
        assert _devices(s) == {"cuda"}


@pytest.mark.parametrize("backend", BACKENDS)
async def test_pool_of_cuda_pendulums(backend):
    async with AsyncEnvPool(
        [functools.partial(PendulumEnv, device="cuda")] * 3, backend=backend
    ) as pool:
        r = await pool.rollout(5)
        assert r.device.type == "cuda" and _devices(r) == {"cuda"}


@pytest.mark.parametrize("backend", BACKENDS)
async def test_pool_on_cuda_over_cpu_envs_is_refused_and_a_cast_does_it(backend):
    fn = functools.partial(GymEnv, "CartPole-v1")
    with pytest.raises(ValueError, match="DeviceCastTransform"):
        AsyncEnvPool([fn] * 4, backend=backend, device="cuda")
    env = TransformedEnv(AsyncEnvPool([fn] * 4, backend=backend), DeviceCastTransform("cuda"))
    try:
        r = await env.rollout(10)
        s = await env.step(env.rand_action(await env.reset()))
        assert _devices(r) == {"cuda"} and _devices(s) == {"cuda"}
    finally:
        await env.aclose()


def test_sync_facades_on_cuda():
    env = ParallelEnv(4, functools.partial(GymEnv, "CartPole-v1", device="cuda"), num_processes=2)
    try:
        assert _devices(env.rollout(10)) == {"cuda"}
    finally:
        env.close()
    env = SerialEnv(2, functools.partial(GymEnv, "CartPole-v1", device="cuda"))
    try:
        assert _devices(env.rollout(10)) == {"cuda"}
    finally:
        env.close()
    net = TensorDictModule(torch.nn.Linear(3, 1).cuda(), ["observation"], ["action"])
    assert _devices(rollout(GymEnv("Pendulum-v1", device="cuda"), 10, net)) == {"cuda"}


async def test_collector_cpu_env_cuda_policy():
    net = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["action"])
    c = Collector(
        GymEnv("Pendulum-v1"),
        net,
        frames_per_batch=8,
        total_frames=16,
        policy_device="cuda",
        env_device="cpu",
    )
    batches = [b async for b in c]
    await c.ashutdown()
    assert net.module.weight.device.type == "cpu"  # the collector acts with its own copy
    assert len(batches) == 2 and all(_devices(b) == {"cpu"} for b in batches)


def test_sync_collector_over_processes_with_a_cuda_graph_policy():
    env = ParallelEnv(2, functools.partial(GymEnv, "Pendulum-v1"), num_processes=2)
    net = TensorDictModule(
        torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)),
        ["observation"],
        ["action"],
    ).cuda()
    try:
        c = SyncDataCollector(
            env,
            net,
            frames_per_batch=20,
            total_frames=100,
            policy_device="cuda",
            env_device="cpu",
            cudagraph_policy=True,
        )
        batches = [b for b in c]
        c.shutdown()
    finally:
        env.close()
    assert len(batches) == 5 and batches[-1].batch_size == (2, 10)
    assert _devices(batches[-1]) == {"cpu"}


def test_sync_collector_of_a_cuda_env_stores_on_cpu():
    c = SyncDataCollector(
        PendulumEnv(device="cuda"),
        lambda td: td.set("action", td["th"].unsqueeze(-1).clamp(-2, 2)),
        frames_per_batch=16,
        total_frames=32,
        storing_device="cpu",
    )
    batches = [b for b in c]
    c.shutdown()
    assert len(batches) == 2 and all(_devices(b) == {"cpu"} for b in batches)


async def test_rollout_casts_to_a_cuda_policy_and_stores_where_asked():
    net = TensorDictModule(torch.nn.Linear(3, 1).cuda(), ["observation"], ["action"])
    env = GymEnv("Pendulum-v1", device="cpu")
    with torch.no_grad():
        r = await env.rollout(5, net, auto_cast_to_device=True)
    assert r.device.type == "cpu" and _devices(r) == {"cpu"}
    with pytest.raises(RuntimeError, match="device"):  # without the cast: CPU data
        await env.rollout(5, net)
    r = await GymEnv("Pendulum-v1", device="cuda").rollout(5, storing_device="cpu")
    assert r.device.type == "cpu" and _devices(r) == {"cpu"}


@pytest.mark.parametrize(
    "make", [PendulumEnv, FinancialRegimeEnv, TicTacToeEnv, CountingEnv, ChessEnv]
)
async def test_builtin_envs_on_cuda(make):
    if make is ChessEnv:
        pytest.importorskip("chess")
    env = make(device="cuda")
    r = await env.rollout(5, break_when_any_done=False)
    assert r.device.type == "cuda" and _devices(r) == {"cuda"}
