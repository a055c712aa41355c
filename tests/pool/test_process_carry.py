"""An overlapped rollout's carried inputs on the process backend: the next step's observation
and done flags come from the step before (its ``"next"`` row, or its ``"reset"`` row where
the env was reset), carried over by the rung workers themselves or, where a call goes over
the socket, by the parent (:meth:`aenv.pool._shm.StackedBlocks.carry`). The env here steps
from the observation it is given, so a wrong carry changes every later step."""

from __future__ import annotations

import os
import sys
from functools import partial
from typing import Any

import cloudpickle
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenv import EnvBase
from aenv.envs._utils import EnvMetaData
from aenv.pool import AsyncEnvPool
from aenv.pool._process_bell import CARRY_NEXT, CARRY_RESET, STEPS, Bell
from aenv.pool._shm import (
    Slot,
    carried_keys,
    carry_blocks,
    carry_pairs,
    make_region,
    map_region,
    map_slots,
    plan_layout,
)
from aenv.specs import Composite, OneHot, Unbounded

pytestmark = pytest.mark.timeout(90)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class EchoWalkEnv(EnvBase):
    """A walk whose next position is the observation it is given plus its move; each reset
    starts ``10 x resets`` away, so a step carried from the wrong row shows."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((1,)))
        self.action_spec = OneHot(2)
        self.reward_spec = Unbounded((1,))
        self.limit = limit
        self.t = 0
        self.resets = 0

    def _set_seed(self, seed: int | None) -> None:
        pass

    def _reset(self, td: TensorDictBase | None, **kw: Any) -> TensorDictBase:
        self.t = 0
        self.resets += 1
        return TensorDict({"observation": torch.tensor([10.0 * self.resets])}, [])

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        move = 1.0 if bool(td["action"][1]) else -1.0
        self.t += 1
        return TensorDict(
            {
                "observation": td["observation"] + move,
                "reward": torch.tensor([move]),
                "done": torch.tensor([self.t >= self.limit]),
            },
            [],
        )


LIMITS = (1, 2, 3, 5)


def echo_pool(backend: str, **kwargs: Any) -> AsyncEnvPool:
    options = {"num_workers": 2, "start_method": "forkserver"} if backend == "process" else {}
    fns = [partial(EchoWalkEnv, limit) for limit in LIMITS]
    return AsyncEnvPool(fns, backend=backend, backend_options=options, **kwargs)


async def _rollout(backend: str, rings: list[bytes] | None = None, **kwargs: Any) -> Any:
    async with echo_pool(backend, **kwargs) as pool:
        if rings is not None:
            spy_rings(pool, rings)
        torch.manual_seed(5)
        await pool.reset()
        return await pool.rollout(12, break_when_any_done=False)


def spy_rings(pool: AsyncEnvPool, rings: list[bytes]) -> None:
    """Record the flags of every call rung on the pool's doorbells, all by the parent (the
    workers' own rings of chained calls, which the parent does not see, turned off: they
    are tested in test_process_bell and test_process_stacked)."""
    pool._backend._peer_rings = False  # type: ignore[attr-defined]
    for w in pool._backend._workers:  # type: ignore[attr-defined]
        ring = w.bell.ring

        def spy(seq: int, op: str, bank: int, flags: Any, ring: Any = ring) -> None:
            rings.append(bytes([STEPS]) * 2 if flags is None else flags)
            ring(seq, op, bank, flags)

        w.bell.ring = spy


def _positions(td: TensorDictBase) -> list[list[float]]:
    return td["next", "observation"].squeeze(-1).tolist()


async def test_rung_workers_carry_next_and_reset_rows():
    expected = await _rollout("coroutine")
    rings: list[bytes] = []
    got = await _rollout("process", rings)
    assert _positions(got) == _positions(expected)
    assert torch.equal(got["observation"], expected["observation"])
    assert torch.equal(got["next", "done"], expected["next", "done"])
    if Bell.available():
        # the chained steps were rung with carry flags: from "next", and from "reset"
        # for the envs reset by the step before
        flags = b"".join(rings)
        assert any(f & CARRY_NEXT for f in flags)
        assert any(f & CARRY_RESET for f in flags)


async def test_socket_calls_are_carried_by_the_parent():
    # a step timeout sends every call over the socket (streamed): the parent carries
    expected = await _rollout("coroutine")
    rings: list[bytes] = []
    got = await _rollout("process", rings, step_timeout=60.0)
    assert not rings
    assert _positions(got) == _positions(expected)
    assert torch.equal(got["observation"], expected["observation"])


def _mapped_slots(envs: list[EnvBase]) -> list[dict[str, Slot]]:
    """The envs' slots over one region laid out as a worker maps it."""
    metas = {k: EnvMetaData.metadata_from_env(env) for k, env in enumerate(envs)}
    layout, _, size = plan_layout(metas)
    fd = make_region(size)
    try:
        flat = map_region(fd, size)
    finally:
        os.close(fd)
    return [map_slots(flat, layout[k]) for k in range(len(envs))]  # type: ignore[misc]


