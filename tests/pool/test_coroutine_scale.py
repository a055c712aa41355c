"""The coroutine backend at scale: one worker per env, input rows for streamed steps, and
what a step in flight keeps alive (the objects the cyclic garbage collector walks)."""

from __future__ import annotations

import asyncio
import gc
from functools import partial
from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.pool import AsyncEnvPool
from aenv.specs import Categorical, Composite, Unbounded
from aenv.testing import LatencyEnv

pytestmark = pytest.mark.timeout(60)


class RecordingEnv(EnvBase):
    """Async env recording the input it got each step (the input itself, held so that its
    identity stays its own, and its action);
    ``scribble`` makes it replace its input's action and add an entry, as an env may."""

    def __init__(self, scribble: bool = False) -> None:
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((2,)))
        self.action_spec = Unbounded((2,))
        self.full_done_spec = Composite(
            done=Categorical(2, (1,), dtype=torch.bool),
            terminated=Categorical(2, (1,), dtype=torch.bool),
        )
        self.scribble = scribble
        self.seen: list[tuple[TensorDictBase, torch.Tensor]] = []
        self.gate: asyncio.Event | None = None

    def _set_seed(self, seed: int | None) -> None:
        pass

    async def _reset(self, td: Any, **kwargs: Any) -> TensorDictBase:
        return TensorDict(observation=torch.zeros(2))

    async def _step(self, td: TensorDictBase) -> TensorDictBase:
        if self.gate is not None:
            await self.gate.wait()
        action = td["action"]
        self.seen.append((td, action.clone()))
        if self.scribble:
            td.set("action", action * 100)
            td.set("scratch", torch.ones(1))
        return TensorDict(
            observation=action.clone(), reward=torch.ones(1), done=torch.zeros(1, dtype=torch.bool)
        )


def _actions(n: int, base: float) -> TensorDict:
    return TensorDict(
        observation=torch.zeros(n, 2),
        done=torch.zeros(n, 1, dtype=torch.bool),
        terminated=torch.zeros(n, 1, dtype=torch.bool),
        action=torch.arange(2 * n, dtype=torch.float32).reshape(n, 2) + base,
        batch_size=(n,),
    )


async def _until_ready(pool: AsyncEnvPool, count: int) -> None:
    while len(pool._ready["step"]) < count:  # (the pytest timeout bounds this)
        await asyncio.sleep(0)


async def test_one_worker_per_env_for_the_pools_life():
    pool = AsyncEnvPool([partial(LatencyEnv, 0.0) for _ in range(4)])
    try:
        td = await pool.reset()
        tasks = {t for t in asyncio.all_tasks() if not t.done()}
        assert len(tasks - {asyncio.current_task()}) == 4  # the envs' workers, idle
        actions = pool.rand_action(td)
        for _ in range(10):
            pool.async_step_send(actions, env_index=list(range(4)))
            out = await pool.async_step_recv(min_get=4)
            assert sorted(out["env_index"].tolist()) == [0, 1, 2, 3]
            # no task made per step: the same workers, waiting for the next operation
            assert {t for t in asyncio.all_tasks() if not t.done()} == tasks
    finally:
        await pool.aclose()
    assert not [t for t in tasks if not t.done() and t is not asyncio.current_task()]


async def test_a_step_in_flight_holds_few_objects():
    n = 256
    # (gc_freeze=False: frozen objects are left out of gc.get_objects(), which counts here)
    pool = AsyncEnvPool([partial(LatencyEnv, 0.0) for _ in range(n)], gc_freeze=False)
    try:
        actions = pool.rand_action(await pool.reset())
        pool.async_step_send(actions, env_index=list(range(n)))
        await pool.async_step_recv(min_get=n)
        for env in pool._backend.envs:
            env.latency = 60.0
        gc.collect()
        before = len(gc.get_objects())
        pool.async_step_send(actions, env_index=list(range(n)))
        # one pass of the loop: each worker (woken before this task) runs to its timer
        await asyncio.sleep(0)
        gc.collect()
        per_step = (len(gc.get_objects()) - before) / n
        # a task, its context and six coroutine frames per step, and a TensorDict with a
        # view per entry as its input, came to 24; the env's own sleep is about 6 of them
        assert per_step < 12, per_step
    finally:
        await pool.aclose()


