"""A coroutine pool of envs built alike: the envs share their specs and their metadata, the
pool's stacked specs are what stacking each env's own specs gives, and a change to one env's
specs reaches no other env (aenv/pool/_build.py, aenv/envs/_spec_share.py)."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch

from aenv.pool import AsyncEnvPool
from aenv.specs import Composite, Unbounded
from aenv.testing import CountingEnv, LatencyEnv

pytestmark = pytest.mark.timeout(60)


def _own_specs(**kwargs: Any) -> LatencyEnv:
    env = LatencyEnv(spec_locked=False, **kwargs)
    env.set_spec_lock_(True)
    return env


async def test_the_pools_stacked_specs_are_the_envs_own_stacked() -> None:
    n = 7
    pool = AsyncEnvPool([partial(LatencyEnv, 0.0, seed=i) for i in range(n)])
    try:
        envs = pool._backend.envs
        assert all(e.output_spec is envs[0].output_spec for e in envs)
        # what stacking seven envs' separately built specs gives
        own = [_own_specs(seed=i) for i in range(n)]
        for name in ("output_spec", "input_spec"):
            expected = torch.stack([getattr(e, name) for e in own], 0)
            assert getattr(pool, name) == expected
        assert pool.full_observation_spec["observation"].shape == (n, 4)
        assert pool.action_spec.shape == (n, 1)
        assert sorted(pool.done_keys) == ["done", "terminated", "truncated"]
        # the pool's specs are its own: changing them leaves the envs' alone
        pool.observation_spec = Composite(
            observation=Unbounded((n, 4)),
            latency=Unbounded((n, 1)),
            extra=Unbounded((n, 1)),
            shape=(n,),
        )
        assert "extra" not in envs[0].observation_keys
        td = await pool.reset()
        out = await pool.step(pool.rand_action(td))
        assert out["next", "observation"].tolist() == [[1.0] * 4] * n
    finally:
        await pool.aclose()


async def test_one_envs_spec_change_inside_a_pool_reaches_no_other() -> None:
    pool = AsyncEnvPool([partial(LatencyEnv, 0.0, seed=i) for i in range(4)], stack="lazy")
    try:
        envs = pool._backend.envs
        envs[1].set_spec_lock_(False)
        envs[1].full_observation_spec["extra"] = Unbounded((2,))
        envs[1].set_spec_lock_(True)
        assert "extra" in envs[1].observation_keys
        assert all("extra" not in e.observation_keys for i, e in enumerate(envs) if i != 1)
        assert envs[0].output_spec is envs[2].output_spec is envs[3].output_spec
        # a pool built afterwards from the same factory sees the original specs
        again = AsyncEnvPool([partial(LatencyEnv, 0.0)] * 2)
        try:
            assert "extra" not in again.observation_keys
        finally:
            await again.aclose()
    finally:
        await pool.aclose()


async def test_envs_built_alike_share_one_metadata() -> None:
    class Described(LatencyEnv):
        def __repr__(self) -> str:
            return f"Described(seed={self._seed})"

    fns: list[Any] = [partial(LatencyEnv, 0.0, seed=i) for i in range(3)]
    fns += [partial(LatencyEnv, 0.0, obs_dim=6), partial(Described, 0.0, seed=7)]
    fns += [partial(Described, 0.0, seed=8), CountingEnv]
    pool = AsyncEnvPool(fns, stack="lazy")
    try:
        metas = pool._metas
        assert metas[0] is metas[1] is metas[2]
        assert metas[3] is not metas[0]  # other specs
        assert metas[3].specs["output_spec"]["full_observation_spec"]["observation"].shape == (6,)
        # a class describing each env its own way keeps one metadata per env
        assert metas[4] is not metas[5]
        assert (metas[4].env_str, metas[5].env_str) == ("Described(seed=7)", "Described(seed=8)")
        assert metas[6] is not metas[0]
        for i, meta in enumerate(metas):
            assert meta.specs["output_spec"] == pool._backend.envs[i].output_spec
        td = await pool.reset()
        assert [t["observation"].shape for t in td.tensordicts[:4]] == [(4,)] * 3 + [(6,)]
    finally:
        await pool.aclose()


async def test_a_rebuilt_env_shares_the_template_again() -> None:
    pool = AsyncEnvPool([partial(LatencyEnv, 0.0, seed=i) for i in range(3)])
    try:
        await pool.reset()
        pool._backend.replace(1)
        envs = pool._backend.envs
        assert envs[1].output_spec is envs[0].output_spec
        td = await pool.reset()
        assert td["observation"].shape == (3, 4)
    finally:
        await pool.aclose()


async def test_a_built_env_costs_a_few_tracked_objects() -> None:
    # each env of a big pool is walked by every full collection of the cyclic garbage
    # collector: shared specs, key lists and metadata leave the env and its attribute dict
    import gc

    n = 256
    fns = [partial(LatencyEnv, 0.0, seed=i) for i in range(n)]
    gc.collect()
    before = len(gc.get_objects())
    # (gc_freeze=False: frozen objects are left out of gc.get_objects(), which counts here)
    pool = AsyncEnvPool(fns, gc_freeze=False)
    try:
        gc.collect()
        per_env = (len(gc.get_objects()) - before) / n
        assert per_env < 3, per_env
        assert len({id(e.__dict__["output_spec"]) for e in pool._backend.envs}) == 1
    finally:
        await pool.aclose()
