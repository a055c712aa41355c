"""DMControlWrapper / DMControlEnv over dm_control's suite and a plain dm_env env."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch

# MuJoCo picks its GL backend at import; without a display only EGL renders
if not os.environ.get("DISPLAY"):
    os.environ.setdefault("MUJOCO_GL", "egl")

pytest.importorskip(
    "dm_control", reason="dm_control is not installed (pip install 'aenv[dmcontrol]')"
)

import dm_env
from dm_control import suite
from dm_env import specs

from aenv import (
    AsyncEnvPool,
    SyncEnv,
    acheck_env_specs,
    check_env_specs,
    get_available_libraries,
)
from aenv.exceptions import SpecViolationError
from aenv.libs.dm_control import DMControlEnv, DMControlWrapper, from_dm_env_spec
from aenv.specs import Bounded, Categorical, Composite, Unbounded

pytestmark = pytest.mark.timeout(120)

TIME_LIMIT = 0.3  # seconds of cartpole: 30 control steps


def _push(position: np.ndarray | torch.Tensor) -> float:
    """Push the cart towards the middle (a deterministic policy of the observation)."""
    return float(np.clip(-2.0 * float(position[0]), -1.0, 1.0))


def _policy(td):
    # batched: one action per env of a pool; the same float64 arithmetic as _push
    td["action"] = (-2.0 * td["position"][..., :1]).clamp(-1.0, 1.0)
    return td


def _library_loop(seed: int, steps: int, frame_skip: int = 1) -> dict[str, list]:
    """dm_control's own loop: suite.load seeded through task_kwargs, the same policy."""
    env = suite.load("cartpole", "swingup", task_kwargs={"random": seed, "time_limit": TIME_LIMIT})
    ts = env.reset()
    seen: dict[str, list] = {"position": [ts.observation["position"]], "reward": [], "last": []}
    seen["velocity"] = [ts.observation["velocity"]]
    for _ in range(steps):
        action = np.array([_push(ts.observation["position"])])
        reward = 0.0
        for _ in range(frame_skip):
            ts = env.step(action)
            reward += ts.reward
            if ts.last():
                break
        seen["position"].append(ts.observation["position"])
        seen["velocity"].append(ts.observation["velocity"])
        seen["reward"].append(reward)
        seen["last"].append((ts.last(), ts.discount))
        if ts.last():
            break
    env.close()
    return seen


def _cartpole(**kwargs) -> DMControlEnv:
    return DMControlEnv("cartpole", "swingup", time_limit=TIME_LIMIT, **kwargs)


def test_available_libraries_lists_dm_control():
    assert get_available_libraries()["dm_control"] is True


async def test_seeded_rollout_matches_library_loop_and_truncates_at_time_limit():
    env = _cartpole()
    await acheck_env_specs(env)
    await env.set_seed(3)  # the task's generator, as task_kwargs={"random": 3} sets it
    ours = await env.rollout(100, _policy)
    ref = _library_loop(3, 100)
    assert ours.batch_size == (30,) == (len(ref["reward"]),)
    for key in ("position", "velocity"):
        want = torch.as_tensor(np.stack(ref[key]))
        assert torch.equal(ours[key], want[:-1]), key
        assert torch.equal(ours["next", key], want[1:]), key
    assert torch.equal(ours["next", "reward"].squeeze(-1), torch.as_tensor(ref["reward"]))
    # the time limit: a LAST step with discount 1, so truncated and not terminated
    assert ref["last"][-1] == (True, 1.0)
    assert ours["next", "truncated"].squeeze(-1).tolist() == [False] * 29 + [True]
    assert not ours["next", "terminated"].any()
    # reset(seed=) reseeds; another seed, another start
    again = await env.reset(seed=3)
    other = await env.reset(seed=4)
    assert torch.equal(again["position"], ours["position"][0])
    assert not torch.equal(other["position"], again["position"])
    await env.aclose()


