"""Streamed steps on processes go through the shared rows (aenv.pool._process_stream):
the same data as on coroutines, whatever is sent, received or stepped in between."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import cloudpickle
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenv import EnvBase
from aenv.pool import ERROR_KEYS, AsyncEnvPool
from aenv.pool._process_stream import Held, SharedRows
from aenv.specs import Bounded, Composite, OneHot, Unbounded
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(60)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

OP = "step_and_maybe_reset"


class WalkEnv(EnvBase):
    """A walk driven by its one-hot action, done after ``limit`` steps (its observation
    says where it is and which env it is). ``touch``: the step writes into its input (the
    observation it was given, in place), as a bare env may. ``keep``: the env keeps its
    input and, on its next step, writes into that one (not into its own). ``extra``: its
    results carry an entry no spec names, so they cannot come back in the rows (a
    process worker pickles them). ``truncated``: its done spec has a ``"truncated"``
    entry (the pool's ``on_error="observe"`` adds one where an env has none)."""

    def __init__(
        self,
        env: int,
        limit: int = 3,
        touch: bool = False,
        keep: bool = False,
        extra: bool = False,
        truncated: bool = False,
    ) -> None:
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((2,)))
        self.action_spec = OneHot(2)
        self.reward_spec = Unbounded((1,))
        self.env, self.limit, self.touch, self.keep = env, limit, touch, keep
        self.extra = extra
        if truncated:
            self.add_truncated_keys()
        self.pos, self.t = 0.0, 0
        self.kept: TensorDictBase | None = None

    def _reset(self, td: TensorDictBase | None, **kw: Any) -> TensorDictBase:
        self.pos, self.t = 0.0, 0
        return TensorDict({"observation": torch.tensor([self.pos, float(self.env)])}, [])

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        if self.kept is not None:
            self.kept["observation"].fill_(-7.0)
        move = 1.0 if bool(td["action"][1]) else -1.0
        self.pos += move
        self.t += 1
        if self.touch:
            td["observation"].add_(1000.0)
        if self.keep:
            self.kept = td
        out = TensorDict(
            {
                "observation": torch.tensor([self.pos, float(self.env)]),
                "reward": torch.tensor([move]),
                "done": torch.tensor([self.t >= self.limit]),
            },
            [],
        )
        if self.extra:
            out["note"] = torch.tensor([float(self.t)])
        return out


def _pool(backend: str, n: int = 6, on_error: str = "raise", **kw: Any) -> AsyncEnvPool:
    options = {"num_workers": 2} if backend == "process" else {}
    return AsyncEnvPool(
        [partial(WalkEnv, i, limit=2 + i % 3, **kw) for i in range(n)],
        backend=backend,
        backend_options=options,
        on_error=on_error,
    )


async def _delivered(pool: AsyncEnvPool, count: int) -> None:
    """Wait until ``count`` results came back (not received)."""
    while len(pool._ready[OP]) < count:
        await asyncio.sleep(0.001)


def _by_env(td: TensorDictBase) -> dict[int, TensorDictBase]:
    return {int(i): td[k] for k, i in enumerate(td["env_index"].tolist())}


def _actions(n: int, k: int, envs: list[int]) -> TensorDictBase:
    """Deterministic one-hot actions of round ``k`` for ``envs``."""
    rows = torch.tensor([(i * 7 + k * 3) % 2 for i in envs])
    return TensorDict({"action": torch.nn.functional.one_hot(rows, 2).bool()}, [len(envs)])


