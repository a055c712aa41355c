"""GymWrapper's whole-rollout path gives exactly what the generic rollout loop gives.

``GymWrapper._rollout_whole`` runs a plain rollout of a single CPU env as one gymnasium loop
into numpy buffers. Each test runs the same rollout twice, on two envs built and seeded
alike: once on the whole-rollout path and once on the generic loop (``_rollout_whole``
replaced by one returning None), then checks that the outputs are equal key by key (dtype,
shape, values, key order, batch size and names), that the torch random stream and the
gymnasium env were left in the same state, and that the path taken is the one expected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio.lowlevel
import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from aenv.exceptions import EnvClosedError, SpecViolationError
from aenv.libs.gym import DefaultInfoDictReader, GymEnv, GymWrapper
from aenv.specs import Bounded, Categorical, OneHot, Unbounded

ENVS = [
    ("CartPole-v1", {}),
    ("CartPole-v1", {"categorical_action_encoding": True}),
    ("Pendulum-v1", {}),
    ("FrozenLake-v1", {}),
    ("FrozenLake-v1", {"categorical_action_encoding": True}),
    ("MountainCarContinuous-v0", {}),
]
ENV_IDS = [f"{name}{'-cat' if kw else ''}" for name, kw in ENVS]


class OffsetEnv(gym.Env):
    """Index-shifted spaces (MultiDiscrete observation, Discrete action, both with a
    ``start``), numpy scalar rewards and flags; an episode ends at an edge or after 7 steps."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = spaces.MultiDiscrete([5, 5], start=[-2, -2])
        self.action_space = spaces.Discrete(3, start=-1)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.s = self.np_random.integers(-1, 2, size=2)
        self.t = 0
        return self.s.copy(), {}

    def step(self, action: Any):
        self.s = np.clip(self.s + np.array([action, -action]), -2, 2)
        self.t += 1
        terminated = np.bool_(abs(self.s[0]) == 2)
        return self.s.copy(), np.float64(self.s.sum()), terminated, self.t >= 7, {}


class Float64ObsEnv(gym.Env):
    """A float32 Box observation returned as float64 arrays (the reader casts them)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-10.0, 10.0, shape=(3,), dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.x = self.np_random.uniform(-1, 1, size=3)
        self.t = 0
        return self.x.copy(), {}

    def step(self, action: Any):
        a = np.asarray(action, dtype=np.float64)
        self.x = self.x + 0.1 * np.array([a[0], a[1], a[0] - a[1]]) + 1e-3
        self.t += 1
        terminated = bool(np.abs(self.x).max() > 1.3)
        return self.x.copy(), float(-np.abs(self.x).sum()), terminated, self.t >= 11, {}


class FailingEnv(gym.Env):
    """Raises on its ``fail_step``-th step or ``fail_reset``-th reset (counted over its life);
    episodes last 5 steps."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, box: bool, fail_step: int = 0, fail_reset: int = 0) -> None:
        self.observation_space = spaces.Box(-1e3, 1e3, shape=(1,), dtype=np.float32)
        if box:
            self.action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        else:
            self.action_space = spaces.Discrete(2)
        self.fail_step, self.fail_reset = fail_step, fail_reset
        self.steps = self.resets = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.resets += 1
        if self.resets == self.fail_reset:
            raise RuntimeError(f"reset {self.resets} failed")
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: Any):
        self.steps += 1
        if self.steps == self.fail_step:
            raise RuntimeError(f"step {self.steps} failed")
        self.t += 1
        obs = np.array([self.t + float(np.asarray(action).sum())], np.float32)
        return obs, 1.0, self.t >= 5, False, {}


def _make(name: str, kwargs: dict[str, Any]) -> GymWrapper:
    if name == "offset":
        return GymWrapper(OffsetEnv(), **kwargs)
    if name == "float64":
        return GymWrapper(Float64ObsEnv(), **kwargs)
    return GymEnv(name, **kwargs)


async def _none(*args: Any, **kwargs: Any) -> None:
    return None


def _force_generic(env: GymWrapper) -> GymWrapper:
    env._rollout_whole = _none  # type: ignore[method-assign]
    return env