def test_specs_of_suite_tasks():
    env = SyncEnv(DMControlEnv("walker", "walk", seed=0))
    check_env_specs(env)
    obs = env.observation_spec
    assert set(obs.keys()) == {"orientations", "height", "velocity"}
    assert obs["height"].shape == (1,)  # a dm_env scalar, stored as (1,)
    assert obs["orientations"].dtype == torch.float64
    action = env.action_spec
    assert isinstance(action, Bounded) and action.shape == (6,)
    assert action.low.tolist() == [-1.0] * 6 and action.high.tolist() == [1.0] * 6
    td = env.rollout(3)
    assert td["next", "height"].shape == (3, 1) and td["next", "reward"].dtype == torch.float64
    env.close()


class Corridor(dm_env.Environment):
    """A dm_env env (no dm_control): walk right with DiscreteArray actions, nested dict
    observations; reaching x = 3 terminates (discount 0), 8 steps truncate (discount 1)."""

    def __init__(self) -> None:
        self.x, self.t = 0, 0

    def observation_spec(self):
        return {
            "agent": {"x": specs.Array((), np.float32, "x")},
            "t": specs.BoundedArray((), np.int32, 0, 8, "t"),
        }

    def action_spec(self):
        return specs.DiscreteArray(3, name="move")  # 0: left, 1: stay, 2: right

    def _obs(self):
        return {"agent": {"x": np.float32(self.x)}, "t": np.int32(self.t)}

    def reset(self):
        self.x, self.t = 0, 0
        return dm_env.restart(self._obs())

    def step(self, action):
        self.x += int(action) - 1
        self.t += 1
        if self.x >= 3:
            return dm_env.termination(1.0, self._obs())
        if self.t >= 8:
            return dm_env.truncation(0.0, self._obs())
        return dm_env.transition(0.0, self._obs())


async def test_plain_dm_env_termination_nested_keys_and_discrete_actions():
    env = DMControlWrapper(Corridor())
    await acheck_env_specs(env)
    assert isinstance(env.action_spec, Categorical) and env.action_spec.n == 3
    assert env.observation_spec["agent", "x"].shape == (1,)
    assert isinstance(env.observation_spec["t"], Bounded)

    def right(td):
        td["action"] = torch.tensor(2)
        return td

    out = await env.rollout(20, right)
    assert out["next", "agent", "x"].squeeze(-1).tolist() == [1.0, 2.0, 3.0]
    assert out["next", "terminated"][-1].item() and not out["next", "truncated"][-1].item()
    assert out["next", "reward"].squeeze(-1).tolist() == [0.0, 0.0, 1.0]
    stay = await env.rollout(20, lambda td: td.set("action", torch.tensor(1)))
    assert stay.batch_size == (8,) and stay["next", "truncated"][-1].item()
    assert not stay["next", "terminated"].any()
    # a plain dm_env env has no dm_control task to seed
    with pytest.raises(TypeError, match="no dm_control task to seed"):
        await env.set_seed(0)
    await env.aclose()


def test_spec_conversion():
    spec = from_dm_env_spec(
        {
            "a": specs.BoundedArray((2,), np.float32, [-1.0, 0.0], 2.0),
            "b": specs.BoundedArray((), np.float64, -np.inf, np.inf),
            "c": {"d": specs.DiscreteArray(5, dtype=np.int32)},
        },
        scalars_as_vectors=True,
    )
    assert isinstance(spec, Composite)
    assert spec["a"].low.tolist() == [-1.0, 0.0] and spec["a"].high.tolist() == [2.0, 2.0]
    assert isinstance(spec["b"], Unbounded) and spec["b"].shape == (1,)
    assert spec["c", "d"].n == 5 and spec["c", "d"].dtype == torch.int32
    with pytest.raises(TypeError, match="no aenv spec"):
        from_dm_env_spec(specs.StringArray(()))


async def test_frame_skip_sums_rewards_over_the_library_loop():
    env = _cartpole(frame_skip=4)
    await env.set_seed(5)
    ours = await env.rollout(100, _policy)
    ref = _library_loop(5, 100, frame_skip=4)
    assert ours.batch_size == (8,)  # 30 control steps: 7 full skips and a short last one
    assert torch.equal(ours["next", "position"], torch.as_tensor(np.stack(ref["position"][1:])))
    assert torch.allclose(
        ours["next", "reward"].squeeze(-1), torch.as_tensor(ref["reward"]), rtol=0, atol=1e-12
    )
    assert ours["next", "truncated"][-1].item()
    await env.aclose()