async def _script(backend: str, **kw: Any) -> list[tuple[TensorDictBase, TensorDictBase]]:
    """Streamed sends of subsets, single envs, re-sends of results not received yet and a
    whole-batch step in between; every receive's results, per env."""
    n = 6
    got: list[tuple[TensorDictBase, TensorDictBase]] = []
    async with _pool(backend, n, **kw) as pool:
        td = await pool.reset()
        if backend == "process":
            assert isinstance(pool._rows_for(OP), SharedRows)
        nxt: dict[int, TensorDictBase] = dict(enumerate(td.unbind(0)))

        async def recv(**how: Any) -> None:
            out, new = await pool.async_step_and_maybe_reset_recv(**how)
            got.append((out, new))
            nxt.update(_by_env(new))

        def send(envs: list[int], k: int, single: bool = False) -> None:
            batch = torch.stack([nxt[i].exclude("env_index") for i in envs]).clone()
            batch.update(_actions(n, k, envs))
            if single:
                pool.async_step_and_maybe_reset_send(batch[0], env_index=envs[0])
            else:
                pool.async_step_and_maybe_reset_send(batch, env_index=envs)

        for k in range(6):
            send([4, 1, 3], k)
            send([0], k, single=True)
            await _delivered(pool, 4)
            if backend == "process":
                assert all(type(item[1]) is Held for item in pool._ready[OP].waiting())
            await recv(env_index=3)
            # sent again before their last results are received (copied out of the rows)
            send([1, 0], k + 10)
            await _delivered(pool, 5)
            await recv(min_get=3, max_get=3)  # (the oldest: 4, 1 and 0's first results)
            await recv(min_get=2)  # 1 and 0's second
            # a whole-batch step over results still held
            send([2, 5], k)
            await _delivered(pool, 2)
            whole = torch.stack([nxt[i].exclude("env_index") for i in range(n)]).clone()
            whole.update(_actions(n, k + 20, list(range(n))))
            stepped, following = await pool.step_and_maybe_reset(whole)
            if not kw.get("touch"):
                # (an env's write into its input shows in a whole-batch step's stepped
                # tensordict on some backends only: that path is not the one under test)
                got.append((stepped, following))
            await recv(min_get=2)
            nxt.update(dict(enumerate(following.unbind(0))))
        if backend == "process":
            rows = pool._rows_for(OP)
            assert rows.count == 0 and rows.held == [None] * n  # (every one received)
            assert not any(rows.pending)
    return got


def _sorted(td: TensorDictBase) -> TensorDictBase:
    return td[td["env_index"].argsort()] if "env_index" in td.keys() else td


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for (out_a, nxt_a), (out_b, nxt_b) in zip(a, b):
        out_a, out_b, nxt_a, nxt_b = map(_sorted, (out_a, out_b, nxt_a, nxt_b))
        assert sorted(map(str, out_a.keys(True, True))) == sorted(map(str, out_b.keys(True, True)))
        assert sorted(map(str, nxt_a.keys(True, True))) == sorted(map(str, nxt_b.keys(True, True)))
        assert (out_a == out_b).all(), (out_a, out_b)
        assert (nxt_a == nxt_b).all(), (nxt_a, nxt_b)


@pytest.mark.parametrize("touch", [False, True])
async def test_streamed_steps_on_processes_give_what_coroutines_give(touch):
    procs = await _script("process", touch=touch)
    coros = await _script("coroutine", touch=touch)
    _same(procs, coros)
    if touch:  # (the env's write into its input is in what comes back)
        assert any(bool((out["observation"][:, 0] >= 1000).any()) for out, _ in procs)


async def test_streamed_steps_under_observe_are_held_in_the_rows_too():
    # on_error="observe" keeps the results in the rows (_script checks they are held)
    # and writes each one's empty error entries as it comes out of them: the same data
    # as on coroutines, error entries included, none in the next inputs
    procs = await _script("process", on_error="observe", truncated=True)
    coros = await _script("coroutine", on_error="observe", truncated=True)
    for (out_p, nxt_p), (out_c, nxt_c) in zip(procs, coros):
        # (per env: a receive from the rows holds one empty string for its batch, as a
        # whole-batch step does, where the per-env path stacks one per env)
        for key in ERROR_KEYS:
            empty = [""] * out_p.batch_size[0]
            assert [o["next", key] for o in out_p.unbind(0)] == empty
            assert [o["next", key] for o in out_c.unbind(0)] == empty
            assert key not in nxt_p.keys() and key not in nxt_c.keys()
    strip = [(out.exclude(*(("next", k) for k in ERROR_KEYS)), nxt) for out, nxt in procs]
    _same(strip, [(out.exclude(*(("next", k) for k in ERROR_KEYS)), nxt) for out, nxt in coros])