def _spy(env: GymWrapper) -> list[bool]:
    """Record, per rollout, whether the whole-rollout path ran it."""
    used: list[bool] = []
    original = env._rollout_whole

    async def spy(*args: Any, **kwargs: Any) -> Any:
        out = await original(*args, **kwargs)
        used.append(out is not None)
        return out

    env._rollout_whole = spy  # type: ignore[method-assign]
    return used


def assert_same(a: TensorDictBase, b: TensorDictBase) -> None:
    assert type(a) is type(b)
    assert a.batch_size == b.batch_size
    assert a.names == b.names
    assert a.device == b.device
    assert list(a.keys()) == list(b.keys())
    assert list(a.keys(True, True)) == list(b.keys(True, True))
    for key in a.keys(True):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, TensorDictBase):
            assert isinstance(vb, TensorDictBase), key
            assert va.batch_size == vb.batch_size and va.names == vb.names, key
            assert list(va.keys()) == list(vb.keys()), key
            continue
        assert va.dtype == vb.dtype, key
        assert va.shape == vb.shape, key
        assert torch.equal(va, vb), key


PolicyMaker = Callable[[GymWrapper], Callable[..., Any]]


async def _pair(
    name: str,
    kwargs: dict[str, Any],
    max_steps: int,
    make_policy: PolicyMaker | None = None,
    *,
    seed: int = 0,
    expect_whole: bool = True,
    **rollout_kw: Any,
) -> tuple[TensorDictBase, TensorDictBase]:
    """The same rollout on the whole-rollout path and on the generic loop (each with its own
    policy from ``make_policy``), compared; then one more generic rollout on each env, to
    compare the states they were left in."""
    fast, slow = _make(name, kwargs), _force_generic(_make(name, kwargs))
    used = _spy(fast)
    outs, after = [], []
    for env in (fast, slow):
        policy = make_policy(env) if make_policy is not None else None
        await env.set_seed(seed)
        torch.manual_seed(seed)
        outs.append(await env.rollout(max_steps, policy, **rollout_kw))
        after.append(torch.get_rng_state())
    assert used == [expect_whole]
    assert_same(*outs)
    assert torch.equal(after[0], after[1])
    _force_generic(fast)
    tails = []
    for env in (fast, slow):
        torch.manual_seed(seed + 1)
        tails.append(await env.rollout(25, break_when_any_done=False))
        await env.aclose()
    assert_same(*tails)
    return outs[0], outs[1]


def _linear_policy(env: GymWrapper, seed: int = 0) -> Callable[[TensorDictBase], TensorDictBase]:
    """A deterministic torch policy: a fixed linear map of the observation to an action."""
    spec = env.full_action_spec["action"]
    obs_dim = env.full_observation_spec["observation"].shape.numel()
    gen = torch.Generator().manual_seed(seed)
    if isinstance(spec, OneHot):
        weight = torch.randn(spec.n, obs_dim, generator=gen)

        def one_hot(td: TensorDictBase) -> TensorDictBase:
            idx = (weight @ td.get("observation").float().reshape(-1)).argmax()
            td.set("action", torch.nn.functional.one_hot(idx, spec.n).to(spec.dtype))
            return td

        return one_hot
    if isinstance(spec, Categorical):
        weight = torch.randn(spec.n, obs_dim, generator=gen)

        def categorical(td: TensorDictBase) -> TensorDictBase:
            idx = (weight @ td.get("observation").float().reshape(-1)).argmax()
            td.set("action", idx.to(spec.dtype))
            return td

        return categorical
    assert isinstance(spec, Bounded)
    weight = torch.randn(spec.shape.numel(), obs_dim, generator=gen)

    def box(td: TensorDictBase) -> TensorDictBase:
        x = torch.tanh(weight @ td.get("observation").float().reshape(-1))
        td.set("action", (x * spec.high).reshape(spec.shape).to(spec.dtype))
        return td

    return box