@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_in_a_pool_matches_the_library_loop(backend):
    make = functools.partial(_cartpole)  # built in the worker: dm_control's env stays there
    async with AsyncEnvPool([make] * 2, backend=backend) as pool:
        await pool.set_seed(7)  # env i: seed 7 + i
        out = await pool.rollout(10, _policy, break_when_any_done=False)
    assert out.batch_size == (2, 10)
    for i in range(2):
        ref = _library_loop(7 + i, 10)
        assert torch.equal(out["position"][i], torch.as_tensor(np.stack(ref["position"][:-1])))
        assert torch.equal(
            out["next", "reward"][i].squeeze(-1),
            torch.as_tensor(ref["reward"], dtype=torch.float64),
        )


async def test_pixels_from_a_process_pool():
    make = functools.partial(_cartpole, from_pixels=True, render_kwargs={"height": 24, "width": 32})
    async with AsyncEnvPool([make], backend="process") as pool:
        await pool.set_seed(4)
        td = await pool.reset()
    # rendered (EGL) in the worker process: the frame of dm_control's own env, same seed
    ref = suite.load("cartpole", "swingup", task_kwargs={"random": 4, "time_limit": TIME_LIMIT})
    ref.reset()
    assert np.array_equal(td["pixels"][0].numpy(), ref.physics.render(24, 32, camera_id=0))
    ref.close()


async def test_pixels_are_the_physics_render():
    env = _cartpole(from_pixels=True, render_kwargs={"height": 48, "width": 64})
    assert env.observation_spec["pixels"].shape == (48, 64, 3)
    td = await env.reset(seed=2)
    assert td["pixels"].dtype == torch.uint8
    out = await env.rollout(5, _policy, auto_reset=False, tensordict=td)
    # dm_control's own render of the same seeded states
    ref = suite.load("cartpole", "swingup", task_kwargs={"random": 2, "time_limit": TIME_LIMIT})
    ts = ref.reset()
    assert np.array_equal(out["pixels"][0].numpy(), ref.physics.render(48, 64, camera_id=0))
    for _ in range(5):
        ts = ref.step(np.array([_push(ts.observation["position"])]))
    last = ref.physics.render(48, 64, camera_id=0)
    assert np.array_equal(out["next", "pixels"][-1].numpy(), last)
    assert not torch.equal(out["next", "pixels"][-1], out["pixels"][0])  # the pole moved
    ref.close()
    await env.aclose()
    only = _cartpole(from_pixels=True, pixels_only=True, render_kwargs={"height": 24, "width": 32})
    assert set(only.observation_spec.keys()) == {"pixels"}
    assert set((await only.reset(seed=0)).keys()) == {"pixels", "done", "terminated", "truncated"}
    await only.aclose()


def test_bad_inputs_are_named():
    with pytest.raises(TypeError, match=r"wraps a dm_env\.Environment, got str"):
        DMControlWrapper("cartpole")
    with pytest.raises(
        ValueError, match=r"unknown dm_control task \('cartpole', 'nope'\).*swingup"
    ):
        DMControlEnv("cartpole", "nope")
    with pytest.raises(ValueError, match=r"unknown dm_control task .*domains"):
        DMControlEnv("nowhere", "walk")
    with pytest.raises(ValueError, match="pixels_only=True needs from_pixels=True"):
        _cartpole(pixels_only=True)
    with pytest.raises(ValueError, match="needs a dm_control env"):
        DMControlWrapper(Corridor(), from_pixels=True)
    env = SyncEnv(_cartpole())
    td = env.reset()
    td["action"] = torch.zeros(2, dtype=torch.float64)  # cartpole has one actuator
    with pytest.raises(
        SpecViolationError, match=r"action 'action' has shape \(2,\), expected \(1,\)"
    ):
        env.step(td)
    env.close()
