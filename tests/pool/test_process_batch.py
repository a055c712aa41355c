"""The process backend's whole-batch path (``launch`` with per-env payloads): one command
and one reply per worker per batch, partial masks, faults inside a batch, fallbacks to pickled data."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import sys
from functools import partial
from typing import Any

import anyio
import cloudpickle
import pytest
import torch
from _support.process import HANG_ASYNC, HANG_BLOCKING, NORMAL, ControlledEnv, Recorder, actions
from tensordict import NonTensorData

from aenv import EnvBase, EnvStepError, PoolError, StepTimeoutError, WorkerCrashedError
from aenv.pool import ProcessorAsyncEnvPool
from aenv.pool import _codec as codec
from aenv.pool._process_worker import PICKLED, SLOT, _Runtime
from aenv.testing import CountingEnv, DynamicSpecEnv, FailingEnv, LatencyEnv, TextEnv

pytestmark = pytest.mark.timeout(60)
cloudpickle.register_pickle_by_value(sys.modules[__name__])
FORKSERVER = {"start_method": "forkserver"}


class Traffic:
    """Records the frames the parent sends to its workers and the messages it receives,
    and the calls rung and answered on the workers' doorbells."""

    def __init__(self, pool: ProcessorAsyncEnvPool, monkeypatch: pytest.MonkeyPatch) -> None:
        backend = pool._backend
        self.sent: list[list[tuple[Any, ...]]] = []
        self.received: list[tuple[Any, ...]] = []
        self.rung: list[tuple[int, str, Any]] = []  # (worker, op, steps)
        self.answered: list[tuple[int, bytes]] = []  # (worker, outcome bytes)
        for w in backend._workers:  # type: ignore[attr-defined]
            send = w.chan.send

            def spy_send(frame: Any, send: Any = send) -> None:
                self.sent.append(frame)
                send(frame)

            monkeypatch.setattr(w.chan, "send", spy_send)
            if w.bell is None:
                continue
            ring, take_done = w.bell.ring, w.bell.take_done

            def spy_ring(seq: int, op: str, bank: int, steps: Any, w: Any = w, ring: Any = ring):
                self.rung.append((w.wid, op, steps))
                ring(seq, op, bank, steps)

            def spy_done(w: Any = w, take_done: Any = take_done) -> Any:
                done = take_done()
                if done is not None:
                    self.answered.append((w.wid, bytes(done[1])))
                return done

            monkeypatch.setattr(w.bell, "ring", spy_ring)
            monkeypatch.setattr(w.bell, "take_done", spy_done)
        on_message = backend._on_message  # type: ignore[attr-defined]

        def spy_message(w: Any, msg: tuple[Any, ...]) -> None:
            self.received.append(msg)
            on_message(w, msg)

        monkeypatch.setattr(backend, "_on_message", spy_message)

    def clear(self) -> None:
        self.sent.clear()
        self.received.clear()
        self.rung.clear()
        self.answered.clear()


async def until(condition: Any) -> None:
    """Let the loop run until ``condition()`` holds (bounded by a deadline, not a guess)."""
    with anyio.fail_after(10):
        while not condition():
            await asyncio.sleep(0.001)


def counting_pool(n: int = 6, **kwargs: Any) -> ProcessorAsyncEnvPool:
    return ProcessorAsyncEnvPool(
        [partial(CountingEnv, max_steps=1000) for _ in range(n)],
        num_workers=2,
        **FORKSERVER,
        **kwargs,
    )


