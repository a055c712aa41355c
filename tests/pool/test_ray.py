"""The Ray backend on a real local Ray cluster (one per test session, 2 CPUs).

Actors are Python processes importing torch: each pool here costs seconds to start, so the
tests are few and each checks several things on one pool.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from functools import partial

import pytest
import torch
from _support.ray import NUM_CPUS, LoopBlockingEnv, actor_states, pool_actor_ids, ray_cluster

from aenv import EnvStepError, PoolError, StepTimeoutError
from aenv.collectors import Collector
from aenv.exceptions import BackendUnavailableError, WorkerCrashedError
from aenv.pool import AsyncEnvPool
from aenv.sync import ParallelEnv
from aenv.testing import CountingEnv, FailingEnv, HangingEnv, LatencyEnv

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def ray():
    return ray_cluster()


def ray_pool(fns, **kw) -> AsyncEnvPool:
    options = {"num_cpus": NUM_CPUS, **kw.pop("backend_options", {})}
    return AsyncEnvPool(fns, backend="ray", backend_options=options, **kw)


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # ``import ray`` now fails
    with pytest.raises(BackendUnavailableError, match=r"aenv\[ray\]"):
        AsyncEnvPool((2, CountingEnv), backend="ray")


async def test_steps_stream_seed_and_close(ray):
    fns = [partial(LatencyEnv, median=0.01, sigma=0.5, seed=i, max_steps=4) for i in range(4)]
    # the same seeds give the same rollout as in this process
    async with AsyncEnvPool(fns) as local:
        await local.set_seed(7)
        expected = await local.rollout(6, break_when_any_done=False)
    pool = ray_pool(fns, backend_options={"envs_per_actor": 2})
    ids = pool_actor_ids(pool)
    try:
        pids = pool._backend.actor_pids
        assert len(set(pids)) == 2 and os.getpid() not in pids
        if os.geteuid() == 0:  # (allowed to lower it): every thread at this process's nice
            mine = os.getpriority(os.PRIO_PROCESS, 0)
            for pid in pids:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
                assert {os.getpriority(os.PRIO_PROCESS, t) for t in tids} == {mine}, pid
        assert await pool.set_seed(7) == 11
        got = await pool.rollout(6, break_when_any_done=False)
        assert torch.equal(got["next", "observation"], expected["next", "observation"])
        assert torch.equal(got["next", "latency"], expected["next", "latency"])
        assert torch.equal(got["next", "done"], expected["next", "done"])
        assert await pool.get_attr("max_steps") == [4] * 4
        (latency,) = await pool.call("draw_latency", env_indices=[1])
        assert 0 < latency < 1

        # streaming: results come back as each env finishes, the fast env first
        slow = ray_pool(
            [partial(LatencyEnv, latency=0.05), partial(LatencyEnv, latency=30.0)],
            backend_options={"num_actors": 1},
        )
        ids += pool_actor_ids(slow)
        async with slow:
            td = await slow.reset()
            slow.async_step_send(slow.rand_action(td), env_index=[0, 1])
            first = await slow.async_step_recv()
            assert first["env_index"].tolist() == [0]
            assert first["next", "observation"][0, 0] == 1
            assert slow.cancel(1)  # the 30 s step is given up; env 1 is free again
            one = await slow.reset_one(1)
            assert one["observation"][0] == 0
        assert set(actor_states(ray, pool_actor_ids(slow))) == {"DEAD"}
    finally:
        await pool.aclose()
    # closing killed every actor the pools made, as Ray's state API reports
    assert actor_states(ray, ids) == ["DEAD"] * 3


async def test_env_exception_arrives_with_remote_traceback(ray):
    fns = [partial(CountingEnv, max_steps=100), partial(FailingEnv, fail_after=1, message="kaboom")]
    async with ray_pool(fns, backend_options={"num_actors": 1}) as pool:
        td = pool.step_mdp(await pool.rand_step(await pool.reset()))
        with pytest.raises(PoolError) as info:
            await pool.rand_step(td)
        err = info.value.errors[1]
        assert isinstance(err, EnvStepError) and not isinstance(err, WorkerCrashedError)
        assert err.env_index == 1 and err.remote_type == "RuntimeError"
        assert "kaboom" in str(err)
        # the traceback is the actor's: it went through the env's _step in aenv/testing
        assert "_mocks.py" in err.remote_traceback and "in _step" in err.remote_traceback
        assert list(info.value.results) == [0]


async def test_sigkill_mid_rollout_restarts_the_actor(ray):
    fns = [partial(CountingEnv, max_steps=100)] * 2
    pool = ray_pool(fns, on_error="restart", backend_options={"num_actors": 2})
    async with pool:
        old = pool._backend.actor_pids
        old_ids = pool_actor_ids(pool)
        steps = 0

        def policy(td):
            nonlocal steps
            steps += 1
            if steps == 3:  # before the third step: env 0's actor dies
                os.kill(old[0], signal.SIGKILL)
            return pool.rand_action(td)

        td = await pool.rollout(5, policy, break_when_any_done=False)
        obs = td["next", "observation"].squeeze(-1)
        # env 0's third step died with its actor: reported truncated, from a fresh reset
        assert obs[0].tolist() == [1, 2, 0, 1, 2]
        assert td["next", "done"].squeeze(-1)[0].tolist() == [False, False, True, False, False]
        assert obs[1].tolist() == [1, 2, 3, 4, 5]
        assert isinstance(pool.last_errors[0], WorkerCrashedError)
        assert "died" in str(pool.last_errors[0])
        new = pool._backend.actor_pids
        assert new[0] not in (None, old[0]) and new[1] == old[1]
        assert actor_states(ray, old_ids[:1]) == ["DEAD"]


async def test_sigkill_without_restart_fails_then_needs_a_reset(ray):
    fns = [partial(LatencyEnv, latency=0.01), partial(LatencyEnv, latency=30.0)]
    async with ray_pool(fns, backend_options={"num_actors": 2}) as pool:
        td = await pool.reset()
        pool.async_step_send(pool.rand_action(td), env_index=[0, 1])
        await pool.async_step_recv()  # env 0 came back; env 1 is in its 30 s step
        os.kill(pool._backend.actor_pids[1], signal.SIGKILL)
        with pytest.raises(WorkerCrashedError) as info:
            await pool.async_step_recv()
        assert info.value.env_index == 1
        one = await pool.reset_one(0)
        one["action"] = torch.zeros(1)  # a valid action for one env (its spec: shape (1,))
        with pytest.raises(WorkerCrashedError, match="needs a reset"):
            await pool.step_one(1, one.clone())
        fresh = await pool.reset_one(1)  # in the new actor
        assert fresh["observation"][0] == 0


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_hanging_env_is_given_up_at_step_timeout(ray, mode):
    fns = [partial(CountingEnv, max_steps=100), partial(HangingEnv, hang_after=1, mode=mode)]
    pool = ray_pool(fns, step_timeout=2.0, backend_options={"num_actors": 1})
    async with pool:
        pid = pool._backend.actor_pids[0]
        td = pool.step_mdp(await pool.rand_step(await pool.reset()))
        with pytest.raises(PoolError) as info:
            await pool.rand_step(td)
        assert isinstance(info.value.errors[1], StepTimeoutError)
        # env 1 was rebuilt in its actor (no new actor): it resets and steps again
        td = await pool.reset()
        td = await pool.rand_step(td)
        assert td["next", "observation"].squeeze(-1).tolist() == [1, 1]
        assert pool._backend.actor_pids == [pid]


async def test_actor_blocked_by_its_env_is_killed_and_replaced(ray):
    # env 0 fails at once; env 1 then holds the actor's event loop. Restarting env 0 needs
    # the actor, which does not answer: it is killed, a new one hosts both envs.
    fns = [partial(FailingEnv, fail_after=0), partial(LoopBlockingEnv, block_at=0)]
    pool = ray_pool(
        fns, on_error="restart", backend_options={"num_actors": 1, "replace_timeout": 0.5}
    )
    async with pool:
        pid = pool._backend.actor_pids[0]
        td = await pool.reset()
        pool.async_step_send(pool.rand_action(td), env_index=[0, 1])  # (streamed: per env)
        got = await pool.async_step_recv(min_get=2)
        assert got["next", "done"].squeeze(-1).tolist() == [True, True]
        assert isinstance(pool.last_errors[0], EnvStepError)
        blocked = pool.last_errors[1]
        assert isinstance(blocked, WorkerCrashedError)
        assert "did not answer within 0.5 s" in str(blocked)
        assert pool._backend.actor_pids[0] not in (None, pid)


async def test_whole_batch_step_of_a_blocked_actor_times_out(ray):
    """A whole-batch step (one call per actor, the envs stepping into rows) on an actor
    whose sync env holds its event loop: past ``step_timeout`` and ``replace_timeout``
    the actor is killed and started again, its envs' steps time out; the other actor's
    env steps on, and the restarted envs reset and step."""
    fns = [partial(LoopBlockingEnv, block_at=1), partial(CountingEnv, max_steps=100)]
    pool = ray_pool(
        fns, step_timeout=1.0, backend_options={"num_actors": 2, "replace_timeout": 0.5}
    )
    async with pool:
        pids = pool._backend.actor_pids
        calls = count_stacked(pool)
        td = pool.step_mdp(await pool.rand_step(await pool.reset()))
        with pytest.raises(PoolError) as info:
            await pool.rand_step(td)
        assert isinstance(info.value.errors[0], StepTimeoutError)
        assert list(info.value.results) == [1]
        assert calls == [("step", None)] * 2  # both steps went whole-batch
        pool.step_timeout = 120.0  # the new actor takes seconds to start on a loaded machine
        td = await pool.rand_step(await pool.reset())
        assert td["next", "observation"].squeeze(-1).tolist() == [1, 1]
        new = pool._backend.actor_pids
        assert new[0] not in (None, pids[0]) and new[1] == pids[1]


def test_parallel_env_and_collector_over_ray(ray):
    with ParallelEnv(
        4,
        CountingEnv,
        {"max_steps": 3},
        backend="ray",
        num_processes=2,
        backend_options={"num_cpus": NUM_CPUS},
    ) as env:
        assert len(set(env.worker_pids)) == 2
        td = env.rollout(4, break_when_any_done=False)
        assert td.batch_size == torch.Size([4, 4])
        assert td["next", "observation"].squeeze(-1)[2].tolist() == [1, 2, 3, 1]
        assert env.max_steps == [3, 3, 3, 3]
    fns = [partial(LatencyEnv, latency=0.001 * (i + 1), max_steps=5) for i in range(2)]

    async def collect() -> list:
        pool = ray_pool(fns, backend_options={"num_actors": 1})
        batches = []
        async with pool:
            async for batch in Collector(pool, None, frames_per_batch=6, total_frames=12):
                batches.append(batch)
        return batches

    import anyio

    batches = anyio.run(collect)
    assert [b.batch_size for b in batches] == [torch.Size([6])] * 2
    for b in batches:
        assert set(b["env_index"].tolist()) <= {0, 1}
        assert b["next", "reward"].sum() == 6


def test_cluster_started_or_attached_and_left_as_found(ray, tmp_path):
    """In a fresh process: a pool attaches to this session's cluster by address (the path
    to a cluster of several machines), then one starts a local cluster; each says which in
    its log line, and closing leaves the process unconnected and the session's cluster up."""
    address = ray.get_runtime_context().gcs_address
    script = textwrap.dedent(
        f"""
        import asyncio, logging, sys
        from functools import partial
        import ray
        from aenv.pool import AsyncEnvPool
        from aenv.testing import CountingEnv
        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")

        async def main(address, init_options):
            options = {{"address": address, "init_options": init_options, "num_cpus": 0.25}}
            pool = AsyncEnvPool((2, partial(CountingEnv, max_steps=2)), backend="ray",
                                backend_options=options)
            td = await pool.rollout(2)
            print("OBS", td["next", "observation"].flatten().tolist())
            assert ray.is_initialized()
            await pool.aclose()
            print("CONNECTED AFTER CLOSE", ray.is_initialized())

        asyncio.run(main({address!r}, {{}}))
        asyncio.run(main("local", {{"num_cpus": 1}}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=170, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert f"ray backend: attached to the Ray cluster at {address}, 2 CPUs" in lines
    assert any(line.startswith("ray backend: started a local Ray cluster") for line in lines)
    assert lines.count("OBS [1.0, 2.0, 1.0, 2.0]") == 2
    assert lines.count("CONNECTED AFTER CLOSE False") == 2
    # the session's cluster, which the first pool attached to, is still up
    assert ray.cluster_resources().get("CPU") == 2


def count_exchanges(pool: AsyncEnvPool) -> list[tuple[int, int]]:
    """Record each ``exchange`` call the pool's Ray backend makes: (actor, operations)."""
    backend = pool._backend
    calls: list[tuple[int, int]] = []
    exchange = backend._exchange

    def counting(g, items):
        calls.append((g.gid, len(items)))
        return exchange(g, items)

    backend._exchange = counting
    return calls


def count_stacked(pool: AsyncEnvPool) -> list[tuple[str, object]]:
    """Record each whole-batch call the pool's Ray backend takes: (op, indices)."""
    backend = pool._backend
    calls: list[tuple[str, object]] = []
    launch = backend.launch

    def counting(op, inputs, step_timeout, indices=None, **kw):
        call = launch(op, inputs, step_timeout, indices, **kw)
        if call is not None:
            calls.append((op, indices))
        return call

    backend.launch = counting
    return calls


async def test_one_call_per_actor_per_batch_and_big_tensors(ray):
    """A whole-batch step of sync envs is one call per actor, the envs stepping into their
    actor's rows: resets of the envs of one actor only, masked steps and
    ``step_and_maybe_reset`` give what the in-process pool gives; observations of hundreds
    of KiB arrive whole and writable. Steps travel on each actor's socket (the default)."""
    fns = [partial(CountingEnv, max_steps=m) for m in (2, 3, 100, 100)]
    async with AsyncEnvPool(fns) as local:
        expected = await local.rollout(5, break_when_any_done=False)
        masked = await local.reset()
        masked["action"] = torch.ones(4, 1)
        masked["_step"] = torch.tensor([True, False, False, True])
        expected_masked = await local.step_and_maybe_reset(masked.clone())
    pool = ray_pool(fns, backend_options={"num_actors": 2})
    async with pool:
        assert all(g.chan is not None for g in pool._backend._groups)
        exchanges, stacked = count_exchanges(pool), count_stacked(pool)
        td = await pool.rollout(5, break_when_any_done=False)
        # the reset: one exchange per actor, 2 envs each; then 5 whole-batch steps (the
        # last one not followed by a reset)
        assert sorted(exchanges) == [(0, 2), (1, 2)]
        assert stacked == [("step_and_maybe_reset", None)] * 4 + [("step", None)]
        for key in (("next", "observation"), ("next", "done"), "observation"):
            assert torch.equal(td[key], expected[key]), key
        # a masked step_and_maybe_reset: envs 0 and 3, one in each actor
        masked = await pool.reset()
        masked["action"] = torch.ones(4, 1)
        masked["_step"] = torch.tensor([True, False, False, True])
        got = await pool.step_and_maybe_reset(masked.clone())
        assert stacked[-1] == ("step_and_maybe_reset", [0, 3])
        for a, b in zip(got, expected_masked):
            assert torch.equal(a["observation"], b["observation"])
        assert torch.equal(got[0]["next", "observation"], expected_masked[0]["next", "observation"])

    dim = 100_000  # 400 KB of float32 per env: past what Ray sends inline
    pool = ray_pool([partial(LatencyEnv, obs_dim=dim)] * 2, backend_options={"num_actors": 1})
    async with pool:
        td = await pool.rand_step(await pool.reset())
        assert td["next", "observation"].shape == (2, dim)
        assert bool((td["next", "observation"] == 1).all())
        one = pool.step_mdp(td)[1].clone()
        one["action"] = torch.zeros(1)
        got = await pool.step_one(1, one)
        obs = got["next", "observation"]
        assert obs.shape == (dim,) and bool((obs == 2).all())
        obs.add_(1)  # a private, writable copy (not a read-only view of shared memory)
        assert bool((obs == 3).all())


async def test_steps_through_ray_calls_as_through_the_socket(ray):
    """``transport="ray"`` (every step a Ray actor call, for drivers that cannot reach the
    actors' nodes) gives what the default socket gives: whole-batch and streamed steps."""
    with pytest.raises(ValueError, match="transport"):
        ray_pool([CountingEnv], backend_options={"transport": "grpc"})
    fns = [partial(CountingEnv, max_steps=m) for m in (2, 5)]
    async with AsyncEnvPool(fns) as local:
        expected = await local.rollout(4, break_when_any_done=False)
    pool = ray_pool(fns, backend_options={"transport": "ray", "num_actors": 1})
    async with pool:
        assert all(g.chan is None for g in pool._backend._groups)  # (no socket made)
        got = await pool.rollout(4, break_when_any_done=False)
        for key in (("next", "observation"), ("next", "done"), "observation"):
            assert torch.equal(got[key], expected[key]), key
        td = await pool.reset()
        pool.async_step_send(pool.rand_action(td), env_index=[0, 1])
        out = await pool.async_step_recv(min_get=2)
        assert sorted(out["env_index"].tolist()) == [0, 1]
        assert out["next", "observation"].flatten().tolist() == [1.0, 1.0]
