"""Tests of the loop runner, the one sync-to-async bridge (plain `def` tests: sync callers)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import threading
import traceback
from collections.abc import Iterator

import pytest
import torch

from aenv.sync import Runner, get_runner, run_sync


@pytest.fixture(params=[None, True], ids=["default-loop", "uvloop"])
def runner(request: pytest.FixtureRequest) -> Iterator[Runner]:
    r = Runner(use_uvloop=request.param)
    yield r
    r.close()


async def _add(a: int, b: int = 0) -> int:
    await asyncio.sleep(0)
    return a + b


class _Boom(ValueError):
    pass


async def _inner_raiser() -> None:
    await asyncio.sleep(0)
    raise _Boom("boom")


async def _outer_raiser() -> None:
    await _inner_raiser()


def _frames(exc: BaseException) -> list[str]:
    return [f.name for f in traceback.extract_tb(exc.__traceback__)]


# ------------------------------------------------------------------ basics


def test_result_args_and_kwargs(runner: Runner) -> None:
    assert runner.run(_add, 1, b=2) == 3
    assert runner.run_coro(_add(4, 5)) == 9


def test_run_coro_accepts_awaitables(runner: Runner) -> None:
    async def make_future() -> asyncio.Future[int]:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(7)
        return fut

    fut = runner.run(make_future)
    assert runner.run_coro(fut) == 7


def test_exception_type_and_traceback_kept(runner: Runner) -> None:
    with pytest.raises(_Boom, match="boom") as info:
        runner.run(_outer_raiser)
    frames = _frames(info.value)
    assert "_outer_raiser" in frames and "_inner_raiser" in frames


def test_exception_traceback_kept_through_background_thread(runner: Runner) -> None:
    async def main() -> BaseException:
        try:
            runner.run(_outer_raiser)
        except _Boom as exc:
            return exc
        raise AssertionError("no exception")

    exc = asyncio.run(main())
    frames = _frames(exc)
    assert "_outer_raiser" in frames and "_inner_raiser" in frames and "main" in frames


def test_loop_kind_is_chosen_by_use_uvloop() -> None:
    # asyncio's loop by default (cheaper to start once per call); uvloop on request
    with Runner() as r:
        assert type(r.loop).__module__.startswith("asyncio")
        assert r.run(_add, 1, 2) == 3
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        with Runner(use_uvloop=True) as r:
            assert isinstance(r.loop, uvloop.Loop)
            assert r.run(_add, 2, 2) == 4
    with Runner(use_uvloop=False) as r:
        assert type(r.loop).__module__.startswith("asyncio")
        assert r.run(_add, 1, 1) == 2


# ------------------------------------------------------------ loop identity


def test_same_loop_every_call_and_objects_survive(runner: Runner) -> None:
    state: dict[str, object] = {}

    async def first() -> asyncio.AbstractEventLoop:
        event = asyncio.Event()
        state["event"] = event

        async def setter() -> None:
            await asyncio.sleep(0)
            event.set()

        state["task"] = asyncio.get_running_loop().create_task(setter())
        return asyncio.get_running_loop()

    async def second() -> asyncio.AbstractEventLoop:
        event = state["event"]
        assert isinstance(event, asyncio.Event)
        await event.wait()
        return asyncio.get_running_loop()

    loop1 = runner.run(first)
    loop2 = runner.run(second)
    assert loop1 is loop2 is runner.loop


def test_call_soon_threadsafe_between_calls_delivered(runner: Runner) -> None:
    async def make_event() -> asyncio.Event:
        return asyncio.Event()

    event = runner.run(make_event)
    t = threading.Thread(target=runner.loop.call_soon_threadsafe, args=(event.set,))
    t.start()
    t.join()

    async def wait() -> bool:
        await event.wait()
        return event.is_set()

    assert runner.run(wait) is True


def test_loop_runs_in_calling_thread_without_running_loop(runner: Runner) -> None:
    async def ident() -> int:
        return threading.get_ident()

    assert runner.run(ident) == threading.get_ident()


# --------------------------------------------------------- inside a foreign loop


def test_from_inside_foreign_loop_uses_runner_loop(runner: Runner) -> None:
    async def where() -> tuple[asyncio.AbstractEventLoop, int]:
        return asyncio.get_running_loop(), threading.get_ident()

    async def main() -> tuple[asyncio.AbstractEventLoop, int, asyncio.AbstractEventLoop]:
        loop, ident = runner.run(where)
        return loop, ident, asyncio.get_running_loop()

    loop, ident, foreign = asyncio.run(main())
    assert loop is runner.loop and foreign is not runner.loop
    assert ident != threading.get_ident()
    # and afterwards the loop runs in this (loop-free) thread again
    assert runner.run(where) == (runner.loop, threading.get_ident())


def test_objects_survive_across_threads_and_foreign_loops(runner: Runner) -> None:
    async def make_event() -> asyncio.Event:
        return asyncio.Event()

    async def set_it(event: asyncio.Event) -> None:
        event.set()

    async def wait(event: asyncio.Event) -> bool:
        await event.wait()
        return True

    event = runner.run(make_event)

    async def main() -> None:
        runner.run(set_it, event)

    asyncio.run(main())
    assert runner.run(wait, event)


def test_contextvars_carried_to_background_thread(runner: Runner) -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    async def read() -> str:
        return var.get()

    async def main() -> str:
        var.set("caller")
        return runner.run(read)

    assert asyncio.run(main()) == "caller"


def test_inside_runner_loop_raises_clear_error(runner: Runner) -> None:
    async def nested() -> None:
        runner.run(_add, 1)

    async def nested_coro() -> None:
        runner.run_coro(_add(1))

    with pytest.raises(RuntimeError, match=r"(?i)await the async API"):
        runner.run(nested)
    with pytest.raises(RuntimeError, match=r"(?i)await the async API"):
        runner.run(nested_coro)
    assert runner.run(_add, 2, 3) == 5  # still usable


def test_grad_mode_carried_to_background_thread(runner: Runner) -> None:
    async def modes() -> tuple[bool, bool]:
        return torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    async def main() -> list[tuple[bool, bool]]:
        out = []
        with torch.no_grad():
            out.append(runner.run(modes))
        out.append(runner.run(modes))
        with torch.inference_mode():
            out.append(runner.run(modes))
        out.append(runner.run(modes))
        return out

    assert asyncio.run(main()) == [(False, False), (True, False), (False, True), (True, False)]
    with torch.no_grad():  # in-thread: the caller's own thread state applies
        assert runner.run(modes) == (False, False)


# ----------------------------------------------------------------- timeout


@pytest.mark.parametrize("foreign", [False, True], ids=["in-thread", "foreign-loop"])
def test_timeout_cancels_and_runs_cleanup(runner: Runner, foreign: bool) -> None:
    cleaned = []

    async def hang() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # cleanup may await
            cleaned.append(True)

    def call() -> None:
        runner.run(hang, timeout=0.05)

    async def main() -> None:
        call()

    with pytest.raises(TimeoutError):
        asyncio.run(main()) if foreign else call()
    assert cleaned == [True]
    assert not [t for t in asyncio.all_tasks(runner.loop) if not t.done()]
    assert runner.run(_add, 1, timeout=5) == 1


def test_timeout_not_hit_returns_result(runner: Runner) -> None:
    assert runner.run(_add, 2, 2, timeout=10.0) == 4


def test_own_cancellation_is_not_a_timeout(runner: Runner) -> None:
    async def cancel_self() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        runner.run(cancel_self, timeout=10.0)


# ------------------------------------------------------------ interruption


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals")
def test_keyboard_interrupt_cancels_task_and_runs_cleanup(runner: Runner) -> None:
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT handler replaced")
    entered = threading.Event()
    cleaned = []

    async def hang() -> None:
        try:
            entered.set()
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)
            cleaned.append(True)

    def interrupt() -> None:
        entered.wait()
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=interrupt)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.run(hang)
    finally:
        t.join()
    assert cleaned == [True]
    assert runner.run(_add, 3) == 3


# ----------------------------------------------------------------- threads


def test_many_threads_at_once(runner: Runner) -> None:
    n = 8
    barrier = threading.Barrier(n)
    results: dict[int, int] = {}
    errors: list[BaseException] = []

    async def square(i: int) -> int:
        for _ in range(3):
            await asyncio.sleep(0)
        return i * i

    def worker(i: int) -> None:
        try:
            barrier.wait()
            if i % 2:  # half of them from inside a foreign loop
                results[i] = asyncio.run(_call_in_loop(runner, square, i))
            else:
                results[i] = runner.run(square, i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == {i: i * i for i in range(n)}


async def _call_in_loop(runner: Runner, fn: object, *args: object) -> object:
    return runner.run(fn, *args)  # type: ignore[arg-type]


# ----------------------------------------------------------------- closing


def test_close_leaves_no_thread_and_is_idempotent() -> None:
    before = set(threading.enumerate())
    r = Runner()

    async def use_executor() -> int:
        return await asyncio.get_running_loop().run_in_executor(None, lambda: 5)

    async def main() -> int:
        return r.run(use_executor)  # starts the background thread and an executor thread

    assert asyncio.run(main()) == 5
    assert len(set(threading.enumerate()) - before) >= 1
    r.close()
    assert set(threading.enumerate()) - before == set()
    assert r.closed and r.loop.is_closed()
    r.close()
    with pytest.raises(RuntimeError, match="closed"):
        r.run(_add, 1)


def test_a_call_that_never_suspends_runs_as_the_loop_would_run_it(runner: Runner) -> None:
    # The runner takes the first step of a call's task at once (no loop start when the call
    # never suspends); inside it everything a task can rely on must hold.
    seen: list[object] = []

    async def body() -> int:
        seen.append(asyncio.get_running_loop() is runner.loop)
        task = asyncio.current_task()
        seen.append(task is not None and not task.done())
        async with asyncio.timeout(5):  # needs a current task
            pass
        asyncio.get_running_loop().call_soon(seen.append, "callback")
        return 7

    assert runner.run(body) == 7
    assert seen == [True, True, "callback"]  # the callback ran before the call returned
    assert asyncio._get_running_loop() is None and not runner.loop.is_running()

    async def suspends() -> int:
        async with asyncio.TaskGroup() as tg:  # a child task: the call suspends
            child = tg.create_task(_add(1, 2))
        return child.result()

    assert runner.run(suspends) == 3

    async def fails() -> None:
        raise _Boom("now")

    with pytest.raises(_Boom, match="now"):
        runner.run(fails)
    assert runner.run(_add, 2, 3) == 5  # the loop is still consistent


def test_close_cancels_leftover_tasks_and_asyncgens() -> None:
    r = Runner()
    cleaned = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("task")

    async def agen() -> object:
        try:
            yield 1
            yield 2
        finally:
            cleaned.append("agen")

    holder = []

    async def start() -> None:
        holder.append(asyncio.get_running_loop().create_task(forever()))
        gen = agen()
        holder.append(gen)
        await gen.__anext__()

    r.run(start)
    r.close()
    assert sorted(cleaned) == ["agen", "task"]


def test_close_from_inside_foreign_loop() -> None:
    before = set(threading.enumerate())
    r = Runner()

    async def main() -> None:
        assert r.run(_add, 1) == 1
        r.close()

    asyncio.run(main())
    assert r.closed and r.loop.is_closed()
    assert set(threading.enumerate()) - before == set()


def test_close_from_inside_own_loop_raises(runner: Runner) -> None:
    async def close_me() -> None:
        runner.close()

    with pytest.raises(RuntimeError):
        runner.run(close_me)
    assert not runner.closed


# ---------------------------------------------------------- default runner


def test_default_runner_and_run_sync() -> None:
    r = get_runner()
    assert get_runner() is r
    assert run_sync(_add, 20, b=22) == 42
    r.close()
    r2 = get_runner()
    assert r2 is not r and not r2.closed
    assert run_sync(_add, 1, timeout=5) == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_gets_fresh_runner() -> None:
    parent = get_runner()
    parent_loop_id = id(parent.loop)
    assert run_sync(_add, 1) == 1
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report through the pipe, never return into pytest
        code = 1
        try:
            child = get_runner()
            ok = (
                child is not parent
                and id(child.loop) != parent_loop_id
                and parent.closed
                and run_sync(_add, 2, 3) == 5
            )
            code = 0 if ok else 2
        finally:
            os.write(write_fd, bytes([code]))
            os._exit(code)
    os.close(write_fd)
    try:
        status = os.read(read_fd, 1)
    finally:
        os.close(read_fd)
        os.waitpid(pid, 0)
    assert status == b"\x00"
    assert get_runner() is parent and run_sync(_add, 4) == 4


def test_timeout_covers_waiting_for_a_busy_loop(runner: Runner) -> None:
    started = threading.Event()
    results: list[object] = []

    async def hold(release: asyncio.Event) -> str:
        started.set()
        await release.wait()
        return "held"

    async def make_event() -> asyncio.Event:
        return asyncio.Event()

    release = runner.run(make_event)
    t = threading.Thread(target=lambda: results.append(runner.run(hold, release)))
    t.start()
    started.wait()
    ran = []

    async def never() -> None:
        ran.append(True)

    with pytest.raises(TimeoutError, match="busy"):
        runner.run(never, timeout=0.02)
    runner.loop.call_soon_threadsafe(release.set)
    t.join()
    assert results == ["held"] and ran == []


def test_a_call_that_suspends_runs_what_its_last_step_scheduled(runner: Runner) -> None:
    # The loop stops in the turn a suspended call ends, unless callbacks are ready: those
    # still run before the call returns (a closed transport's callbacks, for one).
    seen: list[str] = []

    async def body() -> int:
        await asyncio.sleep(0)
        asyncio.get_running_loop().call_soon(seen.append, "callback")
        return 7

    assert runner.run(body) == 7
    assert seen == ["callback"]
    assert asyncio._get_running_loop() is None and not runner.loop.is_running()

    async def stops_its_loop() -> None:  # as run_until_complete: the call fails
        asyncio.get_running_loop().stop()
        await asyncio.sleep(0.05)

    with pytest.raises(RuntimeError, match="stopped before"):
        runner.run(stops_its_loop)
    assert runner.run(_add, 2, 3) == 5  # the loop is still consistent


def test_a_call_cancelled_before_its_first_step_ends(runner: Runner) -> None:
    # A task cancelled before its coroutine started never runs the coroutine's cleanup:
    # its done callback stops the loop instead (no hang).
    loop = runner.loop
    runner._call = call = _add(1)
    task = loop.create_task(runner._stopping(call))
    task.cancel()
    with runner._lock, pytest.raises(asyncio.CancelledError):
        runner._drive(task)
    assert runner.run(_add, 2, 3) == 5