# ---------------------------------------------------------------------- random actions
@pytest.mark.parametrize("break_when_any_done", [False, True])
@pytest.mark.parametrize(("name", "kwargs"), ENVS, ids=ENV_IDS)
@pytest.mark.parametrize("max_steps", [1, 2, 300])
async def test_random_rollout_matches_generic(name, kwargs, max_steps, break_when_any_done):
    a, _ = await _pair(name, kwargs, max_steps, break_when_any_done=break_when_any_done)
    if break_when_any_done:
        assert int(a["next", "done"].sum()) <= 1
        assert int(a["next", "done"][:-1].sum()) == 0
    assert a.names == ["time"]


@pytest.mark.parametrize(("name", "kwargs"), ENVS, ids=ENV_IDS)
async def test_episodes_end_inside_the_rollout(name, kwargs):
    steps = 2100 if name.startswith("MountainCar") else 700  # truncated at 999 steps
    a, _ = await _pair(name, kwargs, steps, seed=3, break_when_any_done=False)
    # several episodes: the env reset inside the rollout, and the root observation after a
    # done is the reset's (not the step's)
    done = a["next", "done"].squeeze(-1)
    assert int(done.sum()) >= 2
    assert not a["done"].any() and not a["terminated"].any() and not a["truncated"].any()
    same = a["observation"][1:] == a["next", "observation"][:-1]
    assert same.reshape(same.shape[0], -1).all(-1)[~done[:-1]].all()


@pytest.mark.parametrize("name", ["offset", "float64"])
@pytest.mark.parametrize("kwargs", [{}, {"categorical_action_encoding": True}])
@pytest.mark.parametrize("break_when_any_done", [False, True])
async def test_custom_spaces_match_generic(name, kwargs, break_when_any_done):
    env = _make(name, kwargs)
    assert env._fast
    await env.aclose()
    await _pair(name, kwargs, 200, seed=1, break_when_any_done=break_when_any_done)


async def test_long_random_rollout_matches_generic():
    # more steps than a buffer chunk and an action batch
    await _pair("CartPole-v1", {}, 9000, seed=2, break_when_any_done=False)


async def test_break_rewinds_the_random_stream():
    # the rollout stops at the first done: random actions drawn ahead are given back, so the
    # torch stream goes on as after the generic loop (checked in _pair)
    a, _ = await _pair("CartPole-v1", {}, 10_000, seed=4, break_when_any_done=True)
    assert a.shape[0] < 200


async def test_blocking_random_rollout_matches_generic():
    await _pair("CartPole-v1", {"blocking": True}, 300, break_when_any_done=False)


@pytest.mark.parametrize("box", [False, True])
@pytest.mark.parametrize(("fail_step", "fail_reset"), [(37, 0), (0, 4)])
@pytest.mark.parametrize("break_when_any_done", [False, True])
async def test_backend_errors_leave_the_random_stream_as_the_generic_loop(
    box, fail_step, fail_reset, break_when_any_done
):
    results = []
    for generic in (False, True):
        env = GymWrapper(FailingEnv(box, fail_step, fail_reset))
        used = _spy(env)
        if generic:
            _force_generic(env)
        torch.manual_seed(0)
        steps = 10 if break_when_any_done else 100
        outcome: Any = None
        try:
            for _ in range(steps):  # with break_when_any_done, several short rollouts
                outcome = await env.rollout(100, break_when_any_done=break_when_any_done)
        except RuntimeError as exc:
            outcome = str(exc)
        results.append((outcome, torch.get_rng_state(), used))
    (a, state_a, used_a), (b, state_b, used_b) = results
    if isinstance(a, str):
        assert a == b
    else:
        assert_same(a, b)
    assert torch.equal(state_a, state_b)
    assert all(used_a) and not used_b


# ---------------------------------------------------------------------- policies
@pytest.mark.parametrize("break_when_any_done", [False, True])
@pytest.mark.parametrize(("name", "kwargs"), [*ENVS, ("offset", {})], ids=[*ENV_IDS, "offset"])
@pytest.mark.parametrize("max_steps", [1, 2, 300])
async def test_policy_rollout_matches_generic(name, kwargs, max_steps, break_when_any_done):
    await _pair(name, kwargs, max_steps, _linear_policy, break_when_any_done=break_when_any_done)


