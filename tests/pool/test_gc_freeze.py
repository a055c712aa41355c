"""The collector policy of big in-process pools (``gc_freeze``, :mod:`aenv.pool._gc`)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from aenv.pool import AsyncEnvPool
from aenv.pool._gc import FREEZE_FROM, YOUNG_PER_ENV
from aenv.testing import CountingEnv, LatencyEnv


@pytest.fixture(autouse=True)
def _no_freeze_left() -> Iterator[None]:
    gc.unfreeze()
    yield
    left = gc.get_freeze_count()
    gc.unfreeze()
    assert left == 0, "a test left objects frozen"


def _frozen(obj: object) -> bool:
    """Whether ``obj`` is in the permanent generation (in none of the three others)."""
    return gc.is_tracked(obj) and not any(o is obj for g in range(3) for o in gc.get_objects(g))


async def test_a_frozen_pool_freezes_its_envs_and_gives_them_back_on_close() -> None:
    pool = AsyncEnvPool([CountingEnv] * 3, gc_freeze=True)
    env = pool._backend.envs[0]  # type: ignore[attr-defined]
    assert gc.get_freeze_count() > 0 and _frozen(env)
    td = await pool.reset()
    assert td.batch_size == (3,)
    await pool.aclose()
    assert gc.get_freeze_count() == 0 and not _frozen(env)


async def test_small_pools_and_process_pools_do_not_freeze_by_default() -> None:
    before = gc.get_threshold()
    for n in (3, FREEZE_FROM - 1):
        async with AsyncEnvPool([CountingEnv] * n) as pool:
            await pool.reset()
            assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    async with AsyncEnvPool([CountingEnv] * 2, backend="process", gc_freeze=True) as pool:
        await pool.reset()
        assert gc.get_freeze_count() == 0  # its envs live in the workers


async def test_big_pools_freeze_by_default_unless_told_not_to() -> None:
    fns = [LatencyEnv] * FREEZE_FROM
    async with AsyncEnvPool(fns, gc_freeze=False) as pool:
        await pool.reset()
        assert gc.get_freeze_count() == 0
    async with AsyncEnvPool(fns) as pool:
        assert gc.get_freeze_count() > 0
        built = gc.get_freeze_count()
        await pool.reset()  # the first whole reset's worker state joins the freeze
        assert gc.get_freeze_count() >= built
    assert gc.get_freeze_count() == 0


async def test_the_freeze_lasts_until_the_last_holder_closes() -> None:
    first = AsyncEnvPool([CountingEnv] * 2, gc_freeze=True)
    second = AsyncEnvPool([CountingEnv] * 2, gc_freeze=True)
    await first.aclose()
    assert _frozen(first._backend.envs[0])  # type: ignore[attr-defined]
    await second.aclose()
    assert gc.get_freeze_count() == 0


async def test_a_freeze_made_by_someone_else_is_left_alone() -> None:
    mine = [object()]
    gc.freeze()
    assert _frozen(mine)
    async with AsyncEnvPool([CountingEnv] * 2, gc_freeze=True):
        pass
    assert _frozen(mine)  # aenv did not unfreeze what it had not frozen
    gc.unfreeze()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


async def test_the_build_garbage_is_collected_not_frozen() -> None:
    refs: list[weakref.ref[_Cycle]] = []

    def factory() -> CountingEnv:
        junk = _Cycle()  # cyclic garbage made while building
        refs.append(weakref.ref(junk))
        return CountingEnv()

    async with AsyncEnvPool([factory] * 2, gc_freeze=True):
        assert len(refs) == 2 and all(r() is None for r in refs)


def test_gc_freeze_takes_a_bool_or_none() -> None:
    with pytest.raises(TypeError, match="gc_freeze must be True, False or None, got 'yes'"):
        AsyncEnvPool([CountingEnv], gc_freeze="yes")  # type: ignore[arg-type]


async def test_what_the_first_streamed_steps_make_joins_the_freeze() -> None:
    # a streamed step's input row is made on the first send to its env, after the build
    # and reset freezes: once as many results as envs came back, it is frozen too
    n = 4
    async with AsyncEnvPool([CountingEnv] * n, gc_freeze=True) as pool:
        actions = pool.rand_action(await pool.reset())
        first = list(range(n - 1))
        pool.async_step_send(actions[first], env_index=first)
        assert (await pool.async_step_recv(min_get=n - 1)).batch_size == (n - 1,)
        row = pool.__dict__["_stream_rows"]._rows[0]
        assert not _frozen(row)  # one result short of a pool's worth
        pool.async_step_send(actions[n - 1], env_index=n - 1)
        await pool.async_step_recv(min_get=1)
        assert _frozen(row)
    assert gc.get_freeze_count() == 0


async def test_a_big_pool_spaces_the_young_generation_and_restores_it() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        n = FREEZE_FROM
        async with AsyncEnvPool([LatencyEnv] * n):
            assert gc.get_threshold() == (YOUNG_PER_ENV * n, 10, 10)
        assert gc.get_threshold() == (700, 10, 10)
        # thresholds someone else set while the pool was open are theirs: left as they are
        async with AsyncEnvPool([LatencyEnv] * n):
            gc.set_threshold(1000, 20, 20)
        assert gc.get_threshold() == (1000, 20, 20)
        # never lowered, and automatic collection left off where it was off
        for mine in ((10 * YOUNG_PER_ENV * n, 10, 10), (0, 10, 10)):
            gc.set_threshold(*mine)
            async with AsyncEnvPool([LatencyEnv] * n):
                assert gc.get_threshold() == mine
            assert gc.get_threshold() == mine
        # a pool that does not freeze leaves them alone
        gc.set_threshold(700, 10, 10)
        async with AsyncEnvPool([LatencyEnv] * n, gc_freeze=False):
            assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)


async def test_the_freezes_after_the_build_walk_nothing() -> None:
    # the reset's and the first results' freezes come with the pool's work in flight: a
    # collection then would walk all of it (0.2-0.3 s at 4,096 episodes), so they only freeze
    n = 4
    runs: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            runs.append(info["generation"])

    async with AsyncEnvPool([CountingEnv] * n, gc_freeze=True) as pool:
        gc.disable()  # (no automatic collection: only the pool's count)
        gc.callbacks.append(seen)
        try:
            built = gc.get_freeze_count()
            actions = pool.rand_action(await pool.reset())
            for _ in range(3):
                await pool.step(actions)
            for i in range(n):
                await pool.step_one(i, actions[i].clone())
        finally:
            gc.callbacks.remove(seen)
            gc.enable()
        assert gc.get_freeze_count() > built  # they froze
        assert runs == []
