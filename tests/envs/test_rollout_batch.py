"""Batched envs' rollouts in time rows (aenv/envs/_rollout_batch.py): pools on every backend,
a batched env, random actions and policies, episode ends, hand-overs and failures, each
equal to the same rollout kept as per-step TensorDicts (the rows switched off)."""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

import cloudpickle
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenv import GymEnv, PoolError
from aenv.envs import _rollout
from aenv.envs._common import EnvBase
from aenv.pool import AsyncEnvPool
from aenv.testing import CountingEnv, FailingEnv

pytestmark = pytest.mark.timeout(120)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

BACKENDS = ["coroutine", "thread", "process"]


class ExtraEntryEnv(CountingEnv):
    """A counting env whose step ``extra_at`` (counted since built) carries an entry no
    row holds."""

    def __init__(self, extra_at: int = -1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.extra_at = extra_at
        self.total = 0

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.total += 1
        out = super()._step(tensordict)
        if self.total == self.extra_at:
            out.set("extra", torch.ones(1))
        return out


def _pool(backend: str, fns: list[Any]) -> AsyncEnvPool:
    options: dict[str, Any] = {}
    if backend == "process":
        options = {"num_workers": 2, "start_method": "forkserver"}
    return AsyncEnvPool(fns, backend=backend, backend_options=options)


def _counting(i: int) -> EnvBase:
    return CountingEnv(max_steps=3 + i)


ENVS = {
    "counting": [partial(_counting, i) for i in range(4)],
    "cartpole-onehot": [partial(GymEnv, "CartPole-v1")] * 4,
    "cartpole-categorical": [partial(GymEnv, "CartPole-v1", categorical_action_encoding=True)] * 4,
}


def _policy(env: EnvBase) -> Any:
    return env.rand_action


def _extra_key_policy(env: EnvBase) -> Any:
    # from step 4 on, the policy writes a key more: rows hand over to TensorDicts
    calls = [0]

    def policy(td: TensorDictBase) -> TensorDictBase:
        calls[0] += 1
        td = env.rand_action(td)
        if calls[0] > 4:
            td.set("extra", torch.ones(td.batch_size))
        return td

    return policy


def _extras_policy(env: EnvBase) -> Any:
    # writes "logits" at every step, from the ones it was handed (carried on by step_mdp):
    # time rows keep them per step as the actions, and carry the last ones on
    def policy(td: TensorDictBase) -> TensorDictBase:
        before = td.get("logits", None)
        td.set("logits", torch.zeros(*td.batch_size, 2) if before is None else before + 1)
        return env.rand_action(td)

    return policy


CASES = {
    "random-through-ends": (40, None, {"break_when_any_done": False}),
    "random-until-done": (40, None, {}),
    "random-2": (2, None, {"break_when_any_done": False}),
    "policy-through-ends": (30, _policy, {"break_when_any_done": False}),
    "policy-extra-key": (20, _extra_key_policy, {"break_when_any_done": False}),
    "policy-extras": (20, _extras_policy, {"break_when_any_done": False}),
}


def _assert_same(a: TensorDictBase, b: TensorDictBase) -> None:
    assert type(a) is type(b) and a.batch_size == b.batch_size and a.names == b.names
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        va, vb = a.get(key), b.get(key)
        assert va.dtype == vb.dtype and va.shape == vb.shape, key
        assert torch.equal(va, vb), key
        assert va.is_contiguous() and vb.is_contiguous(), key


def _spy_rows(monkeypatch: pytest.MonkeyPatch, cls: Any = _rollout._BatchRows) -> list[bool]:
    """Whether each rollout made time rows of ``cls`` (appended as it decides)."""
    made: list[bool] = []
    make = cls.make

    def spy(*args: Any, **kwargs: Any) -> Any:
        rows = make(*args, **kwargs)
        made.append(rows is not None)
        return rows

    monkeypatch.setattr(cls, "make", staticmethod(spy))
    return made


async def _both(
    cls: type, make_env: Any, run: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[Any], list[Any], list[bool]]:
    """``run(env)`` with time rows, then with the rows off (per-step TensorDicts): what
    each gave, and whether rows were made on the first."""
    made = _spy_rows(monkeypatch)
    outs: list[Any] = []
    used: list[bool] = []
    for rows in (True, False):
        made.clear()
        with monkeypatch.context() as m:
            if not rows:
                m.setattr(cls, "_rollout_stepper", lambda self, plain: None)
            env = make_env()
            try:
                outs.append(await run(env))
            finally:
                await env.aclose()
        used.append(made == [True])
    return outs, used, made


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(ENVS))
@pytest.mark.parametrize("backend", BACKENDS)
async def test_pool_rollout_in_rows_equals_per_step_tensordicts(backend, name, case, monkeypatch):
    if backend == "process" and name == "counting" and case != "random-through-ends":
        pytest.skip("(the process backend runs the gym envs' cases and one counting case)")
    steps, make_policy, kwargs = CASES[case]
    made = _spy_rows(monkeypatch)
    outs, rngs, tails, used = [], [], [], []
    for rows in (True, False):
        made.clear()
        with monkeypatch.context() as m:
            if not rows:
                m.setattr(AsyncEnvPool, "_rollout_stepper", lambda self, plain: None)
            async with _pool(backend, ENVS[name]) as pool:
                await pool.set_seed(3)
                torch.manual_seed(3)
                policy = make_policy(pool) if make_policy is not None else None
                outs.append(await pool.rollout(steps, policy, **kwargs))
                used.append(made == [True])
                rngs.append(torch.get_rng_state())
                # where the rollout left the envs: a further one from there
                tails.append(
                    await pool.rollout(
                        5,
                        break_when_any_done=False,
                        auto_reset=False,
                        tensordict=pool.step_mdp(outs[-1][..., -1]),
                    )
                )
    # rows where the policy keeps to the planned keys for more than one step
    assert used == [steps > 1, False]
    _assert_same(*outs)
    _assert_same(*tails)
    assert torch.equal(*rngs)
    out = outs[0]
    assert out.batch_size == (4, out.batch_size[-1]) and out.names == [None, "time"]
    if not kwargs.get("break_when_any_done", True):
        assert out.batch_size[-1] == steps
        if name == "counting" and steps > 10:
            # episode ends, at different steps in different envs, reset inside the rollout
            done = out["next", "done"].squeeze(-1)
            assert done.sum() >= 8 and not torch.equal(done[0], done[3])
            after = out["observation"][..., 1:, 0][done[:, :-1]]
            assert (after == 0).all()  # the input after an end is the reset's
            assert (out["next", "observation"][done] > 0).all()  # the end's "next" kept
    else:
        assert not out["next", "done"][..., :-1].any()


