"""SharedLimiter: one cap across the worker processes of a process pool (issue 18 (b)); a
killed holder or a cancelled waiter leaves no slot taken."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from functools import partial

import anyio
import psutil
import pytest
from tensordict import NonTensorData, NonTensorStack, TensorDict

from aenv import AsyncEnvPool
from aenv.exceptions import WorkerCrashedError
from aenv.llm import CodeExecEnv, SandboxLimits, SharedLimiter
from aenv.llm._sandbox import MARKER

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="flock, /proc"),
    pytest.mark.timeout(180),
]
PROCESS = {"num_workers": 2, "start_method": "forkserver"}

HOLDER = """
import asyncio, sys
from aenv.llm import SharedLimiter
lim = SharedLimiter(sys.argv[1], int(sys.argv[2]), directory=sys.argv[3])
async def main():
    for _ in range(int(sys.argv[4])):
        await lim.acquire()
    print("held", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


def hold_in_subprocess(name: str, cap: int, root: str, n: int) -> subprocess.Popen[str]:
    """A separate process holding ``n`` slots of the resource until killed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, name, str(cap), root, str(n)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def responses(*texts: str) -> NonTensorStack:
    return NonTensorStack(*(NonTensorData(t) for t in texts))


async def test_the_cap_holds_across_processes_and_a_killed_holder_frees_its_slots(tmp_path):
    lim = SharedLimiter("across", 3, directory=str(tmp_path))
    holder = hold_in_subprocess("across", 3, str(tmp_path), 2)
    try:
        await lim.acquire()  # the third slot
        got = []

        async def take():
            await lim.acquire()
            got.append(True)

        async with anyio.create_task_group() as tg:
            tg.start_soon(take)
            await anyio.sleep(0.3)  # (a wait that would be over if the cap were per process)
            assert got == [] and lim.active == 1
            holder.kill()  # SIGKILL: no clean-up of its own
            with anyio.fail_after(20):
                while not got:
                    await anyio.sleep(0.01)
        assert lim.active == 2
        lim.release()
        lim.release()
        async with anyio.create_task_group() as tg:  # all three are free again
            for _ in range(3):
                tg.start_soon(lim.acquire)
        assert lim.active == 3
        for _ in range(3):
            lim.release()
    finally:
        holder.kill()
        holder.wait()


async def test_a_cancelled_waiter_takes_no_slot(tmp_path):
    lim = SharedLimiter("cancel", 2, directory=str(tmp_path))
    holder = hold_in_subprocess("cancel", 2, str(tmp_path), 2)
    try:
        with anyio.move_on_after(0.3) as scope:  # waits in a thread on a slot file
            await lim.acquire()
        assert scope.cancelled_caught and lim.active == 0
        with anyio.move_on_after(0.3) as scope:
            await lim.acquire()
        assert scope.cancelled_caught
    finally:
        holder.kill()
        holder.wait()
    # the abandoned waiting threads let go of what they got: both slots come to us
    with anyio.fail_after(20):
        await lim.acquire()
        await lim.acquire()
    assert lim.active == 2
    lim.release()
    lim.release()
    with pytest.raises(RuntimeError, match="without a slot"):
        lim.release()


def _waiting_threads() -> list[threading.Thread]:
    """The threads in which SharedLimiter waiters wait for a slot file."""
    return [t for t in threading.enumerate() if t.name == "aenv-shared-limiter"]


async def test_a_waiter_never_waits_for_a_slot_this_process_holds(tmp_path):
    # another process holds slot-0, this one slot-1; a second acquire here must wait for
    # slot-0 (it once waited in turn for slot-1, its own, and missed slot-0 coming free)
    lim = SharedLimiter("own", 2, directory=str(tmp_path))
    holder = hold_in_subprocess("own", 2, str(tmp_path), 1)
    try:
        await lim.acquire()
        assert lim.active == 1
        earlier = set(_waiting_threads())  # (left by other tests: not this acquire's)
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lim.acquire)
                # (the acquire found no free slot and waits in its thread: the holder's slot
                # must come free only now, or a plain retry would find it)
                while not set(_waiting_threads()) - earlier:
                    await anyio.sleep(0.01)
                holder.kill()
                holder.wait()
    finally:
        holder.kill()
        holder.wait()
    assert lim.active == 2
    lim.release()
    lim.release()


def test_pickling_names_the_same_slots_and_caps_must_agree(tmp_path):
    lim = SharedLimiter("pickled", 4, directory=str(tmp_path))
    copy = pickle.loads(pickle.dumps(lim))
    assert isinstance(copy, SharedLimiter) and copy is not lim
    assert (copy.directory, copy.max_concurrent) == (lim.directory, 4)
    with pytest.raises(ValueError, match="max_concurrent=4"):
        SharedLimiter("pickled", 5, directory=str(tmp_path))
    with pytest.raises(ValueError, match="name"):
        SharedLimiter("../escape", 1, directory=str(tmp_path))


class _Sampler:
    """Counts, from another thread, the sandbox runs that have a live process (psutil). A
    scan of the process table is not one instant, so a run counts only if one of its
    processes is still running once the scan is over: all counted runs were live at that
    same moment."""

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            runs: dict[str, list[psutil.Process]] = {}
            for proc in psutil.process_iter():
                try:
                    token = proc.environ().get(MARKER)
                except (psutil.Error, OSError):
                    continue
                if token:
                    runs.setdefault(token, []).append(proc)
            live = 0
            for procs in runs.values():
                for proc in procs:
                    try:
                        if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                            live += 1
                            break
                    except psutil.Error:
                        continue
            self.counts.append(live)
            time.sleep(0.005)

    def __enter__(self) -> _Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


async def test_64_code_episodes_on_a_process_pool_never_exceed_4_sandboxes(tmp_path):
    """Issue 18: 64 code episodes on a process pool (2 workers) under a cap of 4 never have
    more than 4 live sandboxes, by psutil's count and by the runs' own clocks."""
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    lim = SharedLimiter("sandboxes", 4, directory=str(tmp_path))
    make = partial(
        CodeExecEnv, tests="assert f() == 1", limits=SandboxLimits(wall_time_s=60), limiter=lim
    )
    code = (
        "```python\nimport os, time\n"
        f"d = {str(stamps)!r}\n"
        "start = time.monotonic()\n"
        "time.sleep(0.15)\n"
        "open(os.path.join(d, str(os.getpid())), 'w').write(f'{start} {time.monotonic()}')\n"
        "def f():\n    return 1\n```"
    )
    async with AsyncEnvPool([make] * 64, backend="process", backend_options=PROCESS) as pool:
        td = await pool.reset(
            TensorDict(prompt=responses(*(f"task {i}" for i in range(64))), batch_size=[64])
        )
        td["response"] = responses(*[code] * 64)
        with _Sampler() as sampler:
            out = await pool.step(td)
    assert out["next", "reward"].squeeze(-1).tolist() == [1.0] * 64
    # psutil's count: never above the cap, and the sampler did see runs
    assert max(sampler.counts) <= 4, max(sampler.counts)
    assert max(sampler.counts) >= 1
    # the runs' own clocks (one system-wide monotonic clock): at no moment more than 4
    # programs between their start and end
    events = []
    for name in os.listdir(stamps):
        start, end = map(float, (stamps / name).read_text().split())
        events += [(start, 1), (end, -1)]
    assert len(events) == 2 * 64
    live = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        live += delta
        peak = max(peak, live)
    assert 2 <= peak <= 4, peak  # (both workers ran sandboxes at once, within the cap)


async def test_a_killed_worker_leaves_no_slot_taken(tmp_path):
    lim = SharedLimiter("killed", 1, directory=str(tmp_path))
    make = partial(CodeExecEnv, tests="", limits=SandboxLimits(wall_time_s=600), limiter=lim)
    async with AsyncEnvPool([make], backend="process", backend_options={"num_workers": 1}) as pool:
        td = await pool.reset(TensorDict(prompt=responses("spin"), batch_size=[1]))
        mark = tmp_path / "started"
        td["response"] = responses(
            f"```python\nimport time\nopen({str(mark)!r}, 'w').close()\ntime.sleep(600)\n```"
        )
        pool.async_step_send(td, env_index=[0])
        with anyio.fail_after(60):  # its run started: it holds the slot
            while not mark.exists():
                await anyio.sleep(0.01)
        # the worker holds the only slot while its run sleeps: none for us
        with anyio.move_on_after(1.0) as scope:
            await lim.acquire()
        assert scope.cancelled_caught
        os.kill(pool.worker_pids[0], signal.SIGKILL)  # type: ignore[attr-defined]
        with anyio.fail_after(20), pytest.raises(WorkerCrashedError):
            await pool.async_step_recv(min_get=1)
    with anyio.fail_after(20):  # the kernel let go of the dead worker's slot
        await lim.acquire()
    lim.release()