async def test_one_command_and_one_reply_per_worker(monkeypatch):
    async with counting_pool() as pool:
        traffic = Traffic(pool, monkeypatch)
        for call in ("reset", "step", "step_and_maybe_reset"):
            traffic.clear()
            if call == "reset":
                td = await pool.reset()
                assert td["observation"].squeeze(-1).tolist() == [0] * 6
            elif call == "step":
                out = await pool.step(pool.rand_action(td))
                assert out["next", "observation"].squeeze(-1).tolist() == [1] * 6
                td = pool.step_mdp(out)
            else:
                out, td = await pool.step_and_maybe_reset(pool.rand_action(td))
                assert out["next", "observation"].squeeze(-1).tolist() == [2] * 6
                assert td["observation"].squeeze(-1).tolist() == [2] * 6
            if call != "reset" and sys.platform.startswith("linux"):
                # a stacked step: one ring of each worker's doorbell, one answer back, no
                # frame either way (inputs and results are in the shared-memory rows)
                assert traffic.sent == [] and traffic.received == [], call
                assert traffic.rung == [(0, call, None), (1, call, None)]
                assert sorted(w for w, _ in traffic.answered) == [0, 1]
                # every env answered in the rows (1), none reset (2: CountingEnv is not done)
                assert all(o == b"\x01\x01\x01" for _, o in traffic.answered)
                continue
            # one frame per worker, each one batch command for its three envs
            assert len(traffic.sent) == 2, call
            for frame, envs in zip(traffic.sent, ([0, 1, 2], [3, 4, 5])):
                ((kind, _, op, items, stream),) = frame
                assert (kind, op, stream) == ("batch", call, False)
                assert [i for i, _ in items] == envs
                assert all(data is None for _, data in items)  # inputs are in the slots
            # one reply per worker, every result in the shared-memory blocks
            replies = [m for m in traffic.received if m[0] == "b"]
            assert len(replies) == 2 and len(traffic.received) == 2
            assert sorted(i for m in replies for i, _, _ in m[2]) == list(range(6))
            assert all(code == SLOT for m in replies for _, code, _ in m[2])


async def test_partial_step_and_reset_masks():
    async with counting_pool() as pool:
        td = await pool.reset()
        # rows 0 and 2 of worker 0, rows 0 and 2 of worker 1: not consecutive
        td["_step"] = torch.tensor([True, False, True, True, False, True])
        out = await pool.step(pool.rand_action(td))
        assert out["next", "observation"].squeeze(-1).tolist() == [1, 0, 1, 1, 0, 1]
        # consecutive rows of one worker only
        td = pool.step_mdp(out)
        td["_step"] = torch.tensor([True, True, False, False, False, False])
        out = await pool.step(pool.rand_action(td))
        assert out["next", "observation"].squeeze(-1).tolist() == [2, 1, 1, 1, 0, 1]
        assert [int(c) for c in await pool.get_attr("count")] == [2, 1, 1, 1, 0, 1]
        # a partial reset across both workers; the others keep their state
        td = pool.step_mdp(out)
        td["_reset"] = torch.tensor([[False], [True], [False], [True], [True], [False]])
        reset = await pool.reset(td)
        assert reset["observation"].squeeze(-1).tolist() == [2, 0, 1, 0, 0, 1]
        assert [int(c) for c in await pool.get_attr("count")] == [2, 0, 1, 0, 0, 1]
        # a whole batch after the partial ones
        out = await pool.rand_step(reset)
        assert out["next", "observation"].squeeze(-1).tolist() == [3, 1, 2, 1, 1, 2]


async def test_step_and_maybe_reset_resets_done_envs_in_the_batch():
    limits = [1, 2, 3, 1, 2, 3]
    async with ProcessorAsyncEnvPool(
        [partial(CountingEnv, max_steps=m) for m in limits], num_workers=2, **FORKSERVER
    ) as pool:
        td = await pool.reset()
        seen, nexts = [], []
        for _ in range(3):
            out, td = await pool.step_and_maybe_reset(pool.rand_action(td))
            seen.append(out["next", "observation"].squeeze(-1).tolist())
            nexts.append(td["observation"].squeeze(-1).tolist())
        assert seen == [[1, 1, 1, 1, 1, 1], [1, 2, 2, 1, 2, 2], [1, 1, 3, 1, 1, 3]]
        assert nexts == [[0, 1, 1, 0, 1, 1], [0, 0, 2, 0, 0, 2], [0, 1, 0, 0, 1, 0]]
        assert not td["done"].any()


