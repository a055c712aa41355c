"""GymWrapper's row hooks: a process worker's step of a GymEnv, and the reset after an
episode's end, written straight into the env's shared-memory rows (``EnvBase._step_into``,
``EnvBase._reset_into`` overridden by the wrapper's plain path).

Each step written must hold exactly what the default hooks give (``env.step``), each reset
what ``env.reset`` gives for a done env (values, dtypes, shapes, the env state it leaves, a
pending seed used once), the overrides must step aside (to the defaults) whenever the plain
path may not run, and a process pool of GymEnvs must give the coroutine pool's rollouts,
resets inside included.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

import cloudpickle
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.libs._gym_env import _RESET_ROW, _STEP_ROW
from aenv.libs.gym import GymEnv
from aenv.pool import AsyncEnvPool
from aenv.pool._ops import drive

pytestmark = pytest.mark.timeout(120)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = ("observation", "reward", "terminated", "truncated", "done")
RESET_KEYS = ("observation", "terminated", "truncated", "done")
ENVS = [
    ("CartPole-v1", {}),
    ("CartPole-v1", {"categorical_action_encoding": True}),
    ("Pendulum-v1", {}),
    ("MountainCarContinuous-v0", {}),
    ("FrozenLake-v1", {}),  # discrete observation: the reader path, not a plain array copy
]


def step_into(env: GymEnv, td: TensorDictBase, leaves: dict[str, torch.Tensor]) -> Any:
    """The env's step hook into a row made of ``leaves`` (as a worker's result slot)."""
    return drive(env._step_into(td, TensorDict(leaves, [])))


def writes(env: GymEnv, leaves: dict[str, torch.Tensor], reset: bool = False) -> bool:
    """Whether the env's hook writes into a row made of ``leaves`` (not: the default)."""
    row = TensorDict(leaves, [])
    keys = _RESET_ROW if reset else _STEP_ROW
    return (
        env._row_views(row, keys) is not None
        and env._plain_now()
        and not (env.run_type_checks or env.blocking)
    )


def leaves_for(env: GymEnv, reset: bool = False) -> dict[str, torch.Tensor]:
    """Tensors shaped as a result slot's leaves for ``env`` (a reset slot's with ``reset``),
    zeroed, the flags True (a writer must clear them)."""
    out = {}
    groups = [env.full_observation_spec, env.full_done_spec]
    if not reset:
        groups.insert(1, env.full_reward_spec)
    for group in groups:
        for key in group.keys():
            out[key] = group[key].zero()
            if out[key].dtype == torch.bool:
                out[key].fill_(True)
    return out


@pytest.mark.parametrize(("env_id", "kwargs"), ENVS, ids=[f"{e}{k}" for e, k in ENVS])
async def test_written_steps_equal_env_steps(env_id, kwargs):
    written, stepped = GymEnv(env_id, **kwargs), GymEnv(env_id, **kwargs)
    leaves = leaves_for(written)
    assert writes(written, leaves)
    torch.manual_seed(0)
    tds = [await written.reset(seed=3), await stepped.reset(seed=3)]
    episodes = 0
    for _ in range(250):
        action = written.rand_action(tds[0].clone())
        done = step_into(written, action, leaves)
        expected = (await stepped.step(action.clone()))["next"]
        assert type(done) is bool
        for key in KEYS:
            got, want = leaves[key], expected[key]
            assert got.dtype == want.dtype and got.shape == want.shape, key
            assert torch.equal(got, want), key
        assert done == bool(expected["done"])
        if done:
            episodes += 1
            tds = [await written.reset(seed=episodes), await stepped.reset(seed=episodes)]
    if env_id == "CartPole-v1":
        assert episodes > 3  # episode ends were written too


async def test_the_hooks_step_aside_where_the_plain_path_may_not_run():
    env = GymEnv("CartPole-v1")
    leaves = leaves_for(env)
    assert writes(env, leaves)
    # a leaf more, a leaf less, another dtype or shape: a row it cannot fill
    assert not writes(env, {**leaves, "extra": torch.zeros(1)})
    assert not writes(env, {k: v for k, v in leaves.items() if k != "truncated"})
    assert not writes(env, {**leaves, "reward": torch.zeros(1, dtype=torch.float64)})
    assert not writes(env, {**leaves, "observation": torch.zeros(5)})
    await env.reset(seed=0)
    action = env.rand_action()
    out = step_into(env, action, {**leaves, "extra": torch.zeros(1)})
    assert isinstance(out, TensorDictBase) and set(out.keys()) == set(KEYS)
    # type checks on: the default hook (nothing written)
    env.run_type_checks = True
    assert isinstance(step_into(env, action, leaves), TensorDictBase)
    env.run_type_checks = False

    # a replaced step or reader (class or instance): the default hooks, which call it
    class Subclass(GymEnv):
        def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
            return super()._step(tensordict)

    from aenv.envs import EnvBase

    assert Subclass._step_into is EnvBase._step_into
    assert Subclass._reset_into is EnvBase._reset_into

    class Doubled(GymEnv):
        def read_reward(self, reward: Any) -> torch.Tensor:
            return super().read_reward(reward) * 2

    doubled = Doubled("CartPole-v1")
    assert not writes(doubled, leaves_for(doubled))
    await doubled.reset(seed=0)
    assert (await doubled.rand_step())["next", "reward"].item() == 2.0
    other = GymEnv("CartPole-v1")
    other.read_obs = lambda obs: {"observation": torch.zeros(4)}  # type: ignore[method-assign]
    assert not writes(other, leaves)
    await other.reset(seed=0)
    assert torch.equal((await other.rand_step())["next", "observation"], torch.zeros(4))
    pixels = GymEnv("CartPole-v1", from_pixels=True, pixels_only=False, render_mode="rgb_array")
    assert not writes(pixels, leaves_for(pixels))


