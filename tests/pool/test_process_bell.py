"""The process backend's doorbell (:mod:`aenv.pool._process_bell`): a stacked step's go and
done signals, one wake-up of the parent per call (the tally), what falls back to the
socket, and a fresh doorbell after a respawn."""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from aenv import PoolError, WorkerCrashedError
from aenv.pool import ProcessorAsyncEnvPool
from aenv.pool._process_bell import (
    _RUNG,
    _SEQ,
    CARRY_NEXT,
    CARRY_RESET,
    STEP_BITS,
    STEPS,
    Bell,
    Tally,
)
from aenv.pool._shm import BANKS
from aenv.testing import CountingEnv

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not Bell.available(), reason="the doorbell needs Linux (eventfd, memfd)"),
]


def counting_pool(**kwargs: Any) -> ProcessorAsyncEnvPool:
    return ProcessorAsyncEnvPool(
        [partial(CountingEnv, max_steps=1000) for _ in range(4)],
        num_workers=2,
        start_method="forkserver",
        **kwargs,
    )


class Rings:
    """Counts the calls rung on each worker's doorbell and the batch frames sent."""

    def __init__(self, pool: ProcessorAsyncEnvPool, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rung: list[tuple[int, int, str]] = []  # (worker, seq, op)
        self.frames = 0
        self.wakes = 0  # the parent's wake-ups by the tally
        tally = pool._backend._tally  # type: ignore[attr-defined]
        take = tally.take

        def spy_take() -> None:
            self.wakes += 1
            take()

        monkeypatch.setattr(tally, "take", spy_take)
        self.by_workers = 0  # chained calls the workers rang (the parent's disarm failed)
        disarm = tally.disarm

        def spy_disarm(bank: int, alive: Any = None) -> bool:
            armed = disarm(bank, alive)
            self.by_workers += not armed
            return armed

        monkeypatch.setattr(tally, "disarm", spy_disarm)
        for w in pool._backend._workers:  # type: ignore[attr-defined]
            ring, send = w.bell.ring, w.chan.send

            def spy_ring(seq: int, op: str, bank: int, steps: Any, w: Any = w, ring: Any = ring):
                self.rung.append((w.wid, seq, op))
                ring(seq, op, bank, steps)

            def spy_send(frame: Any, send: Any = send) -> None:
                self.frames += sum(1 for cmd in frame if cmd[0] == "batch")
                send(frame)

            monkeypatch.setattr(w.bell, "ring", spy_ring)
            monkeypatch.setattr(w.chan, "send", spy_send)


def rang(tally: Tally) -> bool:
    """Whether the tally's done counter was rung (the parent's loop would wake)."""
    return bool(select.select([tally.done_fd], [], [], 0)[0])


def test_a_call_is_taken_once_and_answered_once():
    tally = Tally()
    parent = Bell(3, tally=tally)
    worker = Bell(3, [os.dup(fd) for fd in parent.fds])
    try:
        assert worker.take_go() is None  # nothing rung yet
        assert worker.sent() == 0
        parent.note_sent(3)  # frames written to the worker's socket so far
        assert worker.sent() == 3
        flags = bytes([STEPS | CARRY_NEXT, 0, STEPS | CARRY_RESET])
        parent.ring(5, "step_and_maybe_reset", 1, flags)
        assert worker.take_go() == (5, "step_and_maybe_reset", 1, flags)
        assert flags.translate(STEP_BITS) == b"\x01\x00\x01"  # which envs step
        assert worker.take_go() is None  # taken
        parent.ring(6, "step", 0, None)
        parent.ring(7, "step", 0, None)
        assert worker.take_go() == (7, "step", 0, b"\x01\x01\x01")  # the latest call
        assert worker.take_go() is None
        assert parent.take_done() is None
        tally.arm(1)
        worker.answer(7, b"\x01\x02\x00")
        assert rang(tally)  # the only worker of the call is its last
        tally.take()
        assert not rang(tally)
        assert parent.take_done() == (7, b"\x01\x02\x00")
        assert parent.take_done() is None  # taken
    finally:
        worker.close()
        parent.close()
    assert parent.closed and worker.closed
    with pytest.raises(OSError):
        os.fstat(parent.go_fd)
    assert not tally.closed  # (the pool's: closed with the pool)
    os.fstat(tally.done_fd)
    tally.close()
    with pytest.raises(OSError):
        os.fstat(tally.done_fd)


def test_only_the_last_worker_of_a_call_rings():
    tally = Tally()
    parents = [Bell(1, tally=tally) for _ in range(3)]
    workers = [Bell(1, [os.dup(fd) for fd in p.fds]) for p in parents]
    try:
        tally.arm(3)
        workers[2].answer(1, b"\x01")
        workers[0].answer(1, b"\x01")
        assert not rang(tally)  # one still works
        assert [p.take_done() for p in parents[::2]] == [(1, b"\x01")] * 2
        workers[1].answer(1, b"\x02")
        assert rang(tally)
        tally.take()
        # a call given up with one answer in: its tokens left are taken back when the next
        # call is rung, which rings once its own two workers are done
        tally.arm(3)
        workers[0].answer(2, b"\x01")
        tally.arm(2)
        workers[1].answer(3, b"\x01")
        assert not rang(tally)
        workers[2].answer(3, b"\x01")
        assert rang(tally)
        tally.take()
        # a rung worker died: the parent takes its token, so the other one rings
        tally.arm(2)
        tally.stand_in()
        workers[0].answer(4, b"\x01")
        assert rang(tally)
    finally:
        for bell in (*workers, *parents):
            bell.close()
        tally.close()


def test_a_call_all_its_workers_answered_leaves_no_token():
    # what lets the parent skip taking tokens back when it rings the next call
    tally = Tally()
    parents = [Bell(1, tally=tally) for _ in range(2)]
    workers = [Bell(1, [os.dup(fd) for fd in p.fds]) for p in parents]
    try:
        for seq in (1, 2, 3):
            tally.arm(2, drained=seq > 1)
            workers[seq % 2].answer(seq, b"\x01")
            assert not rang(tally)  # one still works
            workers[1 - seq % 2].answer(seq, b"\x02")
            assert rang(tally)
            tally.take()
            assert [p.take_done()[0] for p in parents] == [seq, seq]  # type: ignore[index]
            with pytest.raises(BlockingIOError):
                os.eventfd_read(tally.tokens_fd)  # no token left
        # a call given up with one answer in leaves a token: not drained, it is taken back
        tally.arm(2)
        workers[0].answer(4, b"\x01")
        tally.arm(2, drained=False)
        workers[0].answer(5, b"\x01")
        assert not rang(tally)
        workers[1].answer(5, b"\x01")
        assert rang(tally)
    finally:
        for bell in (*workers, *parents):
            bell.close()
        tally.close()


async def test_stacked_steps_ring_and_others_use_the_socket(monkeypatch):
    async with counting_pool() as pool:
        rings = Rings(pool, monkeypatch)
        td = await pool.reset()
        assert rings.frames == 2 and not rings.rung  # a reset is a batch frame per worker
        for k in range(3):
            out, td = await pool.step_and_maybe_reset(pool.rand_action(td))
            assert out["next", "observation"].squeeze(-1).tolist() == [k + 1] * 4
        assert rings.frames == 2
        assert [(w, op) for w, _, op in rings.rung] == [
            (0, "step_and_maybe_reset"),
            (1, "step_and_maybe_reset"),
        ] * 3
        # a rollout (consecutive calls chained from the reply handler) rings too
        rings.rung.clear()
        out = await pool.rollout(4, break_when_any_done=False, auto_reset=False, tensordict=td)
        assert out["next", "observation"][:, -1].squeeze(-1).tolist() == [7] * 4
        # (the parent rings a chained call the workers did not ring: armed too late)
        assert len(rings.rung) + 2 * rings.by_workers == 8 and rings.frames == 2
        # the parent was woken at most once per call, by the last of its two workers
        assert 3 + 1 <= rings.wakes <= 3 + 4


async def test_a_step_timeout_streams_the_batch_through_the_socket(monkeypatch):
    async with counting_pool(step_timeout=30.0) as pool:
        rings = Rings(pool, monkeypatch)
        td = await pool.reset()
        out, td = await pool.step_and_maybe_reset(pool.rand_action(td))
        assert out["next", "observation"].squeeze(-1).tolist() == [1] * 4
        # streamed (each env's outcome as it finishes, for the timeout): frames, no ring
        assert not rings.rung and rings.frames == 4


async def test_a_respawned_worker_gets_a_fresh_doorbell():
    async with counting_pool() as pool:
        backend: Any = pool._backend
        td = await pool.reset()
        _, td = await pool.step_and_maybe_reset(pool.rand_action(td))
        old = backend._workers[0].bell
        victim = backend._workers[0].pid
        os.kill(victim, signal.SIGKILL)
        # rung on the dead worker's doorbell before the parent saw the death: its envs fail
        with pytest.raises(PoolError) as info:
            await pool.step_and_maybe_reset(pool.rand_action(td))
        assert sorted(info.value.errors) == [0, 1]
        assert all(isinstance(e, WorkerCrashedError) for e in info.value.errors.values())
        assert old.closed
        td = await pool.reset()  # (waits for the respawned worker)
        assert victim not in pool.worker_pids
        new = backend._workers[0].bell
        assert new is not None and new is not old and not new.closed
        out, td = await pool.step_and_maybe_reset(pool.rand_action(td))
        assert out["next", "observation"].squeeze(-1).tolist() == [1] * 4
        assert new.taken > 0  # answered through the new doorbell


async def test_a_lockstep_collector_over_processes_rings(monkeypatch):
    from aenv.collectors import Collector

    pool = counting_pool()
    rings = Rings(pool, monkeypatch)
    async with Collector(
        pool, None, frames_per_batch=12, total_frames=24, streaming=False
    ) as collector:
        batches = [batch async for batch in collector]
    assert [b.batch_size for b in batches] == [(4, 3), (4, 3)]
    # CountingEnv's observation counts its steps: 6 steps of every env, in order
    counts = [b["next", "observation"].squeeze(-1) for b in batches]
    assert counts[0][:, -1].tolist() == [3] * 4 and counts[1][:, -1].tolist() == [6] * 4
    # each step a ring per worker (by the parent, or by the workers for a chained call);
    # only the reset went as frames
    assert len(rings.rung) + 2 * rings.by_workers == 12 and rings.frames == 2


# ---------------------------------------------------------------------- chained calls
def linked(workers: int, n: int = 2) -> tuple[Tally, list[Bell], list[Bell]]:
    """A tally and ``workers`` doorbells of ``n`` envs each, parent and worker sides, each
    worker given every worker's go counter (as a pool gives them at start)."""
    tally = Tally()
    tally.set_workers(workers)
    parents = [Bell(n, tally=tally) for _ in range(workers)]
    sides = [Bell(n, [os.dup(fd) for fd in p.fds]) for p in parents]
    for wid, side in enumerate(sides):
        side.link(wid, [os.dup(p.go_fd) for p in parents])
    return tally, parents, sides


def close_all(tally: Tally, *bells: Bell) -> None:
    for bell in bells:
        bell.close()
    tally.close()


def run_call(tally: Tally, parents: list[Bell], sides: list[Bell], seq: int, bank: int) -> None:
    """Ring call ``seq`` on every worker (the parent's ring) and let each take it."""
    tally.arm(len(parents))
    for parent, side in zip(parents, sides):
        parent.ring(seq, "step_and_maybe_reset", bank, None)
        assert side.take_go() == (seq, "step_and_maybe_reset", bank, bytes([STEPS]) * 2)


def arm_chained(tally: Tally, parents: list[Bell], after: int, seq: int, bank: int) -> None:
    for parent in parents:
        parent.arm(seq, "step_and_maybe_reset", bank, True)
    tally.arm_chain(bank, after, seq)


@contextlib.contextmanager
def chained(workers: int) -> Iterator[tuple[Tally, list[Bell], list[Bell]]]:
    """:func:`linked` doorbells with call 1 rung on bank 0 and call 2 armed after it on
    bank 1 (carrying), all closed afterwards."""
    tally, parents, sides = linked(workers)
    try:
        run_call(tally, parents, sides, 1, 0)
        arm_chained(tally, parents, 1, 2, 1)
        yield tally, parents, sides
    finally:
        close_all(tally, *parents, *sides)


def test_the_last_worker_rings_the_chained_call_armed():
    with chained(2) as (tally, parents, sides):
        sides[0].answer(1, b"\x01\x02", 0)  # (its env 1 was reset)
        assert not rang(tally) and sides[1].take_go() is None  # one still works
        sides[1].answer(1, b"\x01\x01", 0)
        # the last one rang call 2 on both workers (itself too), then woke the parent
        carry = STEPS | CARRY_NEXT
        assert sides[0].take_go() == (
            2,
            "step_and_maybe_reset",
            1,
            bytes([carry, STEPS | CARRY_RESET]),
        )
        assert sides[1].take_go() == (2, "step_and_maybe_reset", 1, bytes([carry, carry]))
        assert rang(tally)
        assert not tally.disarm(1)  # (a worker took it: the parent records it as sent)
        tally.take()
        assert [p.take_done() for p in parents] == [(1, b"\x01\x02"), (1, b"\x01\x01")]
        # call 2 is answered on bank 1's area: a worker may answer it before the parent
        # took call 1's answers, and the last of its two workers wakes the parent again
        sides[0].answer(2, b"\x01\x01", 1)
        assert not rang(tally)
        sides[1].answer(2, b"\x02\x01", 1)
        assert rang(tally)
        assert parents[1].take_done() == (2, b"\x02\x01")


def test_a_worker_answers_the_chained_call_before_the_parent_took_the_first():
    with chained(1) as (_, parents, sides):
        sides[0].answer(1, b"\x01\x01", 0)
        assert sides[0].take_go() is not None
        sides[0].answer(2, b"\x02\x01", 1)
        # both answers are kept, the oldest taken first
        assert parents[0].take_done() == (1, b"\x01\x01")
        assert parents[0].take_done() == (2, b"\x02\x01")
        assert parents[0].take_done() is None


@pytest.mark.parametrize("how", ["over the socket", "env left out"])
def test_a_call_not_answered_whole_by_every_worker_rings_nothing(how):
    with chained(2) as (tally, _, sides):
        if how == "env left out":
            sides[0].answer(1, b"\x01\x00", 0)  # (an env cancelled out of the call)
        else:
            sides[0].finished()  # (answered with a "b" frame over the socket)
        sides[1].answer(1, b"\x01\x01", 0)
        assert rang(tally)  # the parent is woken, as for any call
        assert sides[0].take_go() is None and sides[1].take_go() is None
        assert tally.disarm(1)  # still armed: the parent takes it back


def test_a_disarmed_chained_call_is_never_rung():
    with chained(2) as (tally, parents, sides):
        assert tally.disarm(1)  # (the parent gave call 1 up, or it failed)
        sides[0].answer(1, b"\x01\x01", 0)
        sides[1].answer(1, b"\x01\x01", 0)
        assert sides[0].take_go() is None and sides[1].take_go() is None
        # a call armed after another call is not rung by this one's last worker
        run_call(tally, parents, sides, 3, 0)
        arm_chained(tally, parents, 5, 6, 1)
        sides[0].answer(3, b"\x01\x01", 0)
        sides[1].answer(3, b"\x01\x01", 0)
        assert sides[0].take_go() is None and sides[1].take_go() is None
        assert tally.disarm(1)


def test_the_workers_ring_a_chain_of_armed_calls_one_bank_after_another():
    # calls 2 .. BANKS armed ahead, each after the one before on the next bank: the workers
    # run them all back to back with no ring of the parent, each carrying from the bank
    # before its own (where the call before reset an env: from its "reset" row); the
    # parent is woken only once the call rung has fewer than two calls armed after it
    # (from call BANKS - 2 on: it arms more while the workers run the rest, or takes the
    # last)
    tally, parents, sides = linked(2)
    try:
        run_call(tally, parents, sides, 1, 0)
        for seq in range(2, BANKS + 1):
            arm_chained(tally, parents, seq - 1, seq, seq - 1)
        carry = STEPS | CARRY_NEXT
        for seq in range(1, BANKS + 1):
            bank = seq - 1
            sides[0].answer(seq, b"\x01\x01", bank)
            sides[1].answer(seq, b"\x02\x01", bank)  # (its first env reset)
            assert rang(tally) == (seq >= BANKS - 2)
            if seq < BANKS:
                assert sides[0].take_go() == (
                    seq + 1,
                    "step_and_maybe_reset",
                    seq,
                    bytes([carry]) * 2,
                )
                assert sides[1].take_go() == (
                    seq + 1,
                    "step_and_maybe_reset",
                    seq,
                    bytes([STEPS | CARRY_RESET, carry]),
                )
        assert sides[0].take_go() is None  # (nothing armed past the last)
        # one wake-up of the parent takes every call, oldest first; the workers took
        # every chained call's token (the parent records each as sent)
        tally.take()
        assert [parents[1].take_done() for _ in range(BANKS)] == [
            (seq, b"\x02\x01") for seq in range(1, BANKS + 1)
        ]
        assert parents[1].take_done() is None
        assert not any(tally.disarm(bank) for bank in range(1, BANKS))
    finally:
        close_all(tally, *parents, *sides)


def test_answers_on_the_banks_are_taken_oldest_first_across_the_wrap():
    # the banks go round: a call on the last bank is older than the next one on bank 0
    tally, parents, sides = linked(1)
    try:
        last = BANKS - 1
        sides[0].answer(7, b"\x01\x01", last)
        sides[0].answer(8, b"\x02\x01", 0)
        assert parents[0].take_done() == (7, b"\x01\x01")
        assert parents[0].take_done() == (8, b"\x02\x01")
        assert parents[0].take_done() is None
    finally:
        close_all(tally, *parents, *sides)


def test_a_stalled_last_worker_hands_back_the_token_of_a_call_armed_since():
    # the last worker of call 1 sees call 2 armed after it, then stalls before it takes
    # the chain's token; meanwhile the parent takes call 2 back (call 1 given up) and
    # arms call 4 after call 3 on the same bank. The token the worker then takes is call
    # 4's: it must not ring call 4 (call 3 is not whole), and hands the token back
    with chained(2) as (tally, parents, sides):
        stalled = sides[1].chain_fds[1]
        real_read = os.eventfd_read
        armed_since = []

        def read(fd: int) -> int:
            if fd == stalled and not armed_since:
                assert tally.disarm(1)  # (the parent takes call 2 back)
                arm_chained(tally, parents, 3, 4, 1)
                armed_since.append(4)
            return real_read(fd)

        sides[0].answer(1, b"\x01\x01", 0)
        os.eventfd_read = read  # type: ignore[assignment]
        try:
            sides[1].answer(1, b"\x01\x01", 0)
        finally:
            os.eventfd_read = real_read
        assert armed_since == [4]
        assert sides[0].take_go() is None and sides[1].take_go() is None
        assert rang(tally)  # (the parent is woken for call 1, as for any call)
        assert tally.disarm(1)  # call 4 is still the parent's: it was never rung


@pytest.mark.parametrize("worker", ["rings", "hands back", "dies"])
def test_the_parent_waits_for_a_worker_holding_the_chain_token(worker):
    # a worker took call 2's token and has not yet marked it rung (or handed it back):
    # the parent's disarm waits for the one or the other instead of guessing; ``alive``,
    # which it asks while it waits, is where the worker finishes here
    with chained(2) as (tally, _, sides):
        os.eventfd_read(sides[1].chain_fds[1])  # (the worker's take)
        asked = []

        def alive() -> bool:
            asked.append(1)
            if worker == "rings":
                # (what the worker writes once it owns the ring: call 2 rung on bank 1)
                _SEQ.pack_into(tally.page, _RUNG + 8, 2)
            elif worker == "hands back":
                os.eventfd_write(sides[1].chain_fds[1], 1)
            return worker != "dies"

        taken_back = tally.disarm(1, alive)
        assert asked  # it waited
        # rung by the worker, or dead with the token: not the parent's to ring; handed
        # back: the parent's
        assert taken_back is (worker == "hands back")