async def test_raising_env_in_a_batch_keeps_the_others():
    fns = [partial(CountingEnv, max_steps=1000) for _ in range(4)]
    fns[1] = partial(FailingEnv, fail_after=1, exc_type=KeyError, message="bad key")
    async with ProcessorAsyncEnvPool(fns, num_workers=2, **FORKSERVER) as pool:
        td = pool.step_mdp(await pool.rand_step(await pool.reset()))
        with pytest.raises(PoolError) as info:
            await pool.rand_step(td)
        assert sorted(info.value.errors) == [1]
        err = info.value.errors[1]
        assert isinstance(err, EnvStepError) and not isinstance(err, WorkerCrashedError)
        assert err.env_index == 1 and err.remote_type == "KeyError"
        assert "bad key" in str(err) and "raise self.exc_type" in err.remote_traceback
        # env 0 shares env 1's worker: its result came back with the failure
        assert sorted(info.value.results) == [0, 2, 3]
        assert [info.value.results[i]["observation"].item() for i in (0, 2, 3)] == [2, 2, 2]
        # the pool stays usable: the healthy envs step on, the failing one is reported again
        td["_step"] = torch.tensor([True, False, True, True])
        out = await pool.rand_step(td)
        assert out["next", "observation"].squeeze(-1).tolist() == [3, 1, 3, 3]
        assert await pool.get_attr("fail_after", env_indices=[1]) == [1]


@pytest.mark.parametrize("hang", [HANG_ASYNC, HANG_BLOCKING], ids=["async", "blocking"])
async def test_sigkill_during_a_batch_fails_its_envs(hang):
    async with ProcessorAsyncEnvPool(
        (4, ControlledEnv), num_workers=2, **FORKSERVER
    ) as pool:  # no step_timeout: only the crash can end the batch
        await pool.reset()
        backend = pool._backend
        victim = backend._of_env[0].pid  # type: ignore[attr-defined]
        task = asyncio.ensure_future(pool.step(actions(NORMAL, hang, NORMAL, NORMAL)))
        await until(lambda: backend._batch_of[0] is not None)  # type: ignore[attr-defined]
        # worker 1 answered for envs 2 and 3; worker 0 is stuck on env 1
        await until(lambda: backend._batch_of[2] is None and backend._batch_of[3] is None)  # type: ignore[attr-defined]
        assert backend._batch_of[0] is not None and not task.done()  # type: ignore[attr-defined]
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(PoolError) as info:
            await task
        errors = info.value.errors
        assert sorted(errors) == [0, 1]
        assert all(isinstance(e, WorkerCrashedError) for e in errors.values())
        assert errors[1].signal == signal.SIGKILL and errors[1].env_index == 1
        assert [info.value.results[i]["observation"].item() for i in (2, 3)] == [1, 1]
        # respawned: a reset, then a whole batch works again
        await pool.reset()
        assert victim not in pool.worker_pids
        out = await pool.step(actions(NORMAL, NORMAL, NORMAL, NORMAL))
        assert out["next", "observation"].squeeze(-1).tolist() == [1, 1, 1, 1]


async def test_step_timeout_in_a_batch_keeps_finished_siblings(monkeypatch):
    async with ProcessorAsyncEnvPool(
        (4, ControlledEnv),
        num_workers=2,
        step_timeout=0.5,
        backend_options={"replace_timeout": 1.0, **FORKSERVER},
    ) as pool:
        traffic = Traffic(pool, monkeypatch)
        await pool.reset()
        pid = pool.worker_pids[0]
        with pytest.raises(PoolError) as info:
            await pool.step(actions(NORMAL, HANG_ASYNC, NORMAL, NORMAL))
        assert sorted(info.value.errors) == [1]
        assert isinstance(info.value.errors[1], StepTimeoutError)
        # env 0 finished on the hung env's worker: streamed back before the deadline
        assert sorted(info.value.results) == [0, 2, 3]
        assert any(cmd[0] == "batch" and cmd[4] for frame in traffic.sent for cmd in frame)
        # the worker answered the give-up: kept, env 1 rebuilt
        await pool.reset()
        assert pool.worker_pids[0] == pid
        out = await pool.step(actions(NORMAL, NORMAL, NORMAL, NORMAL))
        assert out["next", "observation"].squeeze(-1).tolist() == [1, 1, 1, 1]


