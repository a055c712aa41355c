"""An overlapped rollout's carried inputs on the process backend: the next step's observation
and done flags come from the step before (its ``"next"`` row, or its ``"reset"`` row where
the env was reset), carried over by the rung workers themselves or, where a call goes over
the socket, by the parent (:meth:`aenv.pool._shm.StackedBlocks.carry`). The env here steps
from the observation it is given, so a wrong carry changes every later step."""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

import cloudpickle
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenv import EnvBase
from aenv.pool import AsyncEnvPool
from aenv.pool._process_bell import CARRY_NEXT, CARRY_RESET, STEPS, Bell
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
    """Record the flags of every call rung on the pool's doorbells."""
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
