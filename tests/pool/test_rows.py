"""Whole-batch steps into rows (coroutine backend, :mod:`aenv.pool._rows`) against the
per-env path they replace: the same values, dtypes and shapes, resets included, for envs
that write their rows directly (gymnasium's plain path) and envs whose results are copied in,
and the per-env outcomes (errors, results the rows cannot hold) when a batch does not fit.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenv import AsyncEnvPool, GymEnv, GymWrapper, PendulumEnv
from aenv.exceptions import PoolError
from aenv.pool._backend import Backend
from aenv.pool._coroutine import CoroutineBackend
from aenv.testing import CountingEnv

_LAUNCH = CoroutineBackend.launch  # (the rows path; Backend.launch takes nothing)

pytestmark = pytest.mark.timeout(120)

ENVS = {
    "cartpole": partial(GymEnv, "CartPole-v1"),
    "cartpole-categorical": partial(GymEnv, "CartPole-v1", categorical_action_encoding=True),
    "frozenlake": partial(GymEnv, "FrozenLake-v1"),
    "gym-pendulum": partial(GymEnv, "Pendulum-v1"),
    "counting": partial(CountingEnv, max_steps=3),
    "pendulum": PendulumEnv,
}


async def _run(make: Any, rows: bool, monkeypatch: pytest.MonkeyPatch) -> list[TensorDictBase]:
    monkeypatch.setattr(CoroutineBackend, "launch", _LAUNCH if rows else Backend.launch)
    taken = _spy_rows(monkeypatch) if rows else []
    out = []
    async with AsyncEnvPool([make] * 3) as pool:
        await pool.set_seed(5)
        torch.manual_seed(1)
        td = await pool.reset()
        for _ in range(40):
            stepped, td = await pool.step_and_maybe_reset(pool.rand_action(td))
            out.append(stepped.clone())
        out.append(td.clone())
        out.append(await pool.step(pool.rand_action(td)))
    if rows:
        assert set(taken) <= {"Stacked"}  # batches went into the rows whole
        # an env writing its rows itself keeps them; one handing back TensorDicts is let
        # go to the per-env path after its first batch (copying in costs more), and one
        # whose specs cannot be planned flat never takes them
        if name_writes_directly(make):
            assert len(taken) == 41
        else:
            assert len(taken) <= 1
    return out


def _spy_rows(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record what each whole-batch step into the rows gave: "Stacked" or "list"."""
    from aenv.pool import _rows

    taken: list[str] = []
    real = _rows.Rows.run

    def spy(self: Any, *args: Any) -> Any:
        out = real(self, *args)
        taken.append(type(out).__name__)
        return out

    monkeypatch.setattr(_rows.Rows, "run", spy)
    return taken


def name_writes_directly(make: Any) -> bool:
    return getattr(make, "func", None) is GymEnv


@pytest.mark.parametrize("name", list(ENVS))
async def test_rows_give_the_per_env_path_results(name, monkeypatch):
    expected = await _run(ENVS[name], False, monkeypatch)
    got = await _run(ENVS[name], True, monkeypatch)
    if name in ("cartpole", "counting"):
        assert any(bool(t["next", "done"].any()) for t in expected[:-2])  # resets inside
    for a, b in zip(expected, got, strict=True):
        keys = sorted(a.keys(True, True), key=str)
        assert keys == sorted(b.keys(True, True), key=str)
        for key in keys:
            x, y = a.get(key), b.get(key)
            assert x.dtype == y.dtype and x.shape == y.shape, key
            assert torch.equal(x, y), key


class _Extra(CountingEnv):
    """Env 1 of a pool adds a key no spec declares: its result cannot go into its row."""

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = super()._step(tensordict)
        if self.start_val == 1:
            out.set("extra", torch.ones(1))
        return out


class _Raising(CountingEnv):
    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self.start_val == 1:
            raise ValueError("env one fails")
        return super()._step(tensordict)


async def test_a_result_the_rows_cannot_hold_comes_back_per_env():
    fns = [partial(_Extra, max_steps=10, start_val=v) for v in (0, 1, 0)]
    async with AsyncEnvPool(fns, stack="lazy") as pool:
        td = await pool.reset()
    # dense stacking refuses differing keys, lazy does not take the rows: the per-env
    # outcomes of the rows still carry env 1's extra key to the pool
    from aenv.pool._rows import Rows

    envs = [fn() for fn in fns]
    rows = Rows(envs)
    inputs = [TensorDict({"action": torch.zeros(1, dtype=torch.int64)}, []) for _ in envs]
    for env in envs:
        await env.reset()
    assert rows.takes(envs, "step", inputs)
    out = rows.run(envs, "step", inputs)
    assert isinstance(out, list)
    assert "extra" in out[1].keys() and "extra" not in out[0].keys()
    assert out[0]["observation"].item() == 1 and out[1]["observation"].item() == 2
    del td


async def test_an_error_in_one_env_keeps_the_others_results():
    fns = [partial(_Raising, max_steps=10, start_val=v) for v in (0, 1, 0)]
    async with AsyncEnvPool(fns) as pool:
        td = await pool.reset()
        with pytest.raises(PoolError) as info:
            await pool.step(pool.rand_action(td))
        assert sorted(info.value.errors) == [1]
        assert "env one fails" in str(info.value.errors[1])
        # the others stepped, exactly once
        assert info.value.results[0]["observation"].item() == 1