async def test_an_env_that_keeps_its_input_leaves_received_inputs_alone():
    # each round is sent before the last one is received (its results copied out of the
    # rows first), and the env writes into its kept input on its next step: every result
    # received holds the input it was sent
    n, rounds = 4, 4
    async with _pool("process", n, keep=True) as pool:
        td = await pool.reset()
        sent = []
        for k in range(rounds):
            batch = td.clone()
            batch.update(_actions(n, k, list(range(n))))
            sent.append(batch.clone())
            pool.async_step_and_maybe_reset_send(batch, env_index=list(range(n)))
            await _delivered(pool, n * (k + 1))
        out, _ = await pool.async_step_and_maybe_reset_recv(min_get=n * rounds)
        seen = [0] * n
        for row in range(n * rounds):
            i = int(out["env_index"][row])
            k, seen[i] = seen[i], seen[i] + 1
            assert torch.equal(out["action"][row], sent[k]["action"][i])
            if k == 0:
                assert torch.equal(out["observation"][row], td["observation"][i])
        assert seen == [rounds] * n


class BoundedEnv(EnvBase):
    """An env whose action bounds are its own: ``[low, low + 0.5]``."""

    def __init__(self, low: float) -> None:
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((1,)))
        self.action_spec = Bounded(low=low, high=low + 0.5, shape=(1,))
        self.reward_spec = Unbounded((1,))

    def _reset(self, td: TensorDictBase | None, **kw: Any) -> TensorDictBase:
        return TensorDict({"observation": torch.zeros(1)}, [])

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        zero = torch.zeros(1)
        return TensorDict({"observation": zero, "reward": zero, "done": zero.bool()}, [])


@pytest.mark.parametrize("lows", [[0.0, 1.0, 2.0, 3.0], [2.0, 2.0, 2.0, 2.0]])
async def test_random_actions_for_a_subset_are_each_envs_own(lows):
    async with AsyncEnvPool([partial(BoundedEnv, low) for low in lows]) as pool:
        td = await pool.reset()
        for envs in ([3, 1], [2], [0, 1, 2, 3], [1, 0, 3]):
            sub = td[torch.tensor(envs)].clone()
            sub["env_index"] = torch.tensor(envs)
            action = pool.rand_action(sub)["action"]
            assert action.shape == (len(envs), 1)
            low = torch.tensor([lows[i] for i in envs]).unsqueeze(-1)
            assert bool(((action >= low) & (action <= low + 0.5)).all()), (envs, action)
        one = td[2].clone()
        one["env_index"] = torch.tensor(2)
        action = pool.rand_action(one)["action"]
        assert action.shape == (1,) and lows[2] <= float(action) <= lows[2] + 0.5


async def _batched_script(backend: str) -> list[tuple[TensorDictBase, TensorDictBase]]:
    """Streamed sends of sub-envs with a batch size of their own, in two halves."""
    options = {"num_workers": 2} if backend == "process" else {}
    fns = [partial(CountingEnv, max_steps=4, batch_size=(2,), start_val=i % 2) for i in range(4)]
    got = []
    async with AsyncEnvPool(fns, backend=backend, backend_options=options) as pool:
        td = await pool.reset()
        if backend == "process":
            assert isinstance(pool._rows_for(OP), SharedRows)
        td["action"] = torch.zeros(4, 2, 1, dtype=torch.int64)
        pool.async_step_and_maybe_reset_send(td.clone(), env_index=[0, 1, 2, 3])
        for _ in range(7):
            out, nxt = await pool.async_step_and_maybe_reset_recv(min_get=4)
            got.append((out, nxt))
            nxt = nxt[nxt["env_index"][:, 0].argsort()]
            for half in ([2, 0], [3, 1]):
                sent = nxt[torch.tensor(half)].exclude("env_index")
                sent["action"] = torch.ones(2, 2, 1, dtype=torch.int64)
                pool.async_step_and_maybe_reset_send(sent, env_index=half)
        await pool.async_step_and_maybe_reset_recv(min_get=4)
    return [(_sorted_rows(a), _sorted_rows(b)) for a, b in got]


def _sorted_rows(td: TensorDictBase) -> TensorDictBase:
    return td[td["env_index"][:, 0].argsort()]


async def test_streamed_sub_batches_on_processes_give_what_coroutines_give():
    procs = await _batched_script("process")
    coros = await _batched_script("coroutine")
    assert len(procs) == len(coros)
    for (out_a, nxt_a), (out_b, nxt_b) in zip(procs, coros):
        assert out_a.batch_size == (4, 2)
        assert (out_a == out_b).all() and (nxt_a == nxt_b).all()