async def test_a_kept_row_follows_instance_assignments_made_between_steps():
    # a pool writes the same rows every step: an extension point assigned on the instance
    # after a written step (or removed again) decides the next step
    env = GymEnv("CartPole-v1")
    row = TensorDict(leaves_for(env), [])
    await env.reset(seed=0)
    action = env.rand_action()
    assert isinstance(drive(env._step_into(action, row)), bool)
    env.read_obs = lambda obs: {"observation": torch.full((4,), 3.0)}  # type: ignore[method-assign]
    out = drive(env._step_into(action, row))
    assert isinstance(out, TensorDictBase)
    assert torch.equal(out["observation"], torch.full((4,), 3.0))
    del env.read_obs
    assert isinstance(drive(env._step_into(action, row)), bool)
    env.blocking = True  # (a thread's work: the default hook, which runs it there)
    assert not env._writes_rows_now()
    env.blocking = False
    assert isinstance(drive(env._step_into(action, row)), bool)
    env.run_type_checks = True  # (output checks: the default hook, on the kept row too)
    assert isinstance(drive(env._step_into(action, row)), TensorDictBase)
    env.run_type_checks = False
    assert isinstance(drive(env._step_into(action, row)), bool)
    env.info_dict_reader.append(lambda info, td: td)  # (a reader added in place)
    assert isinstance(drive(env._step_into(action, row)), TensorDictBase)
    env.info_dict_reader.clear()
    assert isinstance(drive(env._step_into(action, row)), bool)
    env._step = env._step  # type: ignore[method-assign]
    assert not env._writes_rows_now() and not env._plain_now()
    await env.aclose()


async def test_two_rows_taking_turns_each_get_their_own_step():
    # a process worker's two banks of result slots take turns (both rows kept): each step
    # lands in the row it is given and leaves the other one as it was, and an extension
    # point assigned on the instance decides on both kept rows
    written, stepped = GymEnv("CartPole-v1"), GymEnv("CartPole-v1")
    rows = [TensorDict(leaves_for(written), []) for _ in range(2)]
    await written.reset(seed=1)
    await stepped.reset(seed=1)
    torch.manual_seed(0)
    episodes = 0
    for t in range(60):
        row, other = rows[t % 2], rows[1 - t % 2]
        kept = other.clone()
        action = written.rand_action()
        done = drive(written._step_into(action, row))
        expected = (await stepped.step(action.clone()))["next"]
        assert isinstance(done, bool)
        for key in KEYS:
            assert torch.equal(row[key], expected[key]), key
            assert torch.equal(other[key], kept[key]), key
        if done:
            episodes += 1
            await written.reset(seed=episodes)
            await stepped.reset(seed=episodes)
    assert episodes >= 1
    written.read_obs = lambda obs: {"observation": torch.full((4,), 3.0)}  # type: ignore[method-assign]
    for row in rows:
        out = drive(written._step_into(written.rand_action(), row))
        assert isinstance(out, TensorDictBase)
        assert torch.equal(out["observation"], torch.full((4,), 3.0))
    await written.aclose()
    await stepped.aclose()


async def test_an_observation_off_its_spec_comes_back_as_a_tensordict():
    # a reader giving another shape than the slot's: nothing half-written is passed off
    # as the step, the caller gets the step's TensorDict to finish as usual
    env = GymEnv("CartPole-v1")
    leaves = leaves_for(env)
    shape = env._fast_obs[2]
    env._fast_obs = (lambda obs: torch.zeros(2), None, shape)
    await env.reset(seed=0)
    out = step_into(env, TensorDict({"action": torch.tensor([0, 1])}, []), leaves)
    assert isinstance(out, TensorDictBase)
    assert torch.equal(out["observation"], torch.zeros(2))
    assert set(out.keys()) == set(KEYS)


async def _reset_as_a_pool_would(env: GymEnv, stepped: TensorDictBase) -> TensorDictBase:
    """The generic reset of a step-and-maybe-reset whose step ended the episode (the
    whole env flagged in ``"_reset"`` when it did not end)."""
    reset_input = env._step_mdp(stepped)
    if not env._any_done_write_reset(reset_input):
        reset_input.set("_reset", torch.ones_like(reset_input["done"]))
    return await env.reset(reset_input)


