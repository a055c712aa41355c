"""Building a pool in this process: envs with equal specs share one copy, the garbage
collector is paused for the build only (aenv/pool/_build.py)."""

from __future__ import annotations

import gc
from functools import partial

import pytest
import torch

from aenv.pool import AsyncEnvPool
from aenv.specs import Composite, Unbounded
from aenv.testing import CountingEnv, LatencyEnv


@pytest.mark.timeout(60)
async def test_envs_with_equal_specs_share_one_copy() -> None:
    pool = AsyncEnvPool([partial(LatencyEnv, 0.0, seed=i) for i in range(6)])
    try:
        envs = pool._backend.envs
        first = envs[0]
        for env in envs[1:]:
            assert env.output_spec is first.output_spec
            assert env.input_spec is first.input_spec
        # a shared spec is locked: no env can change it in place for the others
        with pytest.raises(RuntimeError):
            envs[2].output_spec["full_observation_spec"]["extra"] = Unbounded((1,))
        # replacing a spec on one env leaves the others' alone
        envs[3].observation_spec = Composite(
            observation=Unbounded((4,)), latency=Unbounded((1,)), extra=Unbounded((2,))
        )
        assert "extra" in envs[3].observation_keys
        assert "extra" not in first.observation_keys and "extra" not in envs[4].observation_keys
        td = await pool.reset()
        assert td["observation"].shape == (6, 4)
        out = await pool.step(pool.rand_action(td))
        assert out["next", "reward"].shape == (6, 1)
    finally:
        await pool.aclose()


@pytest.mark.timeout(60)
async def test_only_equal_locked_specs_are_shared() -> None:
    fns = [
        partial(LatencyEnv, 0.0, obs_dim=3),
        partial(LatencyEnv, 0.0, obs_dim=5),
        partial(LatencyEnv, 0.0, obs_dim=3),
        partial(LatencyEnv, 0.0, obs_dim=3, spec_locked=False),
    ]
    pool = AsyncEnvPool(fns, stack="lazy")
    try:
        a, b, c, unlocked = pool._backend.envs
        assert c.output_spec is a.output_spec  # same kind
        assert b.output_spec is not a.output_spec  # another kind
        assert b.output_spec["full_observation_spec"]["observation"].shape == (5,)
        assert unlocked.output_spec is not a.output_spec  # can change in place: its own
        td = await pool.reset()
        assert [t["observation"].shape for t in td.tensordicts] == [(3,), (5,), (3,), (3,)]
    finally:
        await pool.aclose()


@pytest.mark.timeout(60)
async def test_the_garbage_collector_is_paused_for_the_build_only() -> None:
    seen: list[bool] = []

    def make() -> CountingEnv:
        seen.append(gc.isenabled())
        return CountingEnv()

    assert gc.isenabled()
    pool = AsyncEnvPool([make] * 3)
    await pool.aclose()
    assert seen == [False] * 3 and gc.isenabled()

    def broken() -> CountingEnv:
        raise ValueError("no env today")

    with pytest.raises(ValueError, match="no env today"):
        AsyncEnvPool([make, broken])
    assert gc.isenabled()  # on again after a failed build

    gc.disable()
    try:  # a user who turned it off keeps it off
        pool = AsyncEnvPool([make])
        await pool.aclose()
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert torch.is_tensor(torch.zeros(1))