class LateReader(EnvBase):
    """Reads its action only once the file ``gate`` exists (env 0; the others at once)."""

    def __init__(self, env: int, gate: str) -> None:
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((1,)))
        self.action_spec = Unbounded((1,))
        self.reward_spec = Unbounded((1,))
        self.env, self.gate = env, gate

    async def _reset(self, td: TensorDictBase | None, **kw: Any) -> TensorDictBase:
        return TensorDict({"observation": torch.zeros(1)}, [])

    async def _step(self, td: TensorDictBase) -> TensorDictBase:
        while self.env == 0 and not os.path.exists(self.gate):
            await asyncio.sleep(0.001)
        action = td["action"].clone()
        return TensorDict(
            {
                "observation": action,
                "reward": torch.zeros(1),
                "done": torch.zeros(1, dtype=torch.bool),
            },
            [],
        )


@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_a_masked_step_leaves_a_streamed_steps_input_alone(
    backend: str, tmp_path: Any
) -> None:
    # env 0's streamed step reads its action only after a masked whole-batch step of the
    # other envs came back: that step must not have written env 0's input row (it did on
    # processes, whose stacked inputs fill every env's row)
    gate = str(tmp_path / "gate")
    options = {"num_workers": 2} if backend == "process" else {}
    fns = [partial(LateReader, i, gate) for i in range(4)]
    async with AsyncEnvPool(fns, backend=backend, backend_options=options) as pool:
        td = await pool.reset()
        td["action"] = torch.full((4, 1), 1.0)
        pool.async_step_send(td[0:1].clone(), env_index=[0])
        batch = td.clone()
        batch["action"] = torch.full((4, 1), 99.0)
        batch["_step"] = torch.tensor([False, True, True, True])
        out = await pool.step(batch)
        assert out["next", "observation"].flatten().tolist() == [0.0, 99.0, 99.0, 99.0]
        open(gate, "w").close()
        got = await pool.async_step_recv(min_get=1)
        assert got["next", "observation"].flatten().tolist() == [1.0]


@contextlib.asynccontextmanager
async def _decoded_first_step() -> AsyncIterator[tuple[AsyncEnvPool, TensorDictBase]]:
    """A process pool whose env 0 was sent one streamed step (action [True, False])
    through its row, its result back (decoded: its extra entry does not fit the rows) and
    not received; with the pool's inputs (its reset)."""
    fns = [partial(WalkEnv, i, limit=100, extra=True) for i in range(4)]
    async with AsyncEnvPool(fns, backend="process", backend_options={"num_workers": 2}) as pool:
        inputs = (await pool.reset()).exclude("env_index")
        first = inputs[0:1].clone().update({"action": torch.tensor([[True, False]])})
        pool.async_step_send(first, env_index=[0])
        assert pool._rows_for("step").pending[0]  # type: ignore[union-attr]
        while len(pool._ready["step"]) < 1:
            await asyncio.sleep(0.001)
        assert pool._backend._srows.held[0] is None  # type: ignore[attr-defined]  # (decoded)
        yield pool, inputs


async def test_a_decoded_results_input_row_is_not_written_before_it_is_received() -> None:
    # a streamed result that comes back decoded (not held in the rows) has its input read
    # from env 0's row when it is received: a second send to env 0 before that goes in an
    # input of its own, leaving the row as the first send left it
    async with _decoded_first_step() as (pool, inputs):
        second = inputs[0:1].clone().update({"action": torch.tensor([[False, True]])})
        pool.async_step_send(second, env_index=[0])  # (the first not received yet)
        while len(pool._ready["step"]) < 2:
            await asyncio.sleep(0.001)
        got = [await pool.async_step_recv(min_get=1, max_get=1) for _ in range(2)]
        assert [g["action"].tolist() for g in got] == [[[True, False]], [[False, True]]]
        assert [g["next", "observation"][0, 0].item() for g in got] == [-1.0, 0.0]


async def test_a_whole_batch_step_leaves_a_decoded_results_input_row_alone() -> None:
    # as above, with a whole-batch step before the receive: its stacked input would fill
    # every env's row, env 0's too, so it goes per env (env 0's input pickled)
    async with _decoded_first_step() as (pool, inputs):
        inputs = inputs.clone()
        inputs["action"] = torch.tensor([[False, True]] * 4)
        whole = await pool.step(inputs)
        assert whole["next", "observation"][:, 0].tolist() == [0.0, 1.0, 1.0, 1.0]
        got = await pool.async_step_recv(min_get=1)
        assert got["action"].tolist() == [[True, False]]
