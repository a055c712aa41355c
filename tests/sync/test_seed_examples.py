"""The seeds' examples that used to fail, run as the seeds write them (sync facades) and as
their async twins: attribute reads through library wrappers, env construction on threads,
transformed facades, and the sync names of async-trap APIs (close, check_env_specs...)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import cloudpickle
import pytest
import torch

import aenv
from aenv import (
    AsyncContextError,
    AsyncEnvPool,
    Collector,
    GymEnv,
    GymWrapper,
    ObservationNorm,
    ParallelEnv,
    RewardSum,
    SerialEnv,
    StepCounter,
    SyncEnv,
    TransformedEnv,
    acheck_env_specs,
    check_env_specs,
)
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(90)
cloudpickle.register_pickle_by_value(sys.modules[__name__])
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_env() -> GymEnv:
    # the seeds' ParallelEnv example (pixels on, as there; on CPU)
    return GymEnv("Pendulum-v1", from_pixels=True, g=9.81)


def make_pendulum(g: float = 9.81) -> GymEnv:
    return GymEnv("Pendulum-v1", g=g)


# ---------------------------------------------------------------- attribute reads
def test_wrapper_forwards_attribute_reads_to_the_library_env():
    env = GymEnv("Pendulum-v1", g=9.81)
    assert env.g == 9.81 and env.max_speed == 8  # set on gymnasium's PendulumEnv
    assert env.frame_skip == 1  # the wrapper's own attributes come first
    with pytest.raises(AttributeError, match="'nope'"):
        _ = env.nope
    with pytest.raises(AttributeError):
        _ = env._private_name  # private names are never forwarded
    # no recursion before __init__ ran (unpickling and copies look attributes up early)
    bare = GymWrapper.__new__(GymWrapper)
    assert not hasattr(bare, "g") and not hasattr(bare, "__setstate__x")
    twin = cloudpickle.loads(cloudpickle.dumps(env))
    assert twin.g == 9.81 and copy.copy(env).g == 9.81
    env.close()


def test_parallel_env_attributes_seed_example():
    env = make_env()
    check_env_specs(env)  # "this must pass for ParallelEnv to work"
    env.close()
    with ParallelEnv(4, make_env, num_processes=2) as penv:
        assert penv.batch_size == torch.Size([4])
        a, b, c, d = penv.g  # the g-force of each sub-env
        assert (a, b, c, d) == (9.81,) * 4
        td = penv.reset()
        assert td["pixels"].shape == (4, 500, 500, 3)


def test_serial_env_attributes_differ_per_env():
    with SerialEnv(3, [lambda g=g: make_pendulum(g) for g in (9.0, 9.5, 10.0)]) as env:
        assert env.g == [9.0, 9.5, 10.0]


@pytest.mark.parametrize("backend", ["coroutine", "thread"])  # process: ParallelEnv above
async def test_pool_attribute_reads_async_twin(backend):
    fns = [lambda g=g: make_pendulum(g) for g in (9.0, 10.0)]
    async with AsyncEnvPool(fns, backend=backend) as pool:
        assert await pool.get_attr("g") == [9.0, 10.0]
        assert pool.g == [9.0, 10.0]


# ---------------------------------------------------------------- thread construction
_BUILD_AT_ONCE = """
import asyncio, sys
from aenv import AsyncEnvPool, GymEnv
async def main():
    fns = [lambda: GymEnv("CartPole-v1"), lambda: GymEnv("Pendulum-v1"),
           lambda: GymEnv("Acrobot-v1"), lambda: GymEnv("MountainCar-v0")]
    async with AsyncEnvPool(fns, backend="thread", stack="lazy") as pool:
        print(type(pool).__name__, tuple(pool.batch_size), await pool.get_attr("spec"))
