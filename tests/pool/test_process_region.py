"""One shared region for every worker of a process pool: each leaf of a like pool's slots is
one block of rows across all workers, so a whole batch's results are read in place (the
rows themselves, ``Stacked.owned`` False) and copied once by whoever keeps them (the pool's
step, a rollout's time rows). Checked: the layout, that kept results are never the rows the
next step writes, equality with the coroutine backend, and a respawned worker mapping the
same region."""

from __future__ import annotations

import os
import signal
import sys

import cloudpickle
import pytest
import torch
from tensordict import TensorDictBase

from aenv.pool._backend import Stacked

from .test_process_stacked import assert_same, until, walk_pool

pytestmark = pytest.mark.timeout(90)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _in_region(t: torch.Tensor, flat: torch.Tensor) -> bool:
    start = flat.data_ptr()
    return start <= t.data_ptr() < start + flat.numel()


async def test_every_worker_maps_one_region_and_results_are_read_in_place():
    async with walk_pool("process") as pool:
        backend = pool._backend
        workers = backend._workers
        assert len(workers) == 2
        flat = workers[0].flat
        assert all(w.flat is flat for w in workers)  # one mapping in the parent
        # each worker its own descriptor (each closed with its worker)
        fds = [w.region_fd for w in workers]
        assert len(set(fds)) == 2 and all(fd >= 0 for fd in fds)
        # each worker is told of its own envs' slots only, at offsets into the one region
        assert [sorted(w.layouts) for w in workers] == [[0, 1], [2, 3]]
        for stacked in backend._stacked:
            rows = stacked.rows("next")
            assert rows is not None and rows.batch_size == (4,)
            assert all(_in_region(v, flat) for v in rows.values(True, True))

        td = pool.rand_action(await pool.reset())
        call = backend.launch("step_and_maybe_reset", td, None)
        assert call is not None
        out = await call.wait()
        assert isinstance(out, Stacked) and not out.owned
        # the rows themselves: no copy was made to read them
        assert out.next is backend._stacked[0].rows("next")
        kept = out.owned_next()  # (the copy a consumer that keeps them takes)
        assert not any(_in_region(v, flat) for v in kept.values(True, True))
        assert_same(kept, out.next)


async def test_a_kept_step_result_is_not_the_rows_the_next_step_writes():
    async with walk_pool("process") as pool:
        await pool.set_seed(3)
        td = await pool.reset()
        flat = pool._backend._workers[0].flat
        results = []
        for _ in range(6):
            out, td = await pool.step_and_maybe_reset(pool.rand_action(td))
            for value in (*out.values(True, True), *td.values(True, True)):
                assert not _in_region(value, flat)
            # (the next input is the caller's to change: rand_action writes into it)
            results.append((out, out.clone()))
        for out, out_then in results:  # nothing changed under the kept results
            assert_same(out, out_then)


async def _rollouts(backend: str) -> list[TensorDictBase]:
    async with walk_pool(backend) as pool:
        await pool.set_seed(11)
        torch.manual_seed(0)
        return [await pool.rollout(9, break_when_any_done=False) for _ in range(2)]


async def test_rollouts_read_in_place_equal_the_coroutine_backend():
    expected = await _rollouts("coroutine")
    got = await _rollouts("process")
    for a, b in zip(expected, got, strict=True):
        assert_same(a, b)


async def test_a_respawned_worker_maps_the_same_region():
    async with walk_pool("process") as pool:
        backend = pool._backend
        flat = backend._workers[1].flat
        stacked = backend._stacked
        await pool.reset()  # (the pool's loop now watches the workers)
        victim = backend._workers[1].pid
        os.kill(victim, signal.SIGKILL)
        await until(lambda: backend._workers[1].pid not in (None, victim))
        await until(lambda: backend._workers[1].state == "ready")
        assert backend._workers[1].flat is flat and backend._stacked is stacked
        # its envs were rebuilt: after a reset, the pool steps as a fresh coroutine pool
        await pool.set_seed(5)
        torch.manual_seed(1)
        got = await pool.rollout(7, break_when_any_done=False)
    async with walk_pool("coroutine") as ref:
        await ref.set_seed(5)
        torch.manual_seed(1)
        expected = await ref.rollout(7, break_when_any_done=False)
    assert_same(expected, got)