class _Scribbling(GymEnv):
    """Writes into its step input (a bare env's input is its own to change)."""

    seen: list[list[str]] = []

    async def _step_into(self, tensordict: TensorDictBase, out: Any) -> Any:
        self.seen.append(sorted(tensordict.keys()))
        tensordict.set("scribble", torch.ones(()))
        return await super()._step_into(tensordict, out)


async def test_inputs_go_through_the_input_rows_and_stay_planned(monkeypatch):
    # a whole batch's input is copied into the input rows (one copy per entry), each env
    # reading its row; an env that writes into its input leaves no entry for the next step
    from aenv.pool import _rows

    staged = []
    real_stage = _rows.Rows.stage

    def spy(self: Any, td: Any) -> Any:
        out = real_stage(self, td)
        staged.append(out is not None)
        return out

    monkeypatch.setattr(_rows.Rows, "stage", spy)
    _Scribbling.seen.clear()
    async with AsyncEnvPool([partial(_Scribbling, "CartPole-v1")] * 2) as pool:
        await pool.set_seed(0)
        td = await pool.reset()
        for _ in range(3):
            td = pool.rand_action(td)
            action = td["action"].clone()
            stepped, td = await pool.step_and_maybe_reset(td)
            assert torch.equal(stepped["action"], action)
    assert staged and all(staged)
    planned = ["action", "done", "observation", "terminated", "truncated"]
    # every step's input held the planned entries only: the scribble did not stay
    assert _Scribbling.seen == [planned] * 6


class _FlakyGym:
    """A gymnasium env that raises on its third step after each reset when ``fail``."""

    def __new__(cls, fail: bool) -> Any:
        import gymnasium as gym
        import numpy as np

        class Flaky(gym.Env):
            observation_space = gym.spaces.Box(-100.0, 100.0, (1,), dtype=np.float32)
            action_space = gym.spaces.Discrete(2)

            def reset(self, *, seed: Any = None, options: Any = None) -> Any:
                super().reset(seed=seed)
                self.count = 0
                return np.zeros(1, dtype=np.float32), {}

            def step(self, action: Any) -> Any:
                self.count += 1
                if fail and self.count == 3:
                    raise RuntimeError("flaky step")
                obs = np.full(1, self.count + int(action), dtype=np.float32)
                return obs, 1.0, False, False, {}

        return GymWrapper(Flaky())


@pytest.mark.parametrize("op", ["step", "step_and_maybe_reset"])
async def test_restart_policy_keeps_the_rows_path(op, monkeypatch):
    # on_error="restart" no longer turns the rows off: a failed env is restarted as on
    # the per-env path (rebuilt, reset, reported truncated) and the results are the same

    async def run(rows: bool) -> tuple[list[TensorDictBase], list[str], dict[int, str]]:
        monkeypatch.setattr(CoroutineBackend, "launch", _LAUNCH if rows else Backend.launch)
        taken = _spy_rows(monkeypatch)
        fns = [partial(_FlakyGym, fail) for fail in (False, True, False)]
        out = []
        async with AsyncEnvPool(fns, on_error="restart") as pool:
            td = await pool.reset()
            for _ in range(5):
                td = pool.rand_action(td)
                if op == "step":
                    stepped = await pool.step(td)
                    td = pool.step_mdp(stepped)
                else:
                    stepped, td = await pool.step_and_maybe_reset(td)
                out.append(stepped.clone())
            errors = {i: str(e) for i, e in pool.last_errors.items()}
        return out, taken, errors

    torch.manual_seed(0)
    expected, _, expected_errors = await run(False)
    torch.manual_seed(0)
    got, taken, errors = await run(True)
    assert "list" in taken and "Stacked" in taken  # the failing batch came back per env
    assert sorted(errors) == sorted(expected_errors) == [1]
    assert "flaky step" in errors[1]
    for a, b in zip(expected, got, strict=True):
        assert sorted(a.keys(True, True), key=str) == sorted(b.keys(True, True), key=str)
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key
    # the third step of env 1 was reported truncated, with the fresh env's observation
    third = got[2]
    assert third["next", "truncated"][1].all() and not third["next", "truncated"][0].any()
    assert third["next", "observation"][1].item() == 0.0


async def test_max_concurrency_keeps_the_rows_path(monkeypatch):
    # a concurrency cap keeps the rows: a batch of 4 envs goes in waves of 2, each wave
    # one whole-batch call into the rows, with the results of the uncapped path
    async def run(rows: bool) -> tuple[list[TensorDictBase], list[str]]:
        monkeypatch.setattr(CoroutineBackend, "launch", _LAUNCH if rows else Backend.launch)
        taken = _spy_rows(monkeypatch)
        out = []
        async with AsyncEnvPool([ENVS["cartpole"]] * 4, max_concurrency=2) as pool:
            await pool.set_seed(3)
            torch.manual_seed(3)
            td = await pool.reset()
            for _ in range(30):
                stepped, td = await pool.step_and_maybe_reset(pool.rand_action(td))
                out.append(stepped.clone())
        return out, taken

    expected, _ = await run(False)
    got, taken = await run(True)
    assert taken == ["Stacked"] * 60
    for a, b in zip(expected, got, strict=True):
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key
