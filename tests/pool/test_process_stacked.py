"""The process backend's stacked whole-batch path: a whole batch's inputs and results cross
the shared-memory blocks as one tensor per leaf, and a random-action rollout overlaps its
steps (banks of blocks taken in turn). Everything here is checked for exact equality against the
coroutine backend (same seeds, same torch random stream), partial resets inside a batch,
faults in the middle of a stacked step or rollout included."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import cloudpickle
import pytest
import torch
from _support.process import Recorder
from tensordict import TensorDict, TensorDictBase

from aenv import EnvBase, EnvStepError, PoolError, StepTimeoutError, WorkerCrashedError
from aenv.envs._utils import EnvMetaData
from aenv.pool import AsyncEnvPool
from aenv.pool._process_bell import Bell
from aenv.pool._process_worker import SLOT, _Runtime
from aenv.pool._shm import (
    BANKS,
    StackedBlocks,
    make_region,
    map_blocks,
    map_region,
    map_slots,
    plan_layout,
)
from aenv.specs import Composite, OneHot, Unbounded
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(90)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class WalkEnv(EnvBase):
    """A random walk driven by its one-hot action, with noise from its own generator (the
    torch global stream stays the parent's), done after ``limit`` steps from the start.
    ``fail_at`` raises on that step (counted since the env was built), ``hang_at`` blocks
    the worker on it unless file ``marker`` exists (writing it first: a rebuilt env does
    not hang again), ``extra_at`` adds an entry no slot holds (the result goes back
    pickled)."""

    def __init__(
        self,
        limit: int = 3,
        fail_at: int = -1,
        hang_at: int = -1,
        extra_at: int = -1,
        marker: str = "",
    ) -> None:
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((2,)))
        self.action_spec = OneHot(2)
        self.reward_spec = Unbounded((1,))
        self.limit = limit
        self.fail_at, self.hang_at, self.extra_at = fail_at, hang_at, extra_at
        self.marker = marker
        self.gen = torch.Generator().manual_seed(0)
        self.pos = 0.0
        self.t = 0
        self.total = 0

    def _set_seed(self, seed: int | None) -> None:
        self.gen.manual_seed(seed or 0)

    def _obs(self) -> torch.Tensor:
        return torch.tensor([self.pos, float(torch.rand((), generator=self.gen))])

    def _reset(self, td: TensorDictBase | None, **kw: Any) -> TensorDictBase:
        self.pos, self.t = 0.0, 0
        return TensorDict({"observation": self._obs()}, [])

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        if self.total == self.fail_at:
            raise ValueError(f"walk failed at step {self.total}")
        if self.total == self.hang_at and not Path(self.marker).exists():
            Path(self.marker).write_text("hanging")
            time.sleep(3600)
        move = 1.0 if bool(td["action"][1]) else -1.0
        self.pos += move
        self.t += 1
        self.total += 1
        out = TensorDict(
            {
                "observation": self._obs(),
                "reward": torch.tensor([move]),
                "done": torch.tensor([self.t >= self.limit]),
            },
            [],
        )
        if self.total == self.extra_at:
            out["extra"] = torch.ones(1)
        return out


class AsyncWalkEnv(WalkEnv):
    """The same walk with async methods: the worker runs its steps as tasks (a hang waits
    on the worker's loop, which goes on serving the other envs)."""

    async def _reset(self, td: TensorDictBase | None, **kw: Any) -> TensorDictBase:  # type: ignore[override]
        return super()._reset(td, **kw)

    async def _step(self, td: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        if self.total == self.hang_at and not Path(self.marker).exists():
            Path(self.marker).write_text("hanging")
            await anyio.sleep_forever()
        return super()._step(td)


class InputWalkEnv(WalkEnv):
    """The walk, its position read from its input's observation (as a stateless env would
    read it): a step given a stale observation walks from the wrong place."""

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        self.pos = float(td["observation"][0])
        return super()._step(td)


LIMITS = (1, 2, 3, 5)  # four envs that end their episodes at different steps


class SlowWalkEnv(WalkEnv):
    """The walk, each step keeping the CPU busy a few milliseconds: the parent has the next
    chained step armed before the step ends, so the workers ring it."""

    def __init__(self, work: float = 0.004, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.work = work

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        end = time.perf_counter() + self.work
        while time.perf_counter() < end:
            continue
        return super()._step(td)


def walk_pool(backend: str, env_cls: type = WalkEnv, **kwargs: Any) -> AsyncEnvPool:
    options: dict[str, Any] = {}
    if backend == "process":
        options = {"num_workers": 2, "start_method": "forkserver"}
    per_env = kwargs.pop("per_env", {})
    limit_all = kwargs.pop("limit_all", None)
    fns = [
        partial(env_cls, limit=limit_all or lim, **per_env.get(i, {}))
        for i, lim in enumerate(LIMITS)
    ]
    return AsyncEnvPool(fns, backend=backend, backend_options=options, **kwargs)


def assert_same(a: TensorDictBase, b: TensorDictBase) -> None:
    keys = sorted(a.keys(True, True), key=str)
    assert keys == sorted(b.keys(True, True), key=str)
    assert a.batch_size == b.batch_size
    for key in keys:
        x, y = a.get(key), b.get(key)
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x, y), key


class Launches(list[int]):
    """The banks of the stacked calls sent, in order; ``chained``: the positions of those
    sent by the backend itself, chained to the call before (``launch(..., after=call)``);
    ``by_workers``: how many of those the workers rang themselves."""

    def __init__(self) -> None:
        super().__init__()
        self.chained: list[int] = []
        self.by_workers = 0


def spy_launches(monkeypatch: pytest.MonkeyPatch) -> Launches:
    """Every stacked call sent by any process pool from now on (see :class:`Launches`)."""
    from aenv.pool._process import ProcessBackend

    banks = Launches()
    send = ProcessBackend._send_stacked

    def spy(self: Any, batch: Any, step_timeout: float | None, carry: Any = None) -> Any:
        if batch.after is not None:
            banks.chained.append(len(banks))
        banks.append(batch.bank)
        return send(self, batch, step_timeout, carry)

    settle = ProcessBackend._settle

    def spy_settle(self: Any, batch: Any) -> bool:
        rung = settle(self, batch)
        if rung:  # (a chained call the workers rang: in flight as if sent)
            banks.chained.append(len(banks))
            banks.by_workers += 1
            banks.append(batch.bank)
        return rung

    monkeypatch.setattr(ProcessBackend, "_send_stacked", spy)
    monkeypatch.setattr(ProcessBackend, "_settle", spy_settle)
    return banks


async def until(condition: Any) -> None:
    """Let the loop run until ``condition()`` holds (bounded by a deadline, not a guess)."""
    with anyio.fail_after(20):
        while not condition():
            await asyncio.sleep(0.001)


# ---------------------------------------------------------------------- equality
async def _smr_steps(backend: str, env_cls: type, n: int = 12) -> list[TensorDictBase]:
    async with walk_pool(backend, env_cls) as pool:
        await pool.set_seed(7)
        torch.manual_seed(0)
        td = await pool.reset()
        seen = []
        for _ in range(n):
            out, td = await pool.step_and_maybe_reset(pool.rand_action(td))
            seen += [out.clone(), td.clone()]
        return seen


@pytest.mark.parametrize("env_cls", [WalkEnv, AsyncWalkEnv], ids=["sync", "async"])
async def test_stacked_step_and_maybe_reset_equals_the_coroutine_backend(env_cls, monkeypatch):
    expected = await _smr_steps("coroutine", env_cls)
    launches = spy_launches(monkeypatch)
    got = await _smr_steps("process", env_cls)
    assert launches == [0] * 12  # every step went through the blocks
    for a, b in zip(expected, got, strict=True):
        assert_same(a, b)
    # partial resets inside a batch: at some step only some envs were done and reset
    dones = [s["next", "done"].squeeze(-1) for s in expected[::2]]
    assert any(d.any() and not d.all() for d in dones)
    nexts = expected[1::2]
    for step, nxt in zip(expected[::2], nexts):
        done = step["next", "done"].squeeze(-1)
        # a reset env restarts at 0; the others carry their step's observation on
        assert (nxt["observation"][done, 0] == 0).all()
        assert torch.equal(nxt["observation"][~done], step["next", "observation"][~done])
        assert not nxt["done"].any()


async def _rollouts(backend: str, spy: list[Any] | None = None, **kwargs: Any) -> list[Any]:
    async with walk_pool(backend, **kwargs) as pool:
        if spy is not None:
            spy.append(pool)
        await pool.set_seed(3)
        torch.manual_seed(1)
        out = [await pool.rollout(9, break_when_any_done=False)]
        out.append(await pool.rollout(1, break_when_any_done=False))
        out.append(await pool.rollout(7))  # stops at the first done: whole-batch steps
        td = await pool.reset()
        out.append(
            await pool.rollout(6, break_when_any_done=False, auto_reset=False, tensordict=td)
        )
        out.append(torch.rand(4))  # the random stream was drawn from exactly as often
        return out


async def test_overlapped_rollout_equals_the_coroutine_backend(monkeypatch):
    expected = await _rollouts("coroutine")
    banks = spy_launches(monkeypatch)
    got = await _rollouts("process")
    for a, b in zip(expected[:-1], got[:-1], strict=True):
        assert_same(a, b)
        assert a.names == b.names
    assert torch.equal(expected[-1], got[-1])
    # the 9 steps take the banks in turn, the single step uses bank 0; the others follow
    assert banks[:10] == [k % BANKS for k in range(9)] + [0]
    # each of the 9 steps after the first was sent by the backend as the step before it
    # came back whole, before the rollout resumed
    assert banks.chained[:8] == list(range(1, 9))


async def test_a_long_overlapped_rollout_equals_the_coroutine_backend(monkeypatch):
    """Past the first chunks of random draws (16, then 32 steps): the step after a chunk
    is not sent ahead, so it reads its input row, where the resets kept aside by the steps
    before (partial ones: the envs end their episodes at different steps) are put in
    first; the rest are put in at the end."""

    async def run(backend: str) -> TensorDictBase:
        async with walk_pool(backend, InputWalkEnv) as pool:
            await pool.set_seed(3)
            torch.manual_seed(1)
            return await pool.rollout(60, break_when_any_done=False)

    expected = await run("coroutine")
    banks = spy_launches(monkeypatch)
    got = await run("process")
    assert_same(expected, got)
    assert len(banks.chained) < len(banks) - 1  # (some steps were not sent ahead)
    done = expected["next", "done"].squeeze(-1)
    assert (done.any(0) & ~done.all(0)).any()  # partial resets


class CompositeWalkEnv(WalkEnv):
    """A walk with its own ``step_and_maybe_reset``: it counts its calls, and the worker's
    inline batch path must go through it rather than around it."""

    calls = 0

    async def step_and_maybe_reset(self, td: TensorDictBase) -> Any:  # type: ignore[override]
        self.calls += 1
        return await super().step_and_maybe_reset(td)


async def test_stacked_batches_honour_a_custom_step_and_maybe_reset():
    async with walk_pool("process", CompositeWalkEnv) as pool:
        td = await pool.reset()
        for _ in range(3):
            _, td = await pool.step_and_maybe_reset(pool.rand_action(td))
        assert await pool.get_attr("calls") == [3, 3, 3, 3]


async def test_pickled_results_inside_a_stacked_rollout():
    # env 2's fourth step carries an entry no slot holds: it comes back pickled, the
    # others through the blocks, and the rollout goes on, stacked again afterwards
    per_env = {2: {"extra_at": 4}}
    expected = await _rollouts("coroutine", per_env=per_env)
    got = await _rollouts("process", per_env=per_env)
    for a, b in zip(expected[:-1], got[:-1], strict=True):
        assert_same(a, b)
    assert torch.equal(expected[-1], got[-1])


# ---------------------------------------------------------------------- faults
async def _failing_rollout(
    backend: str, env_cls: type = WalkEnv, per_env: dict[int, Any] | None = None
) -> tuple[PoolError, list[int], torch.Tensor]:
    per_env = per_env or {1: {"fail_at": 5}}
    async with walk_pool(backend, env_cls, per_env=per_env) as pool:
        await pool.set_seed(0)
        torch.manual_seed(2)
        with pytest.raises(PoolError) as info:
            await pool.rollout(12, break_when_any_done=False)
        totals = await pool.get_attr("total")
        return info.value, totals, torch.rand(4)


async def test_env_error_in_an_overlapped_rollout_matches_the_coroutine_backend():
    err_c, totals_c, rand_c = await _failing_rollout("coroutine")
    err_p, totals_p, rand_p = await _failing_rollout("process")
    assert sorted(err_p.errors) == sorted(err_c.errors) == [1]
    e = err_p.errors[1]
    assert isinstance(e, EnvStepError) and e.remote_type == "ValueError"
    assert "walk failed at step 5" in str(e) and "in _step" in e.remote_traceback
    assert sorted(err_p.results) == [0, 2, 3]
    for i in (0, 2, 3):
        assert_same(err_c.results[i][0], err_p.results[i][0])
    # no env took a step more than in the generic loop, and the action drawn ahead for the
    # step that never came was given back to the random stream
    assert totals_p == totals_c == [6, 5, 6, 6]
    assert torch.equal(rand_p, rand_c)


@pytest.mark.parametrize("per_env", [{}, {2: {"extra_at": 4}}], ids=["rows", "pickled"])
async def test_the_workers_ring_the_chained_steps_of_an_overlapped_rollout(monkeypatch, per_env):
    # steps of a few ms: the parent arms each chained step before the step before ends,
    # and the last worker of that step rings it; the rollout is the plain loop's (also
    # where a chained step the workers rang answers pickled, over the socket)
    expected = await _rollouts("coroutine", env_cls=SlowWalkEnv, per_env=per_env)
    banks = spy_launches(monkeypatch)
    got = await _rollouts("process", env_cls=SlowWalkEnv, per_env=per_env)
    for a, b in zip(expected[:-1], got[:-1], strict=True):
        assert_same(a, b)
    assert torch.equal(expected[-1], got[-1])
    if not per_env:
        assert banks[:10] == [k % BANKS for k in range(9)] + [0]
    assert banks.by_workers >= 1


async def test_a_failed_share_leaves_the_other_workers_envs_where_the_plain_loop_does(
    monkeypatch,
):
    # env 1 (worker 0) fails at its sixth step while the seventh is armed: worker 0, whose
    # envs take no time, answered over the socket long before worker 1 finished its share,
    # and worker 1, the last, does not ring the seventh step, so its envs do not take it
    per_env = {0: {"work": 0.0}, 1: {"fail_at": 5, "work": 0.0}}
    err_c, totals_c, rand_c = await _failing_rollout("coroutine", SlowWalkEnv, per_env)
    banks = spy_launches(monkeypatch)
    err_p, totals_p, rand_p = await _failing_rollout("process", SlowWalkEnv, per_env)
    assert sorted(err_p.errors) == sorted(err_c.errors) == [1]
    assert totals_p == totals_c == [6, 5, 6, 6]
    assert torch.equal(rand_p, rand_c)
    assert banks.by_workers >= 1


async def test_a_chained_step_answered_over_the_socket_before_the_step_before_was_taken(
    monkeypatch,
):
    # worker 1 (envs 2, 3: 50 ms a step each) is the last of the first step and rings the
    # second; worker 0 answers its share of the second over the socket (env 1 fails) before
    # the parent takes the first: the parent, not woken for the first here, takes its
    # answers from the pages then, and the failure counts for the second
    from aenv.pool._backend import Failure
    from aenv.pool._process import ProcessBackend

    dropped = []
    on_done = ProcessBackend._on_done

    def drop_armed_wake(self: Any) -> None:
        if self._armed:
            dropped.extend(batch.seq for batch in self._armed.values())
            self._tally.take()  # (woken, and nothing taken from the pages)
            return
        on_done(self)

    monkeypatch.setattr(ProcessBackend, "_on_done", drop_armed_wake)
    per_env = {0: {"work": 0.05}, 1: {"fail_at": 1, "work": 0.0}}
    async with walk_pool(
        "process", SlowWalkEnv, per_env={**per_env, 2: {"work": 0.05}, 3: {"work": 0.05}}
    ) as pool:
        td = pool.rand_action(await pool.reset())
        backend = pool._backend
        first = backend.launch("step", td, None, bank=0)  # type: ignore[attr-defined]
        second = backend.launch("step", td, None, bank=1, after=first)  # type: ignore[attr-defined]
        assert second.armed
        with anyio.fail_after(20):
            assert not isinstance(await first.wait(), list)
            out = await second.wait()
        assert dropped == [second.seq] and second.sent
        assert isinstance(out, list) and isinstance(out[1], Failure)
        assert "walk failed at step 1" in str(out[1].exc)
        assert await pool.get_attr("total") == [2, 1, 2, 2]


async def test_answers_of_steps_rung_ahead_wait_for_the_step_before_to_be_whole(monkeypatch):
    # the parent takes worker 1's answers of the steps the workers rang one after another
    # while worker 0's are not taken yet (as when it read worker 0's page just before
    # worker 0 answered): each step's answers wait until the step before it is whole here,
    # none is lost
    async with walk_pool("process", SlowWalkEnv) as pool:
        td = pool.rand_action(await pool.reset())
        backend: Any = pool._backend
        bell0 = backend._workers[0].bell
        take_done = bell0.take_done
        held = [True]
        monkeypatch.setattr(bell0, "take_done", lambda: None if held[0] else take_done())
        calls = [backend.launch("step", td, None, bank=0)]
        for bank in range(1, BANKS):
            calls.append(backend.launch("step", td, None, bank=bank, after=calls[-1]))
        assert all(call.armed for call in calls[1:])
        last = calls[-1].seq
        bell1 = backend._workers[1].bell
        await until(lambda: bell0.answered() == last and bell1.taken == last)
        assert not calls[0].sent or calls[0].left  # (worker 0's share not taken)
        held[0] = False
        backend._take_answers()  # (as the next wake-up would)
        with anyio.fail_after(10):
            for call in calls:
                assert not isinstance(await call.wait(), list)
        assert await pool.get_attr("total") == [BANKS] * 4


async def test_a_rollout_given_up_leaves_no_chained_step_behind(monkeypatch):
    # given up while the workers ring its chained steps: the step armed is taken back, or,
    # rung already, given up with its envs; after it, a step moves every env by one
    async with walk_pool("process", SlowWalkEnv) as pool:
        await pool.reset()
        banks = spy_launches(monkeypatch)
        for k in range(3):
            task = asyncio.ensure_future(pool.rollout(100, break_when_any_done=False))
            await until(lambda k=k: banks.by_workers > k)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # nothing is left armed: no token a worker could take to ring a step
            backend = pool._backend
            assert not backend._armed  # type: ignore[attr-defined]
            assert not select.select(backend._tally.chain_fds, [], [], 0)[0]  # type: ignore[attr-defined]
            before = await pool.get_attr("total")
            await pool.rollout(1, break_when_any_done=False)
            assert await pool.get_attr("total") == [n + 1 for n in before]


def spy_depth(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of chained calls armed after each arming, from now on."""
    from aenv.pool._process import ProcessBackend

    depths: list[int] = []
    arm = ProcessBackend._arm

    def spy(self: Any, after: Any, batch: Any) -> None:
        arm(self, after, batch)
        depths.append(len(self._armed))

    monkeypatch.setattr(ProcessBackend, "_arm", spy)
    return depths


def assert_nothing_armed(pool: AsyncEnvPool) -> None:
    """No chained call armed: no token a worker could take to ring one, on any bank."""
    backend = pool._backend
    assert not backend._armed  # type: ignore[attr-defined]
    assert not select.select(backend._tally.chain_fds, [], [], 0)[0]  # type: ignore[attr-defined]


async def test_a_failed_step_with_the_steps_after_it_armed_runs_none_of_them(monkeypatch):
    # steps of a few ms: when env 1 fails its sixth step, the steps after it are armed
    # on the other banks (the parent arms BANKS - 1 ahead): none is rung, none is left
    # armed, and the envs are where the plain loop leaves them
    per_env = {1: {"fail_at": 5}}

    async def run(backend: str) -> tuple[list[int], torch.Tensor]:
        async with walk_pool(backend, SlowWalkEnv, per_env=per_env) as pool:
            await pool.set_seed(0)
            torch.manual_seed(2)
            with pytest.raises(PoolError) as info:
                await pool.rollout(12, break_when_any_done=False)
            assert sorted(info.value.errors) == [1]
            if backend == "process":
                assert_nothing_armed(pool)
            return await pool.get_attr("total"), torch.rand(4)

    totals_c, rand_c = await run("coroutine")
    depths = spy_depth(monkeypatch)
    totals_p, rand_p = await run("process")
    assert max(depths) == BANKS - 1
    assert totals_p == totals_c == [6, 5, 6, 6]
    assert torch.equal(rand_p, rand_c)


async def test_a_rollout_cancelled_with_every_bank_armed_leaves_nothing_armed(monkeypatch):
    # cancelled while BANKS - 1 steps are armed ahead of the step in flight: each is
    # taken back (or, rung already, given up with its envs); after it, a step moves every
    # env by one
    async with walk_pool("process", SlowWalkEnv) as pool:
        await pool.reset()
        backend = pool._backend
        for _ in range(3):
            task = asyncio.ensure_future(pool.rollout(100, break_when_any_done=False))
            await until(lambda: len(backend._armed) == BANKS - 1)  # type: ignore[attr-defined]
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert_nothing_armed(pool)
            before = await pool.get_attr("total")
            await pool.rollout(1, break_when_any_done=False)
            assert await pool.get_attr("total") == [n + 1 for n in before]


async def test_a_worker_killed_while_the_workers_ring_the_chained_steps(monkeypatch):
    # a chained step armed or rung when a worker dies: taken back, or failed with the dead
    # worker's envs; the rollout fails with the crash, and the pool goes on (its workers
    # ring no more: the one started again has a go counter the others do not hold)
    async with walk_pool("process", SlowWalkEnv) as pool:
        await pool.reset()
        banks = spy_launches(monkeypatch)
        task = asyncio.ensure_future(pool.rollout(200, break_when_any_done=False))
        await until(lambda: banks.by_workers > 1)
        backend = pool._backend
        os.kill(backend._workers[1].pid, signal.SIGKILL)  # type: ignore[attr-defined]
        with anyio.fail_after(20), pytest.raises(PoolError) as info:
            await task
        assert any(isinstance(e, WorkerCrashedError) for e in info.value.errors.values())
        assert not backend._armed and not backend._peer_rings  # type: ignore[attr-defined]
        await pool.reset()
        rung = banks.by_workers
        out = await pool.rollout(5, break_when_any_done=False)
        assert out.batch_size == (4, 5) and banks.by_workers == rung


async def test_worker_crash_in_a_stacked_step_and_maybe_reset(tmp_path):
    marker = tmp_path / "hang"
    per_env = {1: {"hang_at": 2, "marker": str(marker)}}
    async with walk_pool("process", per_env=per_env) as pool:
        td = await pool.reset()
        for _ in range(2):
            _, td = await pool.step_and_maybe_reset(pool.rand_action(td))
        victim = pool._backend._of_env[1].pid
        task = asyncio.ensure_future(pool.step_and_maybe_reset(pool.rand_action(td)))
        await until(marker.exists)  # env 1 blocks its worker in the middle of the batch
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(PoolError) as info:
            await task
        errors = info.value.errors
        assert sorted(errors) == [0, 1]  # the crashed worker's envs
        assert all(isinstance(e, WorkerCrashedError) for e in errors.values())
        assert errors[1].signal == signal.SIGKILL
        # the other worker's envs answered: their step and their resets came back
        assert sorted(info.value.results) == [2, 3]
        nxt, _ = info.value.results[2]
        assert nxt["observation"][0].item() in (-1.0, 1.0, 3.0, -3.0)
        # respawned: the lost envs need a reset; a rollout (which resets) works again
        with pytest.raises(PoolError) as again:
            await pool.step_and_maybe_reset(pool.rand_action(td))
        assert sorted(again.value.errors) == [0, 1]
        assert "needs a reset" in str(again.value.errors[0])
        out = await pool.rollout(5, break_when_any_done=False)
        assert out.batch_size == (4, 5)
        assert victim not in pool.worker_pids


async def test_worker_crash_in_an_overlapped_rollout(tmp_path):
    marker = tmp_path / "hang"
    per_env = {3: {"hang_at": 4, "marker": str(marker)}}
    async with walk_pool("process", per_env=per_env) as pool:
        victim = pool._backend._of_env[3].pid
        task = asyncio.ensure_future(pool.rollout(10, break_when_any_done=False))
        await until(marker.exists)
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(PoolError) as info:
            await task
        assert sorted(info.value.errors) == [2, 3]
        assert all(isinstance(e, WorkerCrashedError) for e in info.value.errors.values())
        assert sorted(info.value.results) == [0, 1]
        # the other worker's envs stepped exactly as far as the failed step
        assert await pool.get_attr("total", env_indices=[0, 1]) == [5, 5]
        # a rollout from a given input does not reset: the lost envs are refused, as in
        # the generic loop (the stacked path steps aside)
        td = TensorDict(
            {
                "observation": torch.zeros(4, 2),
                "done": torch.zeros(4, 1, dtype=torch.bool),
                "terminated": torch.zeros(4, 1, dtype=torch.bool),
            },
            [4],
        )
        with pytest.raises(PoolError) as lost:
            await pool.rollout(3, break_when_any_done=False, auto_reset=False, tensordict=td)
        assert sorted(lost.value.errors) == [2, 3]
        out = await pool.rollout(4, break_when_any_done=False)
        assert out.batch_size == (4, 4)


async def test_step_timeout_in_an_overlapped_rollout(tmp_path):
    per_env = {1: {"hang_at": 3, "marker": str(tmp_path / "hang")}}
    async with walk_pool("process", AsyncWalkEnv, per_env=per_env, step_timeout=0.5) as pool:
        with pytest.raises(PoolError) as info:
            await pool.rollout(10, break_when_any_done=False)
        assert sorted(info.value.errors) == [1]
        assert isinstance(info.value.errors[1], StepTimeoutError)
        # env 0 shares the hung env's worker: its result was streamed back in time
        assert sorted(info.value.results) == [0, 2, 3]
        # the worker cancelled the hung step and rebuilt env 1: after a reset, the pool
        # works again, in the same worker
        pids = pool.worker_pids
        out = await pool.rollout(3, break_when_any_done=False)
        assert pool.worker_pids == pids
        assert out.batch_size == (4, 3)


async def test_cancelled_overlapped_rollout_leaves_the_pool_usable(monkeypatch):
    async with walk_pool("process", AsyncWalkEnv) as pool:
        banks = spy_launches(monkeypatch)
        task = asyncio.ensure_future(pool.rollout(100_000, break_when_any_done=False))
        await until(lambda: len(banks) > 20)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert all(t is None for t in pool._tickets)
        assert all(b is None for b in pool._backend._batch_of)
        out = await pool.rollout(3, break_when_any_done=False)
        assert out.batch_size == (4, 3)


async def test_a_rollout_cancelled_as_its_next_step_goes_out_gives_that_step_up(monkeypatch):
    # the rollout is cancelled right as the backend sends the next step for it (the step
    # before came back whole, the rollout has not resumed yet): that step (and any sent
    # after it before the rollout resumes) is given up with the rollout, nothing stays in
    # flight
    from aenv.pool._process import ProcessBackend

    async with walk_pool("process") as pool:
        backend: Any = pool._backend
        send_chained = ProcessBackend._send_chained
        sent: list[Any] = []

        def spy(self: Any, after: Any, batch: Any, step_timeout: float | None) -> None:
            send_chained(self, after, batch, step_timeout)
            sent.append(batch)
            if len(sent) == 5:
                task.cancel()

        monkeypatch.setattr(ProcessBackend, "_send_chained", spy)
        task = asyncio.ensure_future(pool.rollout(100, break_when_any_done=False))
        with pytest.raises(asyncio.CancelledError):
            await task
        # (the steps the workers ran ahead, taken on the same wake-up, go out with it)
        assert len(sent) >= 5 and sent[4].sent
        assert all(b is None for b in backend._batch_of)
        assert all(t is None for t in pool._tickets)
        await until(lambda: not backend._fences)
        out = await pool.rollout(3, break_when_any_done=False)
        assert out.batch_size == (4, 3)


# ---------------------------------------------------------------------- building blocks
def _metas(n: int, **kwargs: Any) -> dict[int, EnvMetaData]:
    return {i: EnvMetaData.metadata_from_env(CountingEnv(**kwargs)) for i in range(n)}


def _mapped(size: int) -> torch.Tensor:
    fd = make_region(size)
    try:
        return map_region(fd, size)
    finally:
        os.close(fd)


def test_stacked_blocks_need_consecutive_like_envs():
    _, groups, size = plan_layout(_metas(4))
    flat = _mapped(size)
    (group,) = groups
    blocks = map_blocks(flat, group)
    assert StackedBlocks.plan([(blocks, 0, 4)]) is not None
    assert StackedBlocks.plan([(blocks, 1, 5)]) is None  # not from env 0
    assert StackedBlocks.plan([(blocks, 0, 3)]) is None  # rows and envs disagree
    _, other_groups, other_size = plan_layout(_metas(4, batch_size=(2,)))
    other = map_blocks(_mapped(other_size), other_groups[0])
    assert StackedBlocks.plan([(blocks, 0, 4), (other, 4, 8)]) is None  # unlike envs
    stacked = StackedBlocks.plan([(blocks, 0, 4), (map_blocks(flat, group), 4, 8)])
    assert stacked is not None and stacked.n == 8
    # inputs: the right leaves only, of the right dtype and shape (a "_step" mask is the
    # pool's: which envs step is the launch's indices)
    good = TensorDict({"action": torch.ones(8, 1, dtype=torch.int64)}, [8])
    assert stacked.write_inputs(good)
    assert not stacked.write_inputs(TensorDict({"action": torch.ones(8, 1)}, [8]))
    assert stacked.write_inputs(good.clone().set("_step", torch.ones(8, dtype=torch.bool)))
    assert not stacked.write_inputs(TensorDict({}, [8]))


async def test_worker_batches_use_the_bank_they_name():
    envs = {0: CountingEnv(max_steps=9), 1: CountingEnv(max_steps=9)}
    metas = {i: EnvMetaData.metadata_from_env(e) for i, e in envs.items()}
    layouts, _, bank_size = plan_layout(metas)
    flat = _mapped(BANKS * bank_size)
    banks = [{i: map_slots(flat[b * bank_size :], layouts[i]) for i in envs} for b in range(BANKS)]

    chan = Recorder()
    rt = _Runtime(chan, envs, {}, banks[0], banks)  # type: ignore[arg-type]
    rt.loop = asyncio.get_running_loop()
    for env in envs.values():
        await env.reset()
    for b in range(BANKS):
        for i in envs:
            banks[b][i]["in"].td["action"].fill_(1)  # type: ignore[index]
    rt._handle_frames([[("batch", 1, "step", [(0, None), (1, None)], False, 1)]])
    rt._handle_frames([[("batch", 2, "step", [(0, None), (1, None)], False)]])
    assert [(m[0], m[1], [(i, c) for i, c, _ in m[2]]) for m in chan.sent] == [
        ("b", 1, [(0, SLOT), (1, SLOT)]),
        ("b", 2, [(0, SLOT), (1, SLOT)]),
    ]
    for i in envs:
        assert banks[1][i]["next"].read()["observation"].item() == 1  # type: ignore[index]
        assert banks[0][i]["next"].read()["observation"].item() == 2  # type: ignore[index]


async def test_a_cancelled_step_keeps_its_input_until_the_worker_lets_go():
    # Worker 0 is stopped, so the step it was sent has not read its envs' inputs when the
    # step is cancelled and the next one is sent: that next step's inputs must not land in
    # the slots the cancelled step is still to read (they go pickled until the worker
    # acknowledges the cancel), or envs 0 and 1 would take the second action twice.
    async with walk_pool("process", limit_all=100) as pool:
        td = await pool.reset()
        backend: Any = pool._backend
        right, left = td.clone(), td.clone()
        right["action"] = torch.tensor([[False, True]] * 4)
        left["action"] = torch.tensor([[True, False]] * 4)
        worker0 = pool.worker_pids[0]
        os.kill(worker0, signal.SIGSTOP)
        try:
            first = asyncio.ensure_future(pool.step(right))

            def worker1_done() -> bool:
                # (rung, worker 1's answer waits in its page: only the call's last worker
                # wakes the parent)
                inflight, bell = backend._inflight[0], backend._workers[1].bell
                return inflight is not None and (
                    backend._batch_of[3] is None
                    or (bell is not None and bell.answered() == inflight[0])
                )

            await until(worker1_done)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            second = asyncio.ensure_future(pool.step(left))
            await until(lambda: backend._batch_of[0] is not None)  # sent (worker 0 stopped)
        finally:
            os.kill(worker0, signal.SIGCONT)
        out = await second
        # envs 2 and 3 took both steps. Envs 0 and 1 took the second one with its own
        # action; the first was rung on worker 0's doorbell, and the worker (stopped) read
        # the cancels on its socket before it took that call, so its envs sat it out
        # (without a doorbell it went as a frame, which the worker runs before the cancel)
        skipped = -1.0 if Bell.available() else 0.0
        assert out["next", "observation"][:, 0].tolist() == [skipped, skipped, 0.0, 0.0]
        assert await pool.get_attr("pos") == [skipped, skipped, 0.0, 0.0]
        # the acknowledgements came back: the next step goes through the slots again
        await until(lambda: not backend._fences)
        out = await pool.step(right)
        assert out["next", "observation"][:, 0].tolist() == [skipped + 1, skipped + 1, 1.0, 1.0]
