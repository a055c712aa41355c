"""CodeExecEnv in pools: rewards, and no sandbox survives a step timeout, a close or a
worker crash, on the coroutine, thread and process backends; Limiter caps sandboxes."""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import sys
import tempfile
from functools import partial

import anyio
import psutil
import pytest
from tensordict import NonTensorData, NonTensorStack, TensorDict

from aenv import AsyncEnvPool
from aenv.exceptions import PoolError, StepTimeoutError, WorkerCrashedError
from aenv.llm import CodeExecEnv, Limiter, SandboxLimits, extract_code, live_sandboxes
from aenv.testing import assert_no_leaked_processes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

BACKENDS = ["coroutine", "thread", "process"]
PROCESS = {"num_workers": 1, "start_method": "forkserver"}


def options(backend):
    return PROCESS if backend == "process" else {}


def program(body: str, pid_dir: str) -> str:
    return (
        "```python\nimport os, sys, time\n"
        f"open(os.path.join({pid_dir!r}, str(os.getpid())), 'w').close()\n{body}```"
    )


SPIN = "while True:\n    pass\n"


def recorded(pid_dir) -> list[int]:
    return [int(p) for p in os.listdir(pid_dir)]


async def wait_for_pids(pid_dir, n, timeout=30.0):
    with anyio.fail_after(timeout):
        while len(recorded(pid_dir)) < n:
            await anyio.sleep(0.01)


async def wait_dead(pids, timeout=10.0):
    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    with anyio.fail_after(timeout):
        while any(alive(p) for p in pids):
            await anyio.sleep(0.02)


@pytest.fixture
def pid_dir(tmp_path):
    d = tmp_path / "pids"
    d.mkdir()
    return str(d)


def make_env(wall=600.0, **kw):
    return CodeExecEnv(
        prompt="write it", tests=kw.pop("tests", ""), limits=SandboxLimits(wall_time_s=wall), **kw
    )


def responses(*texts):
    return NonTensorStack.from_list(list(texts))