async def test_cancelled_batch_stops_the_work_in_the_worker():
    async with ProcessorAsyncEnvPool((4, ControlledEnv), num_workers=2, **FORKSERVER) as pool:
        await pool.reset()
        pids = pool.worker_pids
        backend = pool._backend
        task = asyncio.ensure_future(pool.step(actions(NORMAL, HANG_ASYNC, NORMAL, NORMAL)))
        await until(lambda: backend._batch_of[1] is not None)  # type: ignore[attr-defined]
        await until(lambda: backend._batch_of[3] is None)  # type: ignore[attr-defined]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert all(b is None for b in backend._batch_of)  # type: ignore[attr-defined]
        # the hung step was cancelled in the worker: env 1 takes its next step at once
        out = await pool.step(actions(NORMAL, NORMAL, NORMAL, NORMAL))
        obs = out["next", "observation"].squeeze(-1).tolist()
        # env 0 shares env 1's worker and its result is held there behind env 1's: the
        # cancel may reach its step before or after it ran (1 or 2), on a loaded machine
        assert obs[1:] == [1, 2, 2] and obs[0] in (1, 2)
        assert pool.worker_pids == pids


async def test_non_tensor_and_dynamic_envs_go_pickled_in_batches(monkeypatch):
    async with ProcessorAsyncEnvPool(
        [partial(TextEnv, prompt=f"p{i}") for i in range(2)],
        num_workers=1,
        stack="lazy",
        **FORKSERVER,
    ) as pool:
        traffic = Traffic(pool, monkeypatch)
        td = await pool.reset()
        td["action"] = [NonTensorData("hi"), NonTensorData("there")]
        out, _ = await pool.step_and_maybe_reset(td)
        assert [out[i]["next", "history"] for i in range(2)] == ["p0 hi", "p1 there"]
        ((kind, _, op, items, _),) = traffic.sent[-1]
        assert (kind, op) == ("batch", "step_and_maybe_reset")
        assert all(isinstance(data, bytes) for _, data in items)
        (reply,) = [m for m in traffic.received if m[0] == "b"][-1:]
        assert [code for _, code, _ in reply[2]] == [PICKLED, PICKLED]
    async with ProcessorAsyncEnvPool(
        (2, partial(DynamicSpecEnv, max_count=3)), num_workers=1, stack="lazy", **FORKSERVER
    ) as pool:
        td = await pool.rollout(5, break_when_any_done=False, return_contiguous=False)
        shapes = [td[0, t]["next", "observation"].shape[1] for t in range(5)]
        assert shapes == [2, 3, 4, 2, 3]  # done at 3, reset in the batch: it starts over


# ---------------------------------------------------------------------- the worker side
def _runtime(chan: Recorder) -> _Runtime:
    envs: dict[int, EnvBase] = {0: LatencyEnv(latency=0.05), 1: CountingEnv(max_steps=9)}
    return _Runtime(chan, envs, {}, {0: None, 1: None})  # type: ignore[arg-type]


async def _steps(rt: _Runtime) -> list[tuple[int, bytes]]:
    items = []
    for i, env in rt.envs.items():
        items.append((i, pickle.dumps(env.rand_action(await env.reset()))))
    return items


async def test_worker_batch_replies_once_without_a_cancelled_env():
    chan = Recorder()
    rt = _runtime(chan)
    rt.loop = asyncio.get_running_loop()
    items = await _steps(rt)
    # env 0 (async) is cancelled before it ran; env 1 ran inline: one reply, env 1 only
    rt._handle_frames([[("batch", 7, "step", items, False), ("cancel", 0, 7)]])
    ((kind, seq, entries),) = chan.sent
    assert (kind, seq) == ("b", 7) and [(i, code) for i, code, _ in entries] == [(1, PICKLED)]
    assert codec.loads(entries[0][2])["observation"].item() == 1
    with anyio.fail_after(10):  # the cancelled task's bookkeeping runs in later loop turns
        while rt.tasks:
            await asyncio.sleep(0)
    assert rt.task_batch == {}


async def test_worker_batch_waits_for_async_envs_unless_streaming():
    for stream in (False, True):
        chan = Recorder()
        rt = _runtime(chan)
        rt.loop = asyncio.get_running_loop()
        items = await _steps(rt)
        rt._handle_frames([[("batch", 3, "step", items, stream)]])
        # env 1 is done at once; it goes out alone only when the parent asked for streaming
        assert [m[2][0][0] for m in chan.sent] == ([1] if stream else [])
        with anyio.fail_after(10):
            while sum(len(m[2]) for m in chan.sent) < 2:
                chan.arrived.clear()
                await chan.arrived.wait()
        assert [[i for i, _, _ in m[2]] for m in chan.sent] == ([[1], [0]] if stream else [[1, 0]])
        assert all(code == PICKLED for m in chan.sent for _, code, _ in m[2])
