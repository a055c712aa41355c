"""Attribute and method fan-out: ``env.name`` on a batched env reaches every sub-env.

On the sync facades a method read gives a callable that calls the method in every sub-env
(in its thread or worker process) and an attribute read returns one value per sub-env,
each in one runner hop; the async pool never does I/O behind an attribute read and points
to the awaited ``get_attr`` / ``call`` instead.
"""

from __future__ import annotations

import os
import sys

import cloudpickle
import pytest
import torch

from aenv.pool import AsyncEnvPool
from aenv.sync import ParallelEnv, SerialEnv
from aenv.testing import CountingEnv
from aenv.transforms import StepCounter, TransformedEnv

pytestmark = pytest.mark.timeout(60)
cloudpickle.register_pickle_by_value(sys.modules[__name__])
os.environ.setdefault("AENV_START_METHOD", "forkserver")


class BumpEnv(CountingEnv):
    """A counting env with a custom method that changes its state where it lives."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.bumps = 0

    def bump(self, k: int = 1) -> tuple[int, int]:
        self.bumps += k
        return self.bumps, os.getpid()

    async def abump(self, k: int) -> int:
        self.bumps += k
        return self.bumps


def test_serial_env_method_fans_out_and_changes_sub_env_state():
    with SerialEnv(2, BumpEnv) as env:
        assert env.bumps == [0, 0]
        bump = env.bump
        assert callable(bump)
        assert [b for b, _ in bump(2)] == [2, 2]
        assert env.abump(3) == [5, 5]  # an async method is awaited in each sub-env
        assert env.bumps == [5, 5]
        assert env.shape == torch.Size([2])  # the pool's own attribute, not fanned out


def test_parallel_env_method_runs_in_the_workers():
    with ParallelEnv(2, BumpEnv, num_processes=2) as env:
        out = env.bump(1)
        assert [b for b, _ in out] == [1, 1]
        pids = {pid for _, pid in out}
        assert pids == set(env.worker_pids) and os.getpid() not in pids
        assert env.bumps == [1, 1]  # read back from the workers: the calls reached them


def test_thread_backend_and_transformed_pool_fan_out():
    with SerialEnv(3, BumpEnv, backend="thread") as env:
        env.bump(4)
        assert env.bumps == [4, 4, 4]
    from aenv.sync import SyncEnv

    pool = AsyncEnvPool((2, BumpEnv))
    with SyncEnv(TransformedEnv(pool, StepCounter())) as env:
        assert [b for b, _ in env.bump()] == [1, 1]
        assert env.bumps == [1, 1]


def test_unknown_name_is_an_attribute_error_in_one_hop():
    with SerialEnv(2, BumpEnv) as env:
        assert not hasattr(env, "no_such_attr")
        with pytest.raises(AttributeError, match="no_such_attr"):
            env.no_such_attr  # noqa: B018


async def test_async_process_pool_points_to_the_awaited_forms():
    async with AsyncEnvPool((2, BumpEnv), backend="process") as pool:
        with pytest.raises(AttributeError, match=r"await pool\.get_attr\('bumps'\)"):
            pool.bumps  # noqa: B018
        with pytest.raises(AttributeError, match=r"await pool\.call\('bump', \.\.\.\)"):
            pool.bump  # noqa: B018
        assert not hasattr(pool, "typo")
        assert [b for b, _ in await pool.call("bump", 2)] == [2, 2]
        assert await pool.get_attr("bumps") == [2, 2]
        assert pool.sub_env_has_method("bump") and not pool.sub_env_has_method("bumps")


@pytest.mark.parametrize("backend", ["coroutine", "thread"])
async def test_async_in_process_pool_reads_attributes_in_place(backend):
    # sub-envs in this process: a plain read is no I/O, one value per env
    async with AsyncEnvPool((2, BumpEnv), backend=backend) as pool:
        await pool.call("bump", 3)
        assert pool.bumps == [3, 3]
        assert not hasattr(pool, "typo")