async def test_streamed_inputs_come_from_rows_and_back_intact():
    pool = AsyncEnvPool([RecordingEnv for _ in range(3)])
    try:
        await pool.reset()
        envs = pool._backend.envs
        for round_ in range(3):
            sent = _actions(3, 10.0 * round_)
            pool.async_step_send(sent, env_index=[2, 0, 1])
            out = await pool.async_step_recv(min_get=3)
            order = out["env_index"].tolist()
            want = {i: sent["action"][pos] for pos, i in enumerate([2, 0, 1])}
            for k, i in enumerate(order):
                assert torch.equal(out["action"][k], want[i])
                assert torch.equal(out["next", "observation"][k], want[i])
                assert torch.equal(envs[i].seen[-1][1], want[i])
        # each env read the same input object every step (its row, made once)
        for env in envs:
            assert len({id(td) for td, _ in env.seen}) == 1
    finally:
        await pool.aclose()


async def test_an_env_sent_again_before_its_result_is_received():
    pool = AsyncEnvPool([RecordingEnv for _ in range(2)])
    try:
        await pool.reset()
        first = _actions(1, 1.0)
        pool.async_step_send(first, env_index=[0])
        await _until_ready(pool, 1)  # done, not received: the env is free again
        second = _actions(1, 50.0)
        pool.async_step_send(second, env_index=[0])
        await _until_ready(pool, 2)
        out = await pool.async_step_recv(min_get=2)
        assert out["env_index"].tolist() == [0, 0]
        # the first result keeps its own input, not the one sent after it
        assert torch.equal(out["action"][0], first["action"][0])
        assert torch.equal(out["action"][1], second["action"][0])
        assert torch.equal(out["next", "observation"][1], second["action"][0])
    finally:
        await pool.aclose()


async def test_an_env_that_writes_into_its_input_gets_a_fresh_one():
    pool = AsyncEnvPool([partial(RecordingEnv, scribble=True) for _ in range(2)])
    try:
        await pool.reset()
        for base in (0.0, 5.0, 9.0):
            sent = _actions(2, base)
            pool.async_step_send(sent, env_index=[0, 1])
            out = await pool.async_step_recv(min_get=2)
            for k, i in enumerate(out["env_index"].tolist()):
                # the env read what was sent, never its own scribbles of the step before
                assert torch.equal(pool._backend.envs[i].seen[-1][1], sent["action"][i])
                assert torch.equal(out["next", "observation"][k], sent["action"][i])
    finally:
        await pool.aclose()


@pytest.mark.parametrize("scribble", [False, True])
async def test_single_env_sends_fill_its_row(scribble):
    # one env's input (batch size the sub-env's) is copied straight into its row's views
    pool = AsyncEnvPool([partial(RecordingEnv, scribble=scribble) for _ in range(2)])
    try:
        await pool.reset()
        envs = pool._backend.envs
        for base in (0.0, 5.0, 9.0):
            sent = _actions(2, base)
            for i in (1, 0):
                pool.async_step_send(sent[i], env_index=i)
            out = await pool.async_step_recv(min_get=2)
            for k, i in enumerate(out["env_index"].tolist()):
                assert torch.equal(envs[i].seen[-1][1], sent["action"][i])
                # (an env that wrote into its input returns what it wrote, as a bare env)
                want = sent["action"][i] * (100 if scribble else 1)
                assert torch.equal(out["action"][k], want)
                assert torch.equal(out["next", "observation"][k], sent["action"][i])
        for env in envs:
            # the same row every step, unless the env changed it (then a fresh one each time)
            assert len({id(td) for td, _ in env.seen}) == (3 if scribble else 1)
    finally:
        await pool.aclose()


async def test_a_send_that_does_not_fit_the_rows_goes_env_by_env():
    # rows take exactly their dtype and shape: anything else is refused by the copy itself,
    # and the send goes env by env as before (cast where exact, or refused, nothing sent)
    from aenv.exceptions import SpecViolationError

    pool = AsyncEnvPool([RecordingEnv for _ in range(3)])
    try:
        await pool.reset()
        envs = pool._backend.envs
        wide = _actions(3, 1.0)
        wide["action"] = wide["action"].to(torch.float64)
        pool.async_step_send(wide, env_index=[2, 0, 1])
        out = await pool.async_step_recv(min_get=3)
        for k, i in enumerate(out["env_index"].tolist()):
            want = wide["action"][[2, 0, 1].index(i)].float()
            assert envs[i].seen[-1][1].dtype == torch.float32
            assert torch.equal(envs[i].seen[-1][1], want)
            assert torch.equal(out["next", "observation"][k], want)
        bad = _actions(3, 2.0)
        bad["action"] = torch.zeros(3, 3)
        with pytest.raises(SpecViolationError):
            pool.async_step_send(bad, env_index=[0, 1, 2])
        assert not any(pool._tickets)  # nothing was sent
        good = _actions(3, 7.0)
        pool.async_step_send(good, env_index=[0, 1, 2])
        out = await pool.async_step_recv(min_get=3)
        for k, i in enumerate(out["env_index"].tolist()):
            assert torch.equal(out["action"][k], good["action"][i])
            assert torch.equal(out["next", "observation"][k], good["action"][i])
            assert torch.equal(envs[i].seen[-1][1], good["action"][i])
    finally:
        await pool.aclose()


