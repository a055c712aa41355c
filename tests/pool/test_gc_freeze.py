"""The collector policy of big in-process pools (``gc_freeze``, :mod:`aenv.pool._gc`)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from aenv.pool import AsyncEnvPool
from aenv.pool._gc import FREEZE_FROM
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
    async with AsyncEnvPool([CountingEnv] * 3) as pool:
        await pool.reset()
        assert gc.get_freeze_count() == 0
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