@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_results_the_rows_cannot_hold_hand_over_after_the_step(backend, monkeypatch):
    # env 2's fourth step carries an entry no row holds: the step is kept as a TensorDict,
    # the rows hand over, and the rollout goes on (no step taken twice)
    fns = [partial(ExtraEntryEnv, extra_at=4 if i == 2 else -1, max_steps=5) for i in range(4)]

    async def run(pool: AsyncEnvPool) -> Any:
        torch.manual_seed(0)
        out = await pool.rollout(12, break_when_any_done=False)
        return out, await pool.get_attr("total"), torch.rand(3)

    outs, used, _ = await _both(AsyncEnvPool, lambda: _pool(backend, fns), run, monkeypatch)
    assert used == [True, False]
    (a, totals_a, rand_a), (b, totals_b, rand_b) = outs
    assert a.batch_size == b.batch_size == (4, 12)
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        assert torch.equal(a.get(key), b.get(key)), key
    assert totals_a == totals_b == [12] * 4
    assert torch.equal(rand_a, rand_b)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_failure_keeps_the_steps_before_it(backend, monkeypatch):
    fns = [partial(FailingEnv, fail_after=6 if i == 1 else 100, max_steps=4) for i in range(4)]

    async def run(pool: AsyncEnvPool) -> Any:
        torch.manual_seed(1)
        with pytest.raises(PoolError) as info:
            await pool.rollout(20, break_when_any_done=False)
        return info.value, await pool.get_attr("total_steps"), torch.rand(3)

    outs, used, _ = await _both(AsyncEnvPool, lambda: _pool(backend, fns), run, monkeypatch)
    assert used == [True, False]
    (err_a, totals_a, rand_a), (err_b, totals_b, rand_b) = outs
    assert sorted(err_a.errors) == sorted(err_b.errors) == [1]
    assert "boom" in str(err_a.errors[1])
    # the six steps before the failed one are the caller's, equal both ways
    _assert_same(err_a.rollout, err_b.rollout)
    assert err_a.rollout.batch_size == (4, 6)
    assert err_a.rollout["next", "done"].any()  # an episode ended (and reset) before
    assert totals_a == totals_b == [7, 6, 7, 7]  # no env stepped past the failed step
    assert torch.equal(rand_a, rand_b)


