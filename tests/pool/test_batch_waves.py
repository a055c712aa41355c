"""``max_concurrency`` on the whole-batch operation: a batch of more envs than the cap goes
to the backend in waves of at most that many envs, each wave one whole-batch call
(:meth:`~aenv.pool._backend.Backend.launch`), with the uncapped pool's results; the envs
working at once, counted across the worker processes, never exceed the cap."""

from __future__ import annotations

import asyncio
import fcntl
import sys
from functools import partial
from typing import Any

import cloudpickle
import pytest
import torch
from tensordict import TensorDictBase

from aenv import AsyncEnvPool
from aenv.pool._process import ProcessBackend
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(90)
cloudpickle.register_pickle_by_value(sys.modules[__name__])
N, CAP = 6, 2


def _bump(path: str, delta: int) -> None:
    """Add ``delta`` to the count of envs at work kept in ``path`` (``"count peak"``),
    under a file lock shared by every worker process, and keep the peak."""
    with open(path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        count, peak = map(int, f.read().split())
        count += delta
        f.seek(0)
        f.truncate()
        f.write(f"{count} {max(peak, count)}")


class WorkingEnv(CountingEnv):
    """A counting env whose step is async and counted as "at work" while it runs (the
    worker runs async envs' steps as concurrent tasks)."""

    def __init__(self, path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.path = path

    async def _step(self, tensordict: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        _bump(self.path, 1)
        try:
            await asyncio.sleep(0.002)  # (lets the worker's other env tasks start meanwhile)
            return super()._step(tensordict)
        finally:
            _bump(self.path, -1)


async def _run(path: str, cap: int | None) -> list[TensorDictBase]:
    fns = [partial(WorkingEnv, path, max_steps=m) for m in (2, 3, 4, 2, 5, 3)]
    out = []
    async with AsyncEnvPool(fns, backend="process", num_workers=2, max_concurrency=cap) as pool:
        torch.manual_seed(0)
        td = await pool.reset()
        for _ in range(6):
            stepped, td = await pool.step_and_maybe_reset(pool.rand_action(td))
            out.append(stepped.clone())
        td["_step"] = torch.tensor([True, False, True, True, False, True])
        out.append(await pool.step(pool.rand_action(td)))
        out.append(await pool.rollout(7, break_when_any_done=False))
    return out


async def test_max_concurrency_steps_whole_batches_in_waves(tmp_path, monkeypatch):
    path = str(tmp_path / "at_work")
    with open(path, "w") as f:
        f.write("0 0")
    expected = await _run(path, None)
    with open(path, "w") as f:
        f.write("0 0")
    calls: list[tuple[str, int, bool]] = []
    submitted: list[str] = []
    launch, submit = ProcessBackend.launch, ProcessBackend.submit

    def spy_launch(self: Any, op: str, inputs: Any, timeout: Any, indices: Any = None, **kw: Any):
        call = launch(self, op, inputs, timeout, indices, **kw)
        calls.append((op, N if indices is None else len(indices), call is not None))
        return call

    def spy_submit(self: Any, env_index: int, op: str, payload: Any) -> None:
        submitted.append(op)
        submit(self, env_index, op, payload)

    monkeypatch.setattr(ProcessBackend, "launch", spy_launch)
    monkeypatch.setattr(ProcessBackend, "submit", spy_submit)
    got = await _run(path, CAP)
    for a, b in zip(expected, got, strict=True):
        assert sorted(a.keys(True, True), key=str) == sorted(b.keys(True, True), key=str)
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key
    # every whole-batch call went in waves of at most CAP envs, each taken by the backend
    # (none fell back to per-env tickets): 3 waves for 6 envs, 2 for the 4 a mask selects
    assert calls and all(size <= CAP and taken for _, size, taken in calls)
    assert not any(op in ("step", "step_and_maybe_reset") for op in submitted)
    steps = [c for c in calls if c[0] in ("step", "step_and_maybe_reset")]
    assert len(steps) == 3 * 6 + 2 + 3 * 7
    with open(path) as f:
        count, peak = map(int, f.read().split())
    assert count == 0
    assert 1 <= peak <= CAP
