"""Process backend specifics: shared-memory slots, worker loops, pickled fallbacks, EnvCreator."""

from __future__ import annotations

import asyncio
import os
import pickle
import sys
from functools import partial
from typing import Any

import cloudpickle
import pytest
import pytest_asyncio
import torch
from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict, TensorDictBase

from aenv import EnvBase
from aenv.pool import AsyncEnvPool, ProcessorAsyncEnvPool
from aenv.pool._process_worker import SLOT
from aenv.specs import Composite, Unbounded
from aenv.sync._creator import EnvCreator
from aenv.testing import CountingEnv, DynamicSpecEnv, TextEnv

pytestmark = pytest.mark.timeout(60)
module_loop = pytest.mark.asyncio(loop_scope="module")
cloudpickle.register_pickle_by_value(sys.modules[__name__])
FORKSERVER = {"start_method": "forkserver"}


class BarrierEnv(EnvBase):
    """Each step waits until every env of its worker has started one: a worker that ran
    its envs' steps one after the other would never finish."""

    started = 0

    def __init__(self, group: int) -> None:
        super().__init__()
        self.group = group
        self.observation_spec = Composite(observation=Unbounded((1,)))
        self.action_spec = Unbounded((1,))
        self.reward_spec = Unbounded((1,))

    def _set_seed(self, seed: int | None) -> None:
        pass

    async def _reset(self, td: TensorDictBase | None, **kw: Any) -> TensorDictBase:
        return TensorDict({"observation": torch.zeros(1)}, [])

    async def _step(self, td: TensorDictBase) -> TensorDictBase:
        type(self).started += 1
        while type(self).started < self.group:
            await asyncio.sleep(0)
        return TensorDict({"observation": torch.full((1,), float(os.getpid()))}, [])


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def counting():
    pool = AsyncEnvPool(
        [partial(CountingEnv, max_steps=3 + i) for i in range(4)],
        backend="multiprocessing",
        backend_options={"num_workers": 2, **FORKSERVER},
    )
    yield pool
    await pool.aclose()


@module_loop
async def test_class_workers_and_lambda_factories(counting):
    assert type(counting) is ProcessorAsyncEnvPool
    pids = counting.worker_pids
    assert len(set(pids)) == 2 and os.getpid() not in pids
    # lambdas cross (cloudpickle), two envs per worker
    async with ProcessorAsyncEnvPool(
        [lambda: CountingEnv(max_steps=7)] * 2, envs_per_worker=2, **FORKSERVER
    ) as pool:
        assert len(pool.worker_pids) == 1
        assert await pool.get_attr("max_steps") == [7, 7]


@module_loop
async def test_steps_travel_through_shared_memory(counting, monkeypatch):
    backend = counting._backend
    assert all(slots is not None for slots in backend._slots)
    codes = []
    on_message = backend._on_message

    def spy(w, msg):
        if msg[0] == "r":
            codes.append(msg[3])
        elif msg[0] == "b":
            codes.extend(code for _, code, _ in msg[2])
        return on_message(w, msg)

    monkeypatch.setattr(backend, "_on_message", spy)
    td = await counting.reset()
    td["env_index"] = torch.arange(4)
    counting.async_step_send(counting.rand_action(td))
    sent = [cmd for w in backend._workers for cmd in w.outbox]
    assert [cmd[3] for cmd in sent] == ["step"] * 4
    assert all(cmd[4] is None for cmd in sent)  # the actions are in the slots, not pickled
    out = await counting.async_step_recv(min_get=4)
    assert sorted(out["env_index"].tolist()) == [0, 1, 2, 3]
    assert out["next", "observation"].squeeze(-1).tolist() == [1, 1, 1, 1]
    assert codes == [SLOT] * 8  # the resets and the steps came back through the slots
    # results are private copies: the next step does not change them
    again = await counting.rollout(2, break_when_any_done=False)
    assert out["next", "observation"].squeeze(-1).tolist() == [1, 1, 1, 1]
    assert again.batch_size == torch.Size([4, 2])


@module_loop
async def test_whole_batch_and_partial_reset(counting):
    td = await counting.reset()
    for _ in range(2):
        td = counting.step_mdp(await counting.rand_step(td))
    td["_reset"] = torch.tensor([[True], [False], [True], [False]])
    out = await counting.reset(td)
    assert out["observation"].squeeze(-1).tolist() == [0, 2, 0, 2]
    assert [c.item() for c in await counting.get_attr("count")] == [0, 2, 0, 2]
    assert await counting.call("_set_seed", 3) == [None] * 4


@module_loop
async def test_async_envs_interleave_inside_one_worker():
    async with ProcessorAsyncEnvPool(
        (4, partial(BarrierEnv, group=4)), num_workers=1, **FORKSERVER
    ) as pool:
        td = await pool.rand_step(await pool.reset())
        pids = td["next", "observation"].squeeze(-1).tolist()
        assert len(set(pids)) == 1 and pids[0] == pool.worker_pids[0]


@module_loop
async def test_non_tensor_data_goes_pickled():
    async with ProcessorAsyncEnvPool(
        [partial(TextEnv, prompt=f"p{i}") for i in range(2)],
        num_workers=1,
        stack="lazy",
        **FORKSERVER,
    ) as pool:
        assert pool._backend._slots == [None, None]
        td = await pool.reset()
        td["action"] = [NonTensorData("hi"), NonTensorData("there")]
        out = await pool.step(td)
        history = [out[i]["next", "history"] for i in range(2)]
        assert history == ["p0 hi", "p1 there"]
        assert out["next", "reward"].squeeze(-1).tolist() == [2.0, 5.0]


@module_loop
async def test_dynamic_specs_go_pickled():
    async with ProcessorAsyncEnvPool(
        (2, partial(DynamicSpecEnv, max_count=4)), num_workers=1, stack="lazy", **FORKSERVER
    ) as pool:
        assert pool._backend._slots == [None, None]
        td = await pool.rollout(3, return_contiguous=False)
        assert isinstance(td, LazyStackedTensorDict)
        shapes = [td[0, t]["next", "observation"].shape for t in range(3)]
        assert shapes == [torch.Size([3, k, 2]) for k in (2, 3, 4)]


def test_env_creator_pickles_and_reads_metadata_once():
    built = []

    def make(max_steps: int) -> CountingEnv:
        built.append(max_steps)
        return CountingEnv(max_steps=max_steps)

    creator = EnvCreator(make, {"max_steps": 4})
    clone = pickle.loads(pickle.dumps(creator))  # a local function: cloudpickled
    assert clone().max_steps == 4 and built == []  # built in the clone's copy of `make`
    assert creator(max_steps=2).max_steps == 2 and built == [2]
    meta = creator.meta_data
    assert built == [2, 4] and meta.batch_size == torch.Size([])
    assert creator.meta_data is meta  # read once
    assert pickle.loads(pickle.dumps(creator)).meta_data.batch_size == torch.Size([])


@module_loop
async def test_pool_fills_creator_metadata_from_workers():
    built = []

    def make() -> CountingEnv:
        built.append(os.getpid())
        return CountingEnv(max_steps=3)

    creator = EnvCreator(make)
    async with ProcessorAsyncEnvPool((2, creator), num_workers=1, **FORKSERVER) as pool:
        assert built == []  # nothing built in this process
        assert creator._meta_data is not None
        assert creator.meta_data.specs["output_spec"] == pool._metas[0].specs["output_spec"]