async def test_streamed_rows_of_a_dtype_numpy_lacks():
    # bfloat16 inputs: the rows are gathered with torch's index (numpy has no bfloat16)
    def make() -> RecordingEnv:
        env = RecordingEnv()
        env.action_spec = Unbounded((2,), dtype=torch.bfloat16)
        return env

    pool = AsyncEnvPool([make for _ in range(3)])
    try:
        await pool.reset()
        sent = _actions(3, 1.5)
        sent["action"] = sent["action"].to(torch.bfloat16)
        pool.async_step_send(sent, env_index=[2, 0, 1])
        assert pool._stream_rows is not None and pool._stream_rows._host is None
        out = await pool.async_step_recv(min_get=3)
        for k, i in enumerate(out["env_index"].tolist()):
            assert out["action"].dtype == torch.bfloat16
            assert torch.equal(out["action"][k], sent["action"][[2, 0, 1].index(i)])
    finally:
        await pool.aclose()


async def test_a_cancelled_step_frees_its_env_and_its_worker():
    pool = AsyncEnvPool([RecordingEnv for _ in range(2)])
    try:
        await pool.reset()
        env = pool._backend.envs[0]
        env.gate = asyncio.Event()
        pool.async_step_send(_actions(1, 3.0), env_index=[0])
        await asyncio.sleep(0)  # (one pass of the loop: the worker waits on the gate)
        assert pool.cancel(0)
        env.gate = None
        sent = _actions(1, 7.0)
        pool.async_step_send(sent, env_index=[0])
        out = await pool.async_step_recv(min_get=1)
        assert torch.equal(out["action"][0], sent["action"][0])
        assert torch.equal(env.seen[-1][1], sent["action"][0])
    finally:
        await pool.aclose()


class SyncStepEnv(RecordingEnv):
    """Its reset awaits (a worker runs it), its step is sync (it runs inline)."""

    def _step(self, td: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        return TensorDict(
            observation=td["action"].clone(),
            reward=torch.ones(1),
            done=torch.zeros(1, dtype=torch.bool),
        )


async def test_a_sync_step_runs_inline_though_its_env_has_a_worker():
    # the reset left an idle worker behind; the step still finishes inside its send
    pool = AsyncEnvPool([SyncStepEnv for _ in range(2)])
    try:
        await pool.reset()
        for _ in range(3):
            pool.async_step_send(_actions(2, 0.0), env_index=[0, 1])
            assert len(pool._ready["step"]) == 2  # (no await since the send)
            out = await pool.async_step_recv(min_get=2)
            assert sorted(out["env_index"].tolist()) == [0, 1]
    finally:
        await pool.aclose()


async def test_a_send_to_most_envs_makes_their_rows_at_once(monkeypatch):
    # a send to a few envs of the pool makes their rows one by one; one to at least half
    # of them takes each buffer's views in one call: every row still a view of its own
    # line of the buffers, read by its env, and kept for the next steps
    from aenv.pool._stream_rows import StreamRows

    one_by_one: list[int] = []
    make_row = StreamRows._row

    def counted(self: StreamRows, i: int) -> TensorDictBase:
        one_by_one.append(i)
        return make_row(self, i)

    monkeypatch.setattr(StreamRows, "_row", counted)
    pool = AsyncEnvPool([RecordingEnv for _ in range(6)])
    try:
        await pool.reset()
        envs = pool._backend.envs
        sent = _actions(6, 0.0)
        pool.async_step_send(sent[torch.tensor([4])], env_index=[4])
        await pool.async_step_recv(min_get=1)
        assert one_by_one == [4]
        rest = [5, 0, 3, 1, 2]
        for base in (10.0, 20.0):
            sent = _actions(6, base)
            pool.async_step_send(sent[torch.tensor(rest)], env_index=rest)
            out = await pool.async_step_recv(min_get=5)
            for k, i in enumerate(out["env_index"].tolist()):
                assert torch.equal(envs[i].seen[-1][1], sent["action"][i])
                assert torch.equal(out["next", "observation"][k], sent["action"][i])
        assert one_by_one == [4]  # (the five rows were made together, once)
        rows = pool._stream_rows
        assert rows is not None
        for i in range(6):
            row = rows._rows[i]
            assert row is not None and all(env_td is row for env_td, _ in envs[i].seen)
            for key, buf in rows.bufs.items():
                assert row[key].data_ptr() == buf[i].data_ptr()
    finally:
        await pool.aclose()
