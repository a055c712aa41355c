"""Limiter: concurrency and rate caps, shared across threads' loops, no leaked slot."""

from __future__ import annotations

import asyncio
import pickle
import threading

import anyio
import pytest

from aenv.llm import Limiter


async def test_caps_concurrency_first_come_first_served():
    lim = Limiter(3)
    order, running, peak = [], 0, 0

    async def job(i):
        nonlocal running, peak
        async with lim.slot():
            running += 1
            peak = max(peak, running)
            order.append(i)
            await asyncio.sleep(0.005)
            running -= 1

    await asyncio.gather(*(job(i) for i in range(20)))
    assert peak == 3 == lim.peak and lim.active == 0 and order == list(range(20))


@pytest.mark.parametrize("when", range(6))
async def test_cancelled_waiters_never_leak_a_slot(when):
    """Cancel waiters at different points, including right after a slot was handed over."""
    lim = Limiter(2)
    holders = [asyncio.Event() for _ in range(2)]

    async def hold(ev):
        async with lim.slot():
            await ev.wait()

    async def wait_one():
        async with lim.slot():
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(hold(ev)) for ev in holders]
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(wait_one()) for _ in range(4)]
    await asyncio.sleep(0)
    assert lim.waiting == 4
    holders[0].set()  # a slot passes to waiter 0 (scheduled, not yet taken)
    for _ in range(when):
        await asyncio.sleep(0)
    waiters[0].cancel()
    waiters[2].cancel()
    holders[1].set()
    await asyncio.gather(*tasks)
    await asyncio.gather(*waiters, return_exceptions=True)
    assert lim.active == 0 and lim.waiting == 0
    # and the full capacity is there
    async with lim.slot(), lim.slot():
        assert lim.active == 2


async def test_rate_spaces_starts(monkeypatch):
    """Each acquirer is given a start 1 / rate after the previous one (a frozen clock and
    recorded sleeps: the schedule itself, not how punctually the loop keeps it)."""
    import aenv.llm._limiter as mod

    lim = Limiter(rate_per_s=200)
    monkeypatch.setattr(mod.time, "monotonic", lambda: 100.0)
    delays = []

    async def fake_sleep(seconds):
        delays.append(round(seconds, 9))

    monkeypatch.setattr(mod.asyncio, "sleep", fake_sleep)
    for _ in range(5):
        async with lim.slot():
            pass
    assert delays == [0.005, 0.01, 0.015, 0.02]  # the first starts at once


def test_shared_by_loops_of_several_threads():
    lim = Limiter(2)
    running, peak = 0, 0
    guard = threading.Lock()

    async def job():
        nonlocal running, peak
        async with lim.slot():
            with guard:
                running += 1
                peak = max(peak, running)
            await asyncio.sleep(0.002)
            with guard:
                running -= 1

    def thread_main():
        async def many():
            await asyncio.gather(*(job() for _ in range(10)))

        asyncio.run(many())

    threads = [threading.Thread(target=thread_main) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert peak == 2 and lim.active == 0


async def test_named_registry_and_pickling():
    a = Limiter.named("test-limiter-registry", 3)
    assert Limiter.named("test-limiter-registry") is a
    with pytest.raises(ValueError, match="exists with max_concurrent=3"):
        Limiter.named("test-limiter-registry", 5)
    assert pickle.loads(pickle.dumps(a)) is a  # in this process: the same limiter
    anon = pickle.loads(pickle.dumps(Limiter(4, 10.0)))
    assert (anon.max_concurrent, anon.rate_per_s, anon.active) == (4, 10.0, 0)
    with pytest.raises(ValueError, match="max_concurrent"):
        Limiter(0)


async def test_cancel_during_rate_wait_gives_the_slot_back():
    lim = Limiter(1, rate_per_s=0.5)
    async with lim.slot():
        pass
    with anyio.move_on_after(0.05):
        await lim.acquire()  # waits ~2 s for its rate turn: cancelled meanwhile
    assert lim.active == 0
