"""A fault policy does not change the data path: under ``on_error="restart"`` and
``"observe"`` whole-batch steps still go through the backend's whole-batch operation
(``launch``: stacked rows or per-env payloads), and give exactly what the per-env tickets
give: the same values, the failed env's step truncated after its restart, the same error
entries."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
from tensordict import TensorDictBase, is_leaf_nontensor

from aenv import AsyncEnvPool
from aenv.pool._dispatch import ERROR_KEYS
from aenv.testing import FailingEnv

from .test_process_stacked import spy_launches

pytestmark = pytest.mark.timeout(180)

N = 3
STEPS = 7


def _fns() -> list[Any]:
    # env 1 fails on its 3rd step, env 2 on its 5th (and again 5 steps after each rebuild)
    return [
        partial(FailingEnv, fail_after=100, max_steps=4),
        partial(FailingEnv, fail_after=2, message="kaboom", max_steps=4),
        partial(FailingEnv, fail_after=4, exc_type=ValueError, message="bad", max_steps=4),
    ]


def _tickets_only(pool: AsyncEnvPool) -> None:
    """Send every call of ``pool`` through per-env tickets (the reference path)."""
    pool._backend.launch = lambda *args, **kwargs: None  # type: ignore[method-assign]


def _plain(td: TensorDictBase) -> dict[str, Any]:
    """Every entry of ``td`` as plain values (error strings as lists)."""
    out: dict[str, Any] = {}
    for key in td.keys(True, True, is_leaf=is_leaf_nontensor):
        name = key[-1] if isinstance(key, tuple) else key
        value = td.get(key)
        if name in ERROR_KEYS:
            out[str(key)] = list(value.tolist()) if hasattr(value, "tolist") else value
        else:
            out[str(key)] = value.tolist()
    return out


def _messages(values: list[Any]) -> list[str]:
    # (tracebacks name files and lines: compare their first line only)
    return [v.splitlines()[0] if v else v for v in values]


async def _run(pool: AsyncEnvPool, op: str) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    td = await pool.reset()
    seen = []
    for _ in range(STEPS):
        td = pool.rand_action(td)
        if op == "step":
            stepped = await pool.step(td)
            td = pool.step_mdp(stepped)
            done = stepped["next", "done"].reshape(N, -1).any(-1)
            if bool(done.any()):
                td = await pool.reset(td.set("_reset", done.unsqueeze(-1)))
        else:
            stepped, td = await pool.step_and_maybe_reset(td)
        assert not any(key in td.keys() for key in ERROR_KEYS)
        seen.append(_plain(stepped))
        seen.append(_plain(td))
    for rec in seen:
        for key in list(rec):
            if "error_traceback" in key:
                rec[key] = _messages(rec[key])
    return seen


@pytest.mark.parametrize("op", ["step", "step_and_maybe_reset"])
@pytest.mark.parametrize("on_error", ["restart", "observe"])
@pytest.mark.parametrize("backend", ["coroutine", "thread", "process"])
async def test_fault_policies_keep_the_whole_batch_path(backend, on_error, op, monkeypatch):
    kw: dict[str, Any] = {"num_workers": 2} if backend == "process" else {}
    calls: list[str] = []
    async with (
        AsyncEnvPool(_fns(), backend=backend, on_error=on_error, **kw) as fast,
        AsyncEnvPool(_fns(), backend=backend, on_error=on_error, **kw) as slow,
    ):
        _tickets_only(slow)
        backend_cls = type(fast._backend)
        launch = backend_cls.launch

        def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
            call = launch(self, *args, **kwargs)
            if self is fast._backend:
                calls.append("launch" if call is not None else "not taken")
            return call

        monkeypatch.setattr(backend_cls, "launch", spy)
        got = await _run(fast, op)
        want = await _run(slow, op)
    assert got == want
    # the failures happened, and were restarted: steps that end without terminating (the
    # restarted env's observation starts again from 0)
    flat = [rec for rec in got if "('next', 'done')" in rec]
    ended = [
        (
            rec["('next', 'done')"][1],
            rec["('next', 'terminated')"][1],
            rec["('next', 'observation')"][1],
        )
        for rec in flat
    ]
    assert ([True], [False], [0.0]) in ended
    if on_error == "observe":
        kinds = [rec["('next', 'error_type')"] for rec in flat]
        assert ["", "RuntimeError", ""] in kinds
        assert any(k[2] == "ValueError" for k in kinds)
    # every whole-batch step took a whole-batch call
    if backend == "thread":  # (no whole-batch operation: per-env tickets)
        assert "launch" not in calls
    else:
        assert len(calls) >= STEPS


@pytest.mark.parametrize("on_error", ["restart", "observe"])
@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_rollouts_keep_the_whole_batch_path(backend, on_error, monkeypatch):
    kw: dict[str, Any] = {"num_workers": 2} if backend == "process" else {}
    launches = spy_launches(monkeypatch)
    async with (
        AsyncEnvPool(_fns(), backend=backend, on_error=on_error, **kw) as fast,
        AsyncEnvPool(_fns(), backend=backend, on_error=on_error, **kw) as slow,
    ):
        torch.manual_seed(0)
        got = await fast.rollout(STEPS, break_when_any_done=False)
        _tickets_only(slow)
        torch.manual_seed(0)
        want = await slow.rollout(STEPS, break_when_any_done=False)
    assert got.batch_size == want.batch_size == torch.Size([N, STEPS])
    assert _same_but_tracebacks(got, want)
    # env 1's third step failed and was restarted
    assert got["next", "done"][1, 2].item() and not got["next", "terminated"][1, 2].item()
    if on_error == "observe":
        assert got["next", "error_type"].tolist()[1][2] == "RuntimeError"
        # a step's error entries stay in its "next": they are no step's input
        assert not any(key in got.keys() for key in ERROR_KEYS)
    if backend == "process" and on_error == "restart":
        # consecutive steps overlapped (sent ahead by the backend) under the fault policy
        assert launches.chained


def _same_but_tracebacks(a: TensorDictBase, b: TensorDictBase) -> bool:
    pa, pb = _plain(a), _plain(b)
    for rec in (pa, pb):
        for key in list(rec):
            if "error_traceback" in key:
                rec[key] = [[v.splitlines()[0] if v else v for v in row] for row in rec[key]]
    return pa == pb


@pytest.mark.parametrize("backend", ["coroutine", "thread", "process"])
async def test_streamed_steps_under_observe_carry_each_envs_error_entries(backend):
    # a receive whose results all went well gets its empty error entries once for its
    # batch; one holding a restarted env's step (with its error's entries) gives the
    # others theirs one by one: either way each env's step carries its own
    kw: dict[str, Any] = {"num_workers": 2} if backend == "process" else {}
    kinds = []
    async with AsyncEnvPool(_fns(), backend=backend, on_error="observe", **kw) as pool:
        td, envs = await pool.reset(), list(range(N))
        for _ in range(STEPS):
            pool.async_step_and_maybe_reset_send(pool.rand_action(td), env_index=envs)
            out, td = await pool.async_step_and_maybe_reset_recv(min_get=N)
            envs = td["env_index"]
            got = {int(step["env_index"]): step["next", "error_type"] for step in out.unbind(0)}
            kinds.append([got[i] for i in range(N)])
            # (a step's error entries are no step's input)
            assert not any(key in td.keys() for key in ERROR_KEYS)
    assert kinds[0] == ["", "", ""]
    assert kinds[2] == ["", "RuntimeError", ""]  # env 1's third step
    assert any(k == ["", "", "ValueError"] for k in kinds)