@pytest.mark.parametrize("break_when_any_done", [False, True])
async def test_async_policy_matches_generic(break_when_any_done):
    def make(env: GymWrapper) -> Callable[..., Any]:
        sync = _linear_policy(env)

        async def policy(td: TensorDictBase) -> TensorDictBase:
            await anyio.lowlevel.checkpoint()
            return sync(td)

        return policy

    await _pair("CartPole-v1", {}, 300, make, break_when_any_done=break_when_any_done)


async def test_policy_using_the_torch_stream_matches_generic():
    def policy(td: TensorDictBase) -> None:
        idx = torch.randint(0, 2, ())
        td.set("action", torch.nn.functional.one_hot(idx, 2))

    await _pair("CartPole-v1", {}, 400, lambda env: policy, seed=5, break_when_any_done=False)


async def test_policy_reading_the_done_flags():
    seen: list[tuple[str, ...]] = []

    def policy(td: TensorDictBase) -> TensorDictBase:
        seen.append(tuple(td.keys()))
        flags = td.get("done") | td.get("terminated") | td.get("truncated")
        idx = (td.get("observation")[2] > 0).long() + flags.long().sum() * 0
        td.set("action", torch.nn.functional.one_hot(idx, 2))
        return td

    await _pair("CartPole-v1", {}, 200, lambda env: policy, break_when_any_done=False)
    # the policy saw the same inputs (key order included) on both paths
    assert len(seen) == 400
    assert seen[:200] == seen[200:]


async def test_policy_with_extra_outputs_matches_generic():
    # an extra key from the first step on: the generic loop runs the rest of the rollout
    def policy(td: TensorDictBase) -> TensorDictBase:
        logits = td.get("observation")[:2] * 3
        td.set("logits", logits)
        td.set("action", torch.nn.functional.one_hot(logits.argmax(), 2))
        return td

    a, _ = await _pair("CartPole-v1", {}, 300, lambda env: policy, break_when_any_done=False)
    assert "logits" in a.keys()


@pytest.mark.parametrize("break_when_any_done", [False, True])
async def test_policy_switching_to_new_tensordicts_mid_rollout(break_when_any_done):
    # from the 40th call on, the policy returns a new tensordict: the rollout goes on in the
    # generic loop from that step
    def make(env: GymWrapper) -> Callable[..., Any]:
        calls = [0]

        def policy(td: TensorDictBase) -> TensorDictBase:
            calls[0] += 1
            idx = (td.get("observation")[2] > 0).long()
            action = torch.nn.functional.one_hot(idx, 2)
            if calls[0] >= 40:
                out = td.clone()
                out.set("action", action)
                return out
            td.set("action", action)
            return td

        return policy

    seed = 0 if break_when_any_done else 1
    a, _ = await _pair(
        "CartPole-v1", {}, 300, make, seed=seed, break_when_any_done=break_when_any_done
    )
    assert a.shape[0] > 40


async def test_policy_replacing_an_input_entry_matches_generic():
    # the stacked root holds what the policy left in its tensordict: a replaced observation
    def policy(td: TensorDictBase) -> TensorDictBase:
        obs = td.get("observation") * 2
        td.set("observation", obs)
        td.set("action", torch.nn.functional.one_hot((obs[2] > 0).long(), 2))
        return td

    a, _ = await _pair("CartPole-v1", {}, 200, lambda env: policy, break_when_any_done=False)
    assert not torch.equal(a["observation"][1:], a["next", "observation"][:-1])


async def test_policy_returning_none_writes_in_place():
    def policy(td: TensorDictBase) -> None:
        td.set("action", torch.nn.functional.one_hot((td.get("observation")[0] > 0).long(), 2))

    await _pair("CartPole-v1", {}, 200, lambda env: policy, break_when_any_done=False)


