"""Steps with a ``"_step"`` mask as one whole-batch call (the rows of in-process envs, the
stacked blocks of process workers) against the per-env path: the same values, resets and
errors, the envs sitting the step out keeping their values, on ``step`` and
``step_and_maybe_reset``."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
from tensordict import TensorDictBase

from aenv import AsyncEnvPool, GymEnv, PendulumEnv
from aenv.exceptions import PoolError
from aenv.pool._backend import Backend
from aenv.pool._coroutine import CoroutineBackend
from aenv.pool._process import ProcessBackend
from aenv.testing import CountingEnv

from .test_process_stacked import assert_same

pytestmark = pytest.mark.timeout(180)

N = 4
ENVS = {
    "cartpole": partial(GymEnv, "CartPole-v1"),
    "cartpole-categorical": partial(GymEnv, "CartPole-v1", categorical_action_encoding=True),
    "counting": partial(CountingEnv, max_steps=3),
    "pendulum": PendulumEnv,
}


def _masks(steps: int) -> list[torch.Tensor]:
    """Seeded masks: mostly partial, some all set, some all clear."""
    g = torch.Generator().manual_seed(3)
    out = []
    for t in range(steps):
        if t % 7 == 3:
            out.append(torch.ones(N, dtype=torch.bool))
        elif t % 11 == 5:
            out.append(torch.zeros(N, dtype=torch.bool))
        else:
            out.append(torch.rand(N, generator=g) < 0.6)
    return out


def _spy(monkeypatch: pytest.MonkeyPatch, backend: str) -> list[int]:
    """How many envs each masked whole-batch call stepped."""
    sizes: list[int] = []
    if backend == "coroutine":
        from aenv.pool import _rows

        real = _rows.Rows.run

        def spy(self: Any, envs: Any, op: str, inputs: Any, indices: Any = None) -> Any:
            sizes.append(len(envs) if indices is None else len(indices))
            return real(self, envs, op, inputs, indices)

        monkeypatch.setattr(_rows.Rows, "run", spy)
    else:
        real_send = ProcessBackend._send_stacked

        def spy_send(self: Any, batch: Any, step_timeout: Any) -> None:
            stepping = batch.stepping
            sizes.append(len(batch.indices) if stepping is None else len(stepping))
            real_send(self, batch, step_timeout)

        monkeypatch.setattr(ProcessBackend, "_send_stacked", spy_send)
    return sizes


async def _run(make: Any, backend: str, whole: bool) -> list[TensorDictBase]:
    options = {"num_workers": 2} if backend == "process" else {}
    out = []
    async with AsyncEnvPool([make] * N, backend=backend, backend_options=options) as pool:
        await pool.set_seed(5)
        torch.manual_seed(1)
        td = await pool.reset()
        for t, mask in enumerate(_masks(36)):
            td = pool.rand_action(td)
            td.set("_step", mask)
            if t % 3 == 2:
                stepped = await pool.step(td)
                td = pool._step_mdp(stepped)
                td.pop("_step", None)
                if bool(td["done"].any()):
                    td.set("_reset", td["done"].clone())
                    td = await pool.reset(td)
            else:
                stepped, td = await pool.step_and_maybe_reset(td)
                td.pop("_step", None)
            out.append(stepped.exclude("_step").clone())
            out.append(td.clone())
        # an env that sits the step out while done is reset by step_and_maybe_reset too
        td = pool.rand_action(td)
        done = td["done"].clone()
        done[0] = True
        td.set("done", done)
        td.set("_step", torch.tensor([False] + [True] * (N - 1)))
        stepped, td = await pool.step_and_maybe_reset(td)
        out.append(stepped.exclude("_step").clone())
        out.append(td.exclude("_step").clone())
    return out


@pytest.mark.parametrize("backend", ["coroutine", "process"])
@pytest.mark.parametrize("name", list(ENVS))
async def test_masked_whole_batch_steps_equal_the_per_env_path(name, backend, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(CoroutineBackend, "launch", Backend.launch)
        expected = await _run(ENVS[name], "coroutine", False)
    sizes = _spy(monkeypatch, backend)
    got = await _run(ENVS[name], backend, True)
    if name != "pendulum":  # (no episode ends)
        assert any(bool(t["next", "done"].any()) for t in expected[::2])
    for a, b in zip(expected, got, strict=True):
        assert_same(a, b)
    if name.startswith("cartpole") or (backend == "process" and name == "counting"):
        # partial masks went whole-batch with only the selected envs stepping (envs that
        # write their rows in this process; flat specs in the workers' blocks)
        assert any(0 < s < N for s in sizes), sizes
        partial_steps = sum(1 for m in _masks(36) if 0 < int(m.sum()) < N)
        assert sum(1 for s in sizes if s < N) >= partial_steps


class _Raising(CountingEnv):
    """Env 2 of a pool fails its second step (the envs are built afresh on a restart)."""

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.steps = getattr(self, "steps", 0) + 1
        if self.start_val == 2 and self.steps == 2:
            raise ValueError("env two fails")
        return super()._step(tensordict)


@pytest.mark.parametrize("backend", ["coroutine", "process"])
@pytest.mark.parametrize("op", ["step", "step_and_maybe_reset"])
async def test_a_failure_in_a_masked_step_names_its_env(backend, op):
    fns = [partial(_Raising, max_steps=50, start_val=v) for v in range(N)]
    options = {"num_workers": 2} if backend == "process" else {}
    async with AsyncEnvPool(fns, backend=backend, backend_options=options) as pool:
        td = await pool.reset()
        td = pool.rand_action(td)
        _, td = await pool.step_and_maybe_reset(td)
        td = pool.rand_action(td)
        td.set("_step", torch.tensor([False, True, True, False]))
        with pytest.raises(PoolError) as info:
            await getattr(pool, op)(td)
        assert set(info.value.errors) == {2}
        assert "env two fails" in str(info.value)


@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_restart_after_a_failure_in_a_masked_step(backend):
    fns = [partial(_Raising, max_steps=50, start_val=v) for v in range(N)]
    options = {"num_workers": 2} if backend == "process" else {}
    async with AsyncEnvPool(
        fns, backend=backend, backend_options=options, on_error="restart"
    ) as pool:
        td = await pool.reset()
        stepped, td = await pool.step_and_maybe_reset(pool.rand_action(td))
        td = pool.rand_action(td)
        before = td["observation"].clone()
        td.set("_step", torch.tensor([False, True, True, False]))
        stepped, td = await pool.step_and_maybe_reset(td)
        nxt = stepped["next"]
        # env 2 failed and was restarted: its step ends its episode (not terminated)
        assert nxt["done"].view(N).tolist() == [False, False, True, False]
        assert not nxt["terminated"].any()
        assert pool.last_errors[2] is not None
        # envs 0 and 3 sat the step out with their values; env 1 stepped
        assert torch.equal(nxt["observation"][[0, 3]], before[[0, 3]])
        assert not torch.equal(nxt["observation"][1], before[1])
        assert nxt["reward"][[0, 3]].eq(0).all()
