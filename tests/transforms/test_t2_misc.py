"""TrajCounter, FiniteTensorDictCheck, RemoveEmptySpecs, ClipTransform, SignTransform, BinarizeReward."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import aenv
from aenv.envs import EnvBase
from aenv.specs import Binary, Bounded, Categorical, Composite, Unbounded
from aenv.testing import CountingEnv
from aenv.transforms import (
    BinarizeReward,
    ClipTransform,
    FiniteTensorDictCheck,
    RemoveEmptySpecs,
    SignTransform,
    TrajCounter,
    TransformedEnv,
)

# ---------------------------------------------------------------------- TrajCounter


async def test_traj_counter_rollout():
    env = TransformedEnv(CountingEnv(max_steps=2), TrajCounter())
    spec = env.observation_spec["traj_count"]
    assert spec.dtype == torch.int64 and spec.shape == (1,)
    r = await env.rollout(6, break_when_any_done=False)
    assert r["traj_count"].squeeze(-1).tolist() == [0, 0, 1, 1, 2, 2]
    assert r["next", "traj_count"].squeeze(-1).tolist() == [0, 0, 1, 1, 2, 2]
    await aenv.acheck_env_specs(env)


async def test_traj_counter_partial_reset_and_shared_clone():
    t = TrajCounter()
    env = TransformedEnv(CountingEnv(max_steps=100, batch_size=(3,)), t)
    td = await env.reset()
    assert td["traj_count"].squeeze(-1).tolist() == [0, 1, 2]
    td = env._step_mdp(await env.rand_step(td))
    td["_reset"] = torch.tensor([[False], [True], [False]])
    td = await env.reset(td)
    assert td["traj_count"].squeeze(-1).tolist() == [0, 3, 2]
    td = await env.rand_step(td)
    assert td["next", "traj_count"].squeeze(-1).tolist() == [0, 3, 2]
    # a clone on another env shares the counter: ids never repeat
    env2 = TransformedEnv(CountingEnv(max_steps=100), t.clone())
    assert (await env2.reset())["traj_count"].item() == 4
    assert t.counter == 5


async def test_traj_counter_batch_unlocked():
    env = TransformedEnv(aenv.PendulumEnv(seed=0), TrajCounter(out_key="tid"))
    td = await env.reset(TensorDict({}, batch_size=[4]))
    assert td["tid"].squeeze(-1).tolist() == [0, 1, 2, 3]
    r = await env.rollout(2, tensordict=td, auto_reset=False)
    assert r["next", "tid"][:, -1].squeeze(-1).tolist() == [0, 1, 2, 3]


# ---------------------------------------------------------------------- FiniteTensorDictCheck


class _NanEnv(CountingEnv):
    def _step(self, td):
        out = super()._step(td)
        if self.count.max() >= 2:
            out["observation"] = torch.full_like(out["observation"], float("nan"))
        return out


async def test_finite_check():
    env = TransformedEnv(aenv.PendulumEnv(seed=0), FiniteTensorDictCheck())
    await env.rollout(3)
    await aenv.acheck_env_specs(env)
    env = TransformedEnv(_NanEnv(max_steps=10), FiniteTensorDictCheck())
    td = await env.reset()
    td = env._step_mdp(await env.rand_step(td))
    with pytest.raises(aenv.SpecViolationError, match="observation"):
        await env.rand_step(td)
    with pytest.raises(ValueError):  # SpecViolationError is a ValueError
        FiniteTensorDictCheck()(TensorDict(x=torch.tensor([float("inf")])))


# ---------------------------------------------------------------------- RemoveEmptySpecs


class _EmptyEntriesEnv(EnvBase):
    """Declares (and emits) empty composites in observations, rewards and state."""

    def __init__(self):
        super().__init__(batch_size=(2,))
        bs = self.batch_size
        self.observation_spec = Composite(
            observation=Unbounded((*bs, 1)),
            empty=Composite(shape=bs),
            nested=Composite(deeper=Composite(shape=bs), shape=bs),
            shape=bs,
        )
        self.state_spec = Composite(hidden=Composite(shape=bs), shape=bs)
        self.action_spec = Categorical(2, shape=(*bs, 1))
        self.full_reward_spec = Composite(
            reward=Unbounded((*bs, 1)), other=Composite(shape=bs), shape=bs
        )
        self.seen_hidden: list[bool] = []

    def _out(self):
        bs = self.batch_size
        return TensorDict(
            observation=torch.zeros(*bs, 1),
            empty=TensorDict({}, bs),
            nested=TensorDict(deeper=TensorDict({}, bs), batch_size=bs),
            batch_size=bs,
        )

    def _reset(self, td):
        return self._out()

    def _step(self, td):
        self.seen_hidden.append(isinstance(td.get("hidden", None), TensorDict))
        out = self._out()
        out["reward"] = torch.ones(*self.batch_size, 1)
        out["other"] = TensorDict({}, self.batch_size)
        return out

    def _set_seed(self, seed):
        pass


async def test_remove_empty_specs():
    base = _EmptyEntriesEnv()
    env = TransformedEnv(base, RemoveEmptySpecs())
    for key in ("empty", "nested"):
        assert key not in env.observation_spec
    assert "other" not in env.full_reward_spec
    assert "hidden" not in env.full_state_spec
    td = await env.reset()
    assert "empty" not in td.keys() and "nested" not in td.keys()
    td = await env.rand_step(td)
    assert set(td["next"].keys()) == {"observation", "reward", "done", "terminated"}
    # the base env still got the empty state entry it declares
    assert base.seen_hidden == [True]
    await aenv.acheck_env_specs(env)


# ---------------------------------------------------------------------- values


async def test_clip_observation_and_reward():
    env = TransformedEnv(
        CountingEnv(max_steps=10),
        ClipTransform(in_keys=["observation", "reward"], low=0.0, high=2.5),
    )
    spec = env.observation_spec["observation"]
    assert isinstance(spec, Bounded) and float(spec.high) == 2.5 and float(spec.low) == 0.0
    assert isinstance(env.reward_spec, Bounded)
    r = await env.rollout(4)
    assert r["next", "observation"].squeeze(-1).tolist() == [1.0, 2.0, 2.5, 2.5]
    await aenv.acheck_env_specs(env)


async def test_clip_action_inverse_intersects_bounds():
    t = ClipTransform(in_keys_inv=["action"], low=-1.0)
    env = TransformedEnv(aenv.PendulumEnv(seed=0), t)
    spec = env.action_spec
    assert float(spec.low) == -1.0 and float(spec.high) == 2.0  # high kept from the base spec
    inner = t.inv(TensorDict(action=torch.tensor([-1.5])))
    assert inner["action"].item() == -1.0
    await aenv.acheck_env_specs(env)
    with pytest.raises(ValueError):
        ClipTransform(in_keys=["x"])
    with pytest.raises(ValueError):
        ClipTransform(in_keys=["x"], low=1.0, high=0.0)


async def test_sign_transform():
    env = TransformedEnv(aenv.PendulumEnv(seed=0), SignTransform(in_keys=["reward"]))
    spec = env.reward_spec
    assert isinstance(spec, Bounded) and float(spec.low) == -1 and float(spec.high) == 1
    r = await env.rollout(5)
    assert set(r["next", "reward"].unique().tolist()) <= {-1.0, 0.0}
    await aenv.acheck_env_specs(env)
    x = torch.tensor([-3.0, 0.0, 2.0])
    assert SignTransform(in_keys=["x"])(TensorDict(x=x))["x"].tolist() == [-1.0, 0.0, 1.0]


async def test_binarize_reward():
    env = TransformedEnv(CountingEnv(max_steps=10), BinarizeReward())
    assert isinstance(env.reward_spec, Binary) and env.reward_spec.dtype == torch.int8
    td = await env.rand_step(await env.reset())
    assert td["next", "reward"].tolist() == [1] and td["next", "reward"].dtype == torch.int8
    await aenv.acheck_env_specs(env)
    out = BinarizeReward()(TensorDict(reward=torch.tensor([[0.0], [-2.0], [0.5]]), batch_size=[3]))
    assert out["reward"].squeeze(-1).tolist() == [0, 1, 1]
    with pytest.raises(ValueError):
        BinarizeReward()(TensorDict(reward=torch.zeros(3)))