@pytest.mark.parametrize("bad", ["dtype", "shape", "not a tensordict"])
async def test_bad_policy_outputs_raise_as_the_generic_loop_does(bad):
    calls = [0]

    def policy(td: TensorDictBase) -> Any:
        calls[0] += 1
        action = torch.nn.functional.one_hot((td.get("observation")[2] > 0).long(), 2)
        if calls[0] == 30:  # a bad output at the 30th step
            if bad == "not a tensordict":
                return action
            # (a float the action dtype cannot hold: whole floats are cast)
            action = action.float() / 2 if bad == "dtype" else action[:1]
        td.set("action", action)
        return td

    errors = []
    for generic in (False, True):
        env = GymEnv("CartPole-v1")
        if generic:
            _force_generic(env)
        calls[0] = 0
        await env.set_seed(0)
        exc = SpecViolationError if bad != "not a tensordict" else TypeError
        with pytest.raises(exc) as info:
            await env.rollout(100, policy, break_when_any_done=False)
        errors.append(str(info.value))
        await env.aclose()
    assert errors[0] == errors[1]


# ---------------------------------------------------------------------- a given tensordict
@pytest.mark.parametrize("with_action", [False, True])
@pytest.mark.parametrize("use_policy", [False, True])
@pytest.mark.parametrize("break_when_any_done", [False, True])
async def test_given_tensordict_matches_generic(with_action, use_policy, break_when_any_done):
    outs, firsts = [], []
    for generic in (False, True):
        env = GymEnv("CartPole-v1")
        torch.manual_seed(0)
        td = await env.reset(seed=7)
        await env.rollout(3, break_when_any_done=False)  # the env moved on: td is stale
        used = _spy(env)
        if generic:
            _force_generic(env)
        await env.set_seed(11)  # used by the first reset inside the rollout
        if with_action:
            env.rand_action(td)
        policy = _linear_policy(env) if use_policy else None
        outs.append(
            await env.rollout(
                150,
                policy,
                auto_reset=False,
                tensordict=td,
                break_when_any_done=break_when_any_done,
            )
        )
        firsts.append(td)
        assert used == ([] if generic else [True])
        outs.append(torch.get_rng_state())
        await env.aclose()
    assert_same(outs[0], outs[2])
    assert torch.equal(outs[1], outs[3])
    # the given tensordict was stepped in place, as the generic loop steps it
    assert_same(firsts[0], firsts[1])


async def test_given_done_tensordict_is_reset_first():
    def done_td() -> TensorDictBase:
        return TensorDict(
            {
                "observation": torch.zeros(4),
                "done": torch.ones(1, dtype=torch.bool),
                "terminated": torch.ones(1, dtype=torch.bool),
                "truncated": torch.zeros(1, dtype=torch.bool),
            },
            batch_size=[],
        )

    outs = []
    for generic in (False, True):
        env = GymEnv("CartPole-v1")
        if generic:
            _force_generic(env)
        await env.reset(seed=0)
        torch.manual_seed(0)
        outs.append(await env.rollout(50, auto_reset=False, tensordict=done_td()))
        await env.aclose()
    assert_same(*outs)
    # what the input said was done was reset first (TorchRL's rule): the rollout starts
    # from a fresh observation, not from the done input's
    assert not outs[0]["done"].any()
    assert outs[0]["observation"][0].abs().sum() > 0


@pytest.mark.parametrize(
    "edit",
    ["extra key", "missing flag", "float64 observation", "batched", "nested"],
)
async def test_unusual_given_tensordicts_use_the_generic_loop(edit):
    outs = []
    for generic in (False, True):
        env = GymEnv("CartPole-v1", batch_size=[])
        env.batch_locked = False
        used = _spy(env)
        if generic:
            _force_generic(env)
        td = await env.reset(seed=0)
        if edit == "extra key":
            td.set("memory", torch.zeros(3))
        elif edit == "missing flag":
            del td["truncated"]
        elif edit == "float64 observation":
            td.set("observation", td.get("observation").double())
        elif edit == "batched":
            td = td.unsqueeze(0)
        else:
            td.set("extra", TensorDict({"x": torch.zeros(2)}, []))
        torch.manual_seed(0)
        try:
            outs.append(await env.rollout(40, auto_reset=False, tensordict=td))
        except Exception as exc:  # the generic loop's own verdict, the same on both
            outs.append(type(exc))
        assert used == ([] if generic else [False])
        await env.aclose()
    if isinstance(outs[0], type):
        assert outs[0] is outs[1]
    else:
        assert_same(*outs)