def test_carry_blocks_are_the_rows_of_like_envs():
    slots = _mapped_slots([EchoWalkEnv(limit) for limit in LIMITS])
    pairs = [carry_pairs(s["in"], s["next"], s["reset"]) for s in slots]
    blocks = carry_blocks(pairs)
    assert blocks is not None
    keys = carried_keys(
        slots[0]["in"].by_key.items(), slots[0]["next"].by_key, slots[0]["reset"].by_key
    )
    assert len(blocks) == len(keys)
    for k, (dst, nxt, rst) in enumerate(blocks):
        assert dst.shape[0] == nxt.shape[0] == rst.shape[0] == len(LIMITS)
        for j in range(len(LIMITS)):  # row j is env j's own arrays
            for block, own in zip((dst, nxt, rst), pairs[j][k], strict=True):
                assert block[j].ctypes.data == own.ctypes.data
                assert block[j].shape == own.shape and block[j].dtype == own.dtype
    # one copy over a block is each env's own copy
    dst, nxt, rst = blocks[keys.index("observation")]
    for j, s in enumerate(slots):
        s["next"].by_key["observation"].fill_(j + 1)
        s["reset"].by_key["observation"].fill_(-(j + 1))
    dst[...] = nxt
    dst[2] = rst[2]
    observed = [float(s["in"].by_key["observation"][0]) for s in slots]
    assert observed == [1.0, 2.0, -3.0, 4.0]
    # no block over envs whose rows are not one stride apart, nor for a single env
    assert carry_blocks([pairs[0], pairs[2], pairs[1]]) is None
    assert carry_blocks(pairs[:1]) is None


class AddsEntryEnv(EchoWalkEnv):
    """Changes the input it is given: an entry of its own, and its observation replaced by
    a copy (an input kept from step to step would then hold a stale observation)."""

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        td.set("scratch", torch.ones(3))
        td.set("observation", td["observation"].clone())
        return super()._step(td)


def test_a_lent_input_is_lent_again_until_the_env_changes_it():
    (slots,) = _mapped_slots([EchoWalkEnv(3)])
    slot = slots["in"]
    lent = slot.lend()
    assert slot.lend() is lent
    assert set(lent.keys()) == set(slot.td.keys())
    lent.set("scratch", torch.ones(3))  # (what an env may do to its input)
    again = slot.lend()
    assert again is not lent and "scratch" not in again.keys()
    assert "scratch" not in slot.td.keys()
    again.set("action", torch.zeros(2))  # an entry replaced, not written in place
    third = slot.lend()
    assert third is not again and third["action"] is slot.by_key["action"]
    third.lock_()
    assert slot.lend() is not third


async def test_an_env_that_writes_into_its_input_steps_from_the_planned_input():
    # the worker lends the same input view from step to step; an env that adds an entry
    # to it must see its input as planned at the next step, as a bare env would
    def pool() -> AsyncEnvPool:
        fns = [partial(AddsEntryEnv, limit) for limit in LIMITS]
        options = {"num_workers": 2, "start_method": "forkserver"}
        return AsyncEnvPool(fns, backend="process", backend_options=options)

    async with pool() as p:
        torch.manual_seed(5)
        await p.reset()
        got = await p.rollout(12, break_when_any_done=False)
    fns = [partial(AddsEntryEnv, limit) for limit in LIMITS]
    async with AsyncEnvPool(fns, backend="coroutine") as p:
        torch.manual_seed(5)
        await p.reset()
        expected = await p.rollout(12, break_when_any_done=False)
    assert _positions(got) == _positions(expected)
    assert "scratch" not in got.keys()
