"""Transform / Compose / TransformedEnv machinery: hooks, specs, parents, clones, async."""

from __future__ import annotations

import asyncio

import pytest
import torch
from tensordict import TensorDict

from aenv import PendulumEnv, acheck_env_specs
from aenv.specs import Bounded, Unbounded
from aenv.testing import CountingEnv, NestedCountingEnv
from aenv.transforms import (
    Compose,
    DoubleToFloat,
    RewardSum,
    StepCounter,
    Transform,
    TransformedEnv,
)


class Double(Transform):
    def _apply_transform(self, value):
        return value * 2

    def _transform_spec(self, spec):
        return Unbounded(shape=spec.shape, dtype=spec.dtype)


class AsyncAddOne(Transform):
    """A transform that awaits (like a remote reward model)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = 0

    async def _apply_transform(self, value):
        await asyncio.sleep(0)
        self.calls += 1
        return value + 1


async def test_forward_on_step_and_reset():
    env = TransformedEnv(
        CountingEnv(max_steps=3), Double(in_keys=["observation"], out_keys=["obs2"])
    )
    td = await env.reset()
    assert td["obs2"].item() == 0
    r = await env.rollout(3)
    assert r["next", "obs2"].squeeze(-1).tolist() == [2.0, 4.0, 6.0]
    assert r["next", "observation"].squeeze(-1).tolist() == [1.0, 2.0, 3.0]
    assert "obs2" in env.observation_spec.keys()
    await acheck_env_specs(env)


async def test_async_transform_is_awaited_sync_one_is_not():
    t = AsyncAddOne(in_keys=["observation"])
    env = TransformedEnv(CountingEnv(max_steps=5), Compose(Double(in_keys=["observation"]), t))
    r = await env.rollout(3)
    assert r["next", "observation"].squeeze(-1).tolist() == [3.0, 5.0, 7.0]
    assert t.calls == 4  # reset + 3 steps
    # a sync chain returns plain values, no coroutine
    sync = Compose(Double(in_keys=["observation"]))
    out = sync._call(TensorDict(observation=torch.ones(1)))
    assert not asyncio.iscoroutine(out)
    await acheck_env_specs(env)


async def test_compose_indexing_parent_and_clone():
    t1, t2, t3 = StepCounter(), RewardSum(), Double(in_keys=["observation"])
    base = CountingEnv()
    env = TransformedEnv(base, Compose(t1, t2, t3))
    assert env.transform[2] is t3
    assert t3.container is env
    parent = env.transform[-1].parent
    assert isinstance(parent, TransformedEnv)
    assert parent.base_env is base
    assert [type(t) for t in parent.transform] == [StepCounter, RewardSum]
    assert "episode_reward" in parent.observation_spec.keys()
    assert env.transform[0].parent is not None and len(env.transform[0].parent.transform) == 0
    last_two = env.transform[-2:]
    assert isinstance(last_two, Compose)
    assert last_two.parent is None
    assert last_two[0] is not t2 and isinstance(last_two[0], RewardSum)
    assert last_two[1] is not t3 and isinstance(last_two[1], Double)
    # a transform with a parent cannot go to another env; its clone can
    with pytest.raises(RuntimeError, match="clone"):
        TransformedEnv(CountingEnv(), t3)
    other = TransformedEnv(CountingEnv(), t3.clone())
    assert other.transform[0].container is other


def test_clone_shares_buffers():
    class Buf(Transform):
        def __init__(self):
            super().__init__(in_keys=["observation"])
            self.register_buffer("loc", torch.zeros(2))

    t = Buf()
    c = t.clone()
    assert c.loc is t.loc
    t.loc.add_(1)
    assert c.loc.tolist() == [1.0, 1.0]
    assert c.parent is None


async def test_append_insert_recompute_specs():
    env = TransformedEnv(CountingEnv())
    assert "step_count" not in env.observation_spec.keys()
    env.append_transform(StepCounter())
    assert "step_count" in env.observation_spec.keys()
    env.insert_transform(0, RewardSum())
    assert [type(t) for t in env.transform] == [RewardSum, StepCounter]
    assert "episode_reward" in env.observation_spec.keys()
    await acheck_env_specs(env)


async def test_double_to_float_inverse_example():
    class F64Env(PendulumEnv):
        def _make_specs(self, td_params):
            super()._make_specs(td_params)
            self.action_spec = Bounded(-2.0, 2.0, shape=(1,), dtype=torch.float64)

        def _step(self, td):
            assert td["action"].dtype == torch.float64
            return super()._step(td.set("action", td["action"].float()))

    env = TransformedEnv(F64Env(), DoubleToFloat(in_keys_inv=["action"]))
    assert env.action_spec.dtype == torch.float32
    assert env.base_env.action_spec.dtype == torch.float64
    td = await env.reset()
    td["action"] = torch.zeros(1)
    out = await env.step(td)
    assert out["action"].dtype == torch.float32  # the user's entry is untouched
    await acheck_env_specs(env)


async def test_batched_and_batch_unlocked():
    env = TransformedEnv(
        CountingEnv(max_steps=[2, 4], batch_size=(2,)), Compose(StepCounter(), RewardSum())
    )
    r = await env.rollout(4, break_when_any_done=False)
    assert r.batch_size == (2, 4)
    # element 0 is done at step 2 and reset: counters restart only there
    assert r["next", "step_count"][0].squeeze(-1).tolist() == [1, 2, 1, 2]
    assert r["next", "step_count"][1].squeeze(-1).tolist() == [1, 2, 3, 4]
    await acheck_env_specs(env)
    pend = TransformedEnv(PendulumEnv(), Compose(StepCounter(), RewardSum()))
    assert not pend.batch_locked
    td = await pend.reset(TensorDict({}, [5]))
    r = await pend.rollout(3, tensordict=td, auto_reset=False)
    assert r["next", "step_count"].shape == (5, 3, 1)
    assert r["next", "step_count"][:, -1].squeeze(-1).tolist() == [3] * 5
    await acheck_env_specs(pend, tensordict=TensorDict({}, [5]))


async def test_partial_steps_on_transformed_envs():
    env = TransformedEnv(CountingEnv(max_steps=10, batch_size=(3,)), StepCounter())
    td = await env.reset()
    td["action"] = torch.zeros(3, 1, dtype=torch.int64)
    td["_step"] = torch.tensor([True, False, True])
    out = await env.step(td)
    assert out["next", "step_count"].squeeze(-1).tolist() == [1, 0, 1]
    assert out["next", "observation"].squeeze(-1).tolist() == [1.0, 0.0, 1.0]
    pend = TransformedEnv(PendulumEnv(), StepCounter())
    td = await pend.reset(TensorDict({}, [3]))
    td = pend.rand_action(td)
    td["_step"] = torch.tensor([False, True, False])
    out = await pend.step(td)
    assert out["next", "step_count"].squeeze(-1).tolist() == [0, 1, 0]
    assert torch.equal(out["next", "th"][0], td["th"][0])


async def test_nested_env_and_attributes_fall_through():
    env = TransformedEnv(NestedCountingEnv(max_steps=3, batch_size=(2,)), StepCounter())
    assert ("agents", "step_count") in env.observation_spec.keys(True, True)
    assert env.n_agents == 2  # read from the base env
    with pytest.raises(AttributeError):
        _ = env._not_there
    await acheck_env_specs(env)
    inner = TransformedEnv(CountingEnv(), StepCounter(step_count_key="inner"))
    outer = TransformedEnv(inner, RewardSum())
    r = await outer.rollout(3)
    assert r["next", "inner"].squeeze(-1).tolist() == [1, 2, 3]
    await acheck_env_specs(outer)


async def test_seed_and_close_forward():
    base = CountingEnv()
    env = TransformedEnv(base, StepCounter())
    assert await env.set_seed(3) == 4
    assert base.seed == 3
    await env.aclose()
    assert base.is_closed


def test_forward_and_inv_as_modules():
    t = Double(in_keys=["x"])
    td = t(TensorDict(x=torch.ones(2)))
    assert td["x"].tolist() == [2.0, 2.0]

    class Neg(Transform):
        def _inv_apply_transform(self, v):
            return -v

    src = TensorDict(a=torch.ones(1))
    out = Neg(in_keys_inv=["a"]).inv(src)
    assert out["a"].item() == -1 and src["a"].item() == 1


def test_a_torchrl_transform_is_refused_naming_the_aenv_way() -> None:
    # (a stand-in from TorchRL's module: the main venv has no torchrl; the real one is
    # checked in tests/libs/test_torchrl.py, which CI runs in the TorchRL venv)
    StepCounter = type("StepCounter", (), {"__module__": "torchrl.envs.transforms.transforms"})
    Exotic = type("Exotic", (), {"__module__": "torchrl.envs.transforms.transforms"})
    from aenv import TransformedEnv
    from aenv.testing import CountingEnv
    from aenv.transforms import Compose

    with pytest.raises(TypeError, match=r"TorchRL's StepCounter.*aenv\.transforms\.StepCounter"):
        TransformedEnv(CountingEnv(), StepCounter())
    with pytest.raises(TypeError, match=r"TorchRL's Exotic.*an aenv transform.*to_torchrl"):
        Compose(Exotic())
    with pytest.raises(TypeError, match="got int"):
        Compose().append(3)  # type: ignore[arg-type]