@pytest.mark.parametrize("policy", [False, True])
async def test_batched_env_rollout_in_rows(policy, monkeypatch):
    # an env with a batch size of its own (no pool): its step and reset hooks, batched
    def make() -> CountingEnv:
        return CountingEnv(max_steps=torch.tensor([2, 3, 5]), batch_size=(3,))

    async def run(env: CountingEnv) -> Any:
        torch.manual_seed(4)
        out = await env.rollout(15, env.rand_action if policy else None, break_when_any_done=False)
        return out, env.count.clone(), torch.rand(3)

    outs, used, _ = await _both(EnvBase, make, run, monkeypatch)
    assert used == [True, False]
    (a, count_a, rand_a), (b, count_b, rand_b) = outs
    _assert_same(a, b)
    assert torch.equal(count_a, count_b) and torch.equal(rand_a, rand_b)
    done = a["next", "done"].squeeze(-1)
    assert done.sum(-1).tolist() == [7, 5, 3]  # each element's own episode ends


async def test_pool_rows_follow_a_given_tensordict_and_set_truncated(monkeypatch):
    fns = ENVS["cartpole-onehot"]

    async def run(pool: AsyncEnvPool) -> Any:
        await pool.set_seed(5)
        torch.manual_seed(5)
        td = await pool.reset()
        return await pool.rollout(
            30, auto_reset=False, tensordict=td, break_when_any_done=False, set_truncated=True
        )

    outs, used, _ = await _both(AsyncEnvPool, lambda: _pool("coroutine", fns), run, monkeypatch)
    assert used == [True, False]
    _assert_same(*outs)
    last = outs[0]["next"][..., -1]
    assert last["truncated"].all() and last["done"].all()
    assert not outs[0]["next", "truncated"][:, :-1].any()


async def test_rows_reread_a_results_tensordict_whose_tensors_changed(monkeypatch):
    # the rows keep the checks and numpy views of a TensorDict handed out again (a pool's
    # bank rows); a changed tensor or an added key is checked again, not read stale
    kept: list[Any] = []
    make = _rollout._BatchRows.make

    def spy(*args: Any, **kwargs: Any) -> Any:
        rows = make(*args, **kwargs)
        kept.append(rows)
        return rows

    monkeypatch.setattr(_rollout._BatchRows, "make", staticmethod(spy))
    env = CountingEnv(max_steps=torch.tensor([2, 3, 5]), batch_size=(3,))
    try:
        await env.rollout(4, break_when_any_done=False)
    finally:
        await env.aclose()
    rows = kept[0]
    nxt = TensorDict(
        {key: torch.zeros(shape, dtype=dtype) for key, _, shape, dtype in rows.next_plan},
        batch_size=(3,),
    )
    first = rows._leaves(nxt, rows.next_plan)
    assert first is not None and rows._leaves(nxt, rows.next_plan) is first  # kept
    key, _, shape, dtype = rows.next_plan[0]
    replaced = torch.ones(shape, dtype=dtype)
    nxt.set(key, replaced)
    again = rows._leaves(nxt, rows.next_plan)
    assert again is not None and again is not first
    assert again[0].ctypes.data == replaced.data_ptr()  # the new tensor's memory
    nxt.set(key, torch.ones(shape, dtype=torch.float64))
    assert rows._leaves(nxt, rows.next_plan) is None  # no longer fits
    nxt.set(key, replaced)
    assert rows._leaves(nxt, rows.next_plan) is not None
    nxt.set("extra", torch.ones(3))
    assert rows._leaves(nxt, rows.next_plan) is None  # a key no row holds
    assert rows._leaves(nxt, rows.carried_plan, exact=False) is not None  # (reset rows)


async def test_single_env_rows_keep_a_policys_extras(monkeypatch):
    """An unbatched env's time rows keep the tensors a policy writes besides its actions,
    per step, and hand the last ones on as step_mdp does: the rollout equals the per-step
    TensorDicts' (a callback turns the rows off), episode ends included."""
    made = _spy_rows(monkeypatch, _rollout._TimeRows)
    outs = []
    for callback in (None, lambda env, td: None):
        env = GymEnv("CartPole-v1")
        await env.set_seed(1)
        torch.manual_seed(1)
        outs.append(await env.rollout(60, _extras_policy(env), callback, break_when_any_done=False))
    assert made == [True]
    _assert_same(*outs)
    assert outs[0]["next", "done"].sum() >= 1
    assert outs[0]["logits"][:, 0].tolist() == [float(t) for t in range(60)]