asyncio.run(main())
"""


def test_thread_backend_builds_gymnasium_envs_at_once_in_a_fresh_process():
    # a fresh interpreter: nothing of gymnasium's env modules is imported yet
    out = subprocess.run(
        [sys.executable, "-c", _BUILD_AT_ONCE],
        capture_output=True,
        text=True,
        timeout=80,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert out.returncode == 0, out.stderr
    assert "ThreadingAsyncEnvPool (4,)" in out.stdout
    for name in ("CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCar-v0"):
        assert name in out.stdout


def _nested_thread_pool() -> aenv.EnvBase:
    # a factory that builds a thread pool itself: its envs are built while it builds
    return AsyncEnvPool([CountingEnv, CountingEnv], backend="thread")


async def test_thread_pool_built_inside_a_thread_factory_does_not_deadlock():
    async with AsyncEnvPool([_nested_thread_pool] * 2, backend="thread") as pool:
        assert pool.batch_size == torch.Size([2, 2])
        td = await pool.rand_step(await pool.reset())
        assert td["next", "observation"].shape == (2, 2, 1)


# ---------------------------------------------------------------- transformed facades
@pytest.mark.parametrize("facade", ["serial", "parallel"])
def test_transformed_sync_facade(facade):
    if facade == "serial":
        base = SerialEnv(2, make_pendulum)
    else:
        base = ParallelEnv(2, make_pendulum, num_processes=1)
    env = TransformedEnv(base, StepCounter(4))
    try:
        assert isinstance(env, SyncEnv) and isinstance(env.env, TransformedEnv)
        assert env.env.base_env is base.env  # the facade's own pool, not a copy
        r = env.rollout(6, break_when_any_done=False)
        assert r.batch_size == (2, 6)
        assert r["next", "step_count"][0].squeeze(-1).tolist() == [1, 2, 3, 4, 1, 2]
        assert r["next", "truncated"][0].squeeze(-1).tolist() == [0, 0, 0, 1, 0, 0]
        env = env.append_transform(RewardSum())
        r = env.rollout(3)
        expected = r["next", "reward"].cumsum(1)
        assert torch.allclose(r["next", "episode_reward"], expected)
        assert env.g == [9.81, 9.81]  # attribute reads still fan out
        check_env_specs(env)
    finally:
        env.close()
    assert base.env.is_closed


async def test_transformed_pool_async_twin():
    pool = AsyncEnvPool([make_pendulum] * 2, backend="process")
    env = TransformedEnv(pool, StepCounter(4))
    async with env:
        r = await env.rollout(6, break_when_any_done=False)
        assert r["next", "step_count"][1].squeeze(-1).tolist() == [1, 2, 3, 4, 1, 2]
        await acheck_env_specs(env)
    assert pool.is_closed


def test_append_transform_on_a_plain_facade_keeps_its_runner():
    runner = aenv.sync.Runner()
    try:
        base = SyncEnv(CountingEnv(max_steps=5), runner=runner)
        env = base.append_transform(StepCounter())
        assert env.__dict__["_runner"] is runner
        assert env.rollout(3)["next", "step_count"].squeeze(-1).tolist() == [1, 2, 3]
        env.close()
    finally:
        runner.close()


# ---------------------------------------------------------------- the async-trap names
def test_close_works_from_sync_code_on_async_envs_and_pools():
    pool = AsyncEnvPool([CountingEnv, CountingEnv], backend="thread")
    pool.close()
    assert pool.is_closed
    pool.close()  # idempotent
    env = CountingEnv()
    env.close()
    assert env.is_closed


async def test_sync_names_raise_inside_a_running_loop():
    pool = AsyncEnvPool([CountingEnv, CountingEnv])
    with pytest.raises(AsyncContextError, match=r"await env\.aclose\(\)"):
        pool.close()
    assert not pool.is_closed  # nothing half done
    with pytest.raises(AsyncContextError, match="acheck_env_specs"):
        check_env_specs(pool)
    await acheck_env_specs(pool)
    collector = Collector(CountingEnv(), None, frames_per_batch=2, total_frames=2)
    with pytest.raises(AsyncContextError, match="ashutdown"):
        collector.shutdown()
    await collector.ashutdown()
    norm = ObservationNorm(in_keys=["observation"], standard_normal=True)
    TransformedEnv(CountingEnv(max_steps=100), norm)
    with pytest.raises(AsyncContextError, match="ainit_stats"):
        norm.init_stats(10)
    await norm.ainit_stats(10)
    assert norm.initialized
    await pool.aclose()


def test_sync_twins_from_sync_code():
    env = CountingEnv(max_steps=100)
    check_env_specs(env)
    with SerialEnv(2, CountingEnv) as facade:
        check_env_specs(facade)
        with pytest.raises(TypeError, match="sync facade"):
            aenv.sync.run_sync(acheck_env_specs, facade)
    norm = ObservationNorm(in_keys=["observation"], standard_normal=True)
    tenv = TransformedEnv(CountingEnv(max_steps=100), norm)
    norm.init_stats(20)
    # a counting env's observations over 20 steps: 1..20 (standard_normal: loc is the mean)
    assert norm.loc.item() == pytest.approx(10.5)
    tenv.close()
    collector = Collector(CountingEnv(), None, frames_per_batch=2, total_frames=2)
    collector.shutdown()
    assert collector.env.is_closed


def test_check_env_specs_catches_a_lying_env_from_sync_code():
    class Liar(CountingEnv):
        def _step(self, td):
            out = super()._step(td)
            out["observation"] = out["observation"].double()
            return out

    with pytest.raises(AssertionError, match="dtype"):
        check_env_specs(Liar())