async def test_rewards_and_feedback_turns():
    env = CodeExecEnv(tests="assert f(3) == 9", max_turns=2)
    td = await env.reset(TensorDict(prompt=NonTensorData("square")))
    td["response"] = NonTensorData("```python\ndef f(x):\n    return x + x\n```")
    out = await env.step(td)
    assert out["next", "reward"].item() == 0.0 and not out["next", "done"].item()
    assert out["next", "exit_code"].item() == 1 and not out["next", "timed_out"].item()
    assert td["exit_code"].item() == 0  # after the reset: no run yet
    feedback = out["next", "history"][-1]
    assert feedback.role == "user" and "AssertionError" in feedback.content
    td = out["next"].clone()
    td["response"] = NonTensorData("```python\ndef f(x):\n    return x * x\n```")
    out = await env.step(td)
    assert out["next", "reward"].item() == 1.0 and out["next", "terminated"].item()
    assert env.last_result is not None and env.last_result.ok
    with pytest.raises(ValueError, match="needs tests"):
        await CodeExecEnv().reset(TensorDict(prompt=NonTensorData("x")))
    assert extract_code("a\n```py\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
async def test_pool_rewards_per_task(backend):
    tasks = [
        ("def f(x): return x + 1", "assert f(1) == 2"),
        ("def f(x): return x", "assert f(1) == 2"),
    ]
    async with AsyncEnvPool([make_env] * 2, backend=backend, **options(backend)) as pool:
        td = await pool.reset(
            TensorDict(
                prompt=NonTensorStack.from_list(["inc", "inc"]),
                tests=NonTensorStack.from_list([t for _, t in tasks]),
                batch_size=[2],
            )
        )
        td["response"] = responses(*(f"```python\n{code}\n```" for code, _ in tasks))
        out = await pool.step(td)
    assert out["next", "reward"].squeeze(-1).tolist() == [1.0, 0.0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
async def test_pool_step_timeout_kills_the_sandbox(backend, pid_dir):
    async with AsyncEnvPool(
        [make_env] * 2, backend=backend, step_timeout=4.0, **options(backend)
    ) as pool:
        td = await pool.reset()
        td["response"] = responses(program(SPIN, pid_dir), program(SPIN, pid_dir))
        with assert_no_leaked_processes():  # the pool's own workers were there before
            with pytest.raises((PoolError, StepTimeoutError)):
                await pool.step(td)
        assert len(recorded(pid_dir)) == 2  # both programs did run
        await wait_dead(recorded(pid_dir))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
async def test_pool_close_kills_running_sandboxes(backend, pid_dir):
    escapee = (
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    open(os.path.join({pid_dir!r}, str(os.getpid())), 'w').close()\n"
        "    while True:\n"
        "        time.sleep(1)\n"
        "while True:\n"
        "    pass\n"
    )
    with assert_no_leaked_processes(timeout=20):
        async with AsyncEnvPool([make_env] * 2, backend=backend, **options(backend)) as pool:
            td = await pool.reset()
            td["response"] = responses(program(escapee, pid_dir), program(SPIN, pid_dir))
            pool.async_step_send(td, env_index=[0, 1])
            await wait_for_pids(pid_dir, 3)
    await wait_dead(recorded(pid_dir))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
async def test_cancelled_step_kills_the_sandbox(backend, pid_dir):
    async with AsyncEnvPool([make_env], backend=backend, **options(backend)) as pool:
        td = await pool.reset()
        td["response"] = responses(program(SPIN, pid_dir))
        with assert_no_leaked_processes():
            async with anyio.create_task_group() as tg:
                tg.start_soon(pool.step, td)
                await wait_for_pids(pid_dir, 1)
                tg.cancel_scope.cancel()
        await wait_dead(recorded(pid_dir))


class BlockingCodeEnv(CodeExecEnv):
    """Runs its step as one blocking call (its own event loop): a cancel cannot reach it,
    only the pool's interrupt() can."""

    def _step(self, tensordict):  # type: ignore[override]
        return asyncio.run(CodeExecEnv._step(self, tensordict))


@pytest.mark.timeout(120)
async def test_thread_pool_interrupts_a_blocking_step_it_gives_up(pid_dir):
    make = partial(BlockingCodeEnv, prompt="p", tests="", limits=SandboxLimits(wall_time_s=600))
    async with AsyncEnvPool([make], backend="thread", step_timeout=4.0) as pool:
        td = await pool.reset()
        td["response"] = responses(program(SPIN, pid_dir))
        with pytest.raises((PoolError, StepTimeoutError)):
            await pool.step(td)
        # the abandoned thread's sandbox is dead long before its 600 s wall time
        await wait_dead(recorded(pid_dir))
        assert len(recorded(pid_dir)) == 1


@pytest.mark.timeout(120)
async def test_worker_crash_takes_its_sandboxes_along(pid_dir):
    async with AsyncEnvPool([make_env] * 2, backend="process", **PROCESS) as pool:
        td = await pool.reset()
        td["response"] = responses(program(SPIN, pid_dir), program(SPIN, pid_dir))
        pool.async_step_send(td, env_index=[0, 1])
        await wait_for_pids(pid_dir, 2)
        dead = pool.worker_pids[0]
        scratch = os.path.join(tempfile.gettempdir(), f"aenv-sandbox-{dead}-*")
        assert glob.glob(scratch)  # (the runs' folders, named by their worker)
        os.kill(dead, signal.SIGKILL)
        with pytest.raises(WorkerCrashedError):
            await pool.async_step_recv(min_get=2)
        await wait_dead(recorded(pid_dir))  # through the death signal set in the sandbox
        assert glob.glob(scratch) == []  # (removed by the pool: the worker could not)


@pytest.mark.timeout(180)
async def test_64_code_episodes_under_limiter_4_never_exceed_4_sandboxes():
    limiter = Limiter(4)
    make = partial(
        CodeExecEnv, tests="assert f() == 1", limits=SandboxLimits(wall_time_s=60), limiter=limiter
    )
    seen_live = []
    async with AsyncEnvPool([make] * 64) as pool:
        td = await pool.reset(
            TensorDict(prompt=responses(*(f"task {i}" for i in range(64))), batch_size=[64])
        )
        code = "```python\nimport time\ntime.sleep(0.05)\ndef f():\n    return 1\n```"
        td["response"] = responses(*[code] * 64)
        stop = False

        async def sample():
            while not stop:
                seen_live.append(live_sandboxes())  # exact: read under the registry's lock
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            out = await pool.step(td)
            stop = True
    assert out["next", "reward"].squeeze(-1).tolist() == [1.0] * 64
    assert limiter.peak == 4 and limiter.active == 0
    assert max(seen_live) <= 4
    assert max(seen_live) >= 2  # the sampler did see sandboxes running