@pytest.mark.parametrize(("env_id", "kwargs"), ENVS, ids=[f"{e}{k}" for e, k in ENVS])
async def test_written_resets_equal_env_resets(env_id, kwargs):
    written, stepped = GymEnv(env_id, **kwargs), GymEnv(env_id, **kwargs)
    leaves = leaves_for(written, reset=True)
    step_leaves = leaves_for(written)
    assert writes(written, leaves, reset=True) and writes(written, step_leaves)

    def write_reset() -> Any:
        return drive(written._reset_into(TensorDict(), TensorDict(leaves, [])))

    torch.manual_seed(0)
    td = await written.reset(seed=3)
    await stepped.reset(seed=3)
    resets = 0
    for t in range(400):
        action = written.rand_action(td.clone())
        expected = await stepped.step(action.clone())
        if not step_into(written, action, step_leaves) and t % 50 != 49:
            continue
        # an episode's end (or, every 50 steps, a reset the step did not call for): the
        # written reset against the generic one, a pending seed taken every other time
        if resets % 2:
            await written.set_seed(resets)
            await stepped.set_seed(resets)
        for value in leaves.values():
            value.zero_() if value.dtype != torch.bool else value.fill_(True)
        assert write_reset() is True
        want = await _reset_as_a_pool_would(stepped, expected.clone())
        assert sorted(want.keys()) == sorted(RESET_KEYS)
        for key in RESET_KEYS:
            got, ref = leaves[key], want[key]
            assert got.dtype == ref.dtype and got.shape == ref.shape, key
            assert torch.equal(got, ref), key
        resets += 1
    assert resets >= 8
    # the pending seeds were used once: the next unseeded resets still agree
    assert write_reset() is True
    want = await stepped.reset()
    assert torch.equal(leaves["observation"], want["observation"])


async def test_the_reset_hook_steps_aside_where_it_should():
    env = GymEnv("CartPole-v1")
    leaves = leaves_for(env, reset=True)
    assert writes(env, leaves, reset=True)
    assert not writes(env, {**leaves, "reward": torch.zeros(1)}, reset=True)
    assert not writes(env, {k: v for k, v in leaves.items() if k != "done"}, reset=True)
    assert not writes(env, {**leaves, "observation": torch.zeros(4, 1)}, reset=True)

    class Subclass(GymEnv):
        def _reset(self, tensordict: Any, **kwargs: Any) -> TensorDictBase:
            return super()._reset(tensordict, **kwargs)

    from aenv.envs import EnvBase

    assert Subclass._reset_into is EnvBase._reset_into
    # a closed env refuses, as reset() does, before touching the backend
    await env.aclose()
    with pytest.raises(Exception, match="closed"):
        drive(env._reset_into(TensorDict(), TensorDict(leaves, [])))


async def test_a_reset_observation_off_its_spec_comes_back_as_a_tensordict():
    env = GymEnv("CartPole-v1")
    leaves = leaves_for(env, reset=True)
    shape = env._fast_obs[2]
    env._fast_obs = (lambda obs: torch.zeros(2), None, shape)
    out = drive(env._reset_into(TensorDict(), TensorDict(leaves, [])))
    assert isinstance(out, TensorDictBase)
    assert torch.equal(out["observation"], torch.zeros(2))
    assert set(out.keys()) == set(RESET_KEYS)
    assert not any(out[k].any() for k in RESET_KEYS[1:])
    assert leaves["done"].all()  # nothing half-written


async def _pool_rollouts(backend: str) -> list[TensorDictBase]:
    options: dict[str, Any] = {}
    if backend == "process":
        options = {"num_workers": 2, "start_method": "forkserver"}
    fns = [partial(GymEnv, "CartPole-v1") for _ in range(4)]
    async with AsyncEnvPool(fns, backend=backend, backend_options=options) as pool:
        await pool.set_seed(11)
        torch.manual_seed(2)
        out = [await pool.rollout(60, break_when_any_done=False)]
        td = await pool.reset()
        for _ in range(30):
            stepped, td = await pool.step_and_maybe_reset(pool.rand_action(td))
            out.append(stepped.clone())
        out.append(await pool.step(pool.rand_action(td)))
        return out


async def test_process_pool_of_gym_envs_equals_the_coroutine_pool():
    expected = await _pool_rollouts("coroutine")
    got = await _pool_rollouts("process")
    # episodes ended inside the rollout (resets written by the workers)
    assert expected[0]["next", "done"].any()
    for a, b in zip(expected, got, strict=True):
        assert sorted(a.keys(True, True), key=str) == sorted(b.keys(True, True), key=str)
        for key in a.keys(True, True):
            x, y = a.get(key), b.get(key)
            assert x.dtype == y.dtype and x.shape == y.shape, key
            assert torch.equal(x, y), key