# ---------------------------------------------------------------------- not on this path
class _OwnStep(GymWrapper):
    """A subclass with its own ``_step``: the generic loop (which calls it) runs."""

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = super()._step(tensordict)
        out.set("reward", out.get("reward") * 2)
        return out


class _OwnRandAction(GymWrapper):
    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        td = super().rand_action(tensordict)
        td.set("action", torch.tensor([1, 0]))
        return td


async def _declined(env: GymWrapper, policy: Any = None, **kwargs: Any) -> TensorDictBase:
    used = _spy(env)
    out = await env.rollout(30, policy, break_when_any_done=False, **kwargs)
    assert used == [False]
    await env.aclose()
    return out


async def test_subclass_overriding_step_uses_the_generic_loop():
    out = await _declined(_OwnStep(gym.make("CartPole-v1")))
    assert torch.equal(out["next", "reward"], torch.full((30, 1), 2.0))


async def test_subclass_overriding_rand_action_uses_the_generic_loop():
    out = await _declined(_OwnRandAction(gym.make("CartPole-v1")))
    assert (out["action"] == torch.tensor([1, 0])).all()


async def test_instance_override_uses_the_generic_loop():
    env = GymEnv("CartPole-v1")
    calls = [0]
    base = env.rand_action

    def rand_action(td: Any = None) -> Any:
        calls[0] += 1
        return base(td)

    env.rand_action = rand_action  # type: ignore[method-assign]
    await _declined(env)
    assert calls[0] == 30


async def test_info_reader_uses_the_generic_loop():
    env = GymEnv("CartPole-v1")
    env.set_info_dict_reader(DefaultInfoDictReader(["x"], spec={"x": Unbounded(())}))
    out = await _declined(env)
    assert "x" in out["next"].keys()


async def test_vector_env_uses_the_generic_loop():
    env = GymEnv("CartPole-v1", num_envs=2)
    assert not env._fast
    out = await _declined(env)
    assert out.batch_size == (2, 30)


@pytest.mark.parametrize("kwargs", [{"run_type_checks": True}, {"frame_skip": 2}])
async def test_options_needing_the_generic_loop(kwargs):
    await _declined(GymEnv("CartPole-v1", **kwargs))


async def test_auto_reset_uses_the_generic_loop(self_resetting_cls):
    env = GymWrapper(self_resetting_cls(), auto_reset=True)
    assert not env._fast
    await _declined(env)


async def test_blocking_policy_uses_the_generic_loop():
    env = GymEnv("CartPole-v1", blocking=True)
    await _declined(env, _linear_policy(env))


async def test_tuple_observation_uses_the_generic_loop(tuple_env):
    env = GymWrapper(tuple_env)
    assert env._fast  # the per-step path takes it, the whole-rollout one does not
    await _declined(env)


async def test_closed_env_raises_as_the_generic_loop_does():
    env = GymEnv("CartPole-v1")
    await env.aclose()
    used = _spy(env)
    with pytest.raises(EnvClosedError):
        await env.rollout(10)
    assert used == [False]


async def test_policy_closing_the_env_mid_rollout():
    errors = []
    for generic in (False, True):
        env = GymEnv("CartPole-v1")
        if generic:
            _force_generic(env)
        calls = [0]

        async def policy(
            td: TensorDictBase, env: GymWrapper = env, calls: list[int] = calls
        ) -> TensorDictBase:
            calls[0] += 1
            if calls[0] == 20:
                await env.aclose()
            td.set("action", torch.nn.functional.one_hot(torch.tensor(calls[0] % 2), 2))
            return td

        with pytest.raises(EnvClosedError) as info:
            await env.rollout(50, policy, break_when_any_done=False)
        errors.append((str(info.value), calls[0]))
    assert errors[0] == errors[1]
