"""DTypeCastTransform, DoubleToFloat, DeviceCastTransform, ObservationNorm, VecNorm."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from aenv import PendulumEnv, acheck_env_specs
from aenv.libs.gym import GymEnv
from aenv.specs import Bounded, Composite, Unbounded
from aenv.testing import CountingEnv
from aenv.transforms import (
    DeviceCastTransform,
    DoubleToFloat,
    DTypeCastTransform,
    ObservationNorm,
    TransformedEnv,
    VecNorm,
)


class F64Counting(CountingEnv):
    """CountingEnv with float64 observations and a float64 state entry."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.observation_spec = Composite(observation=Unbounded((1,), dtype=torch.float64))
        self.state_spec = Composite(offset=Unbounded((1,), dtype=torch.float64))

    def _reset(self, td, **kw):
        if td is not None and td.get("offset", None) is not None:
            assert td["offset"].dtype == torch.float64
        out = super()._reset(td, **kw)
        out.set("offset", torch.zeros(1, dtype=torch.float64))
        return out.set("observation", out["observation"].double())

    def _step(self, td):
        out = super()._step(td)
        return out.set("observation", out["observation"].double())


async def test_double_to_float_auto_keys():
    env = TransformedEnv(F64Counting(), DoubleToFloat())
    assert env.observation_spec["observation"].dtype == torch.float32
    assert env.state_spec["offset"].dtype == torch.float32
    r = await env.rollout(3)
    assert r["next", "observation"].dtype == torch.float32
    td = await env.reset(TensorDict(offset=torch.zeros(1)))
    assert td["observation"].dtype == torch.float32
    await acheck_env_specs(env)


async def test_dtype_cast_explicit_keys():
    env = TransformedEnv(
        CountingEnv(),
        DTypeCastTransform(torch.float32, torch.float64, in_keys=["observation", "reward"]),
    )
    r = await env.rollout(2)
    assert r["next", "observation"].dtype == torch.float64
    assert r["next", "reward"].dtype == torch.float64
    assert env.reward_spec.dtype == torch.float64
    await acheck_env_specs(env)


async def test_double_to_float_bounded_spec_on_pendulum():
    env = TransformedEnv(
        PendulumEnv(),
        DTypeCastTransform(
            torch.float32, torch.float64, in_keys=["th"], in_keys_inv=["th", "action"]
        ),
    )
    assert isinstance(env.observation_spec["th"], Bounded)
    assert env.observation_spec["th"].dtype == torch.float64
    assert env.action_spec.dtype == torch.float64
    await acheck_env_specs(env)


async def test_device_cast_cpu():
    env = TransformedEnv(PendulumEnv(), DeviceCastTransform("cpu"))
    assert env.device == torch.device("cpu")
    td = await env.reset()
    assert td.device == torch.device("cpu")
    await acheck_env_specs(env)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
async def test_device_cast_cuda():
    env = TransformedEnv(PendulumEnv(device="cpu"), DeviceCastTransform("cuda"))
    r = await env.rollout(3)
    assert r["next", "th"].device.type == "cuda"
    await acheck_env_specs(env)


async def test_observation_norm_fixed_and_init_stats():
    t = ObservationNorm(loc=1.0, scale=2.0, in_keys=["observation"])
    env = TransformedEnv(CountingEnv(max_steps=5), t)
    r = await env.rollout(2)
    assert r["next", "observation"].squeeze(-1).tolist() == [3.0, 5.0]
    await acheck_env_specs(env)
    norm = ObservationNorm(in_keys=["th"], standard_normal=True)
    pend = TransformedEnv(PendulumEnv(seed=0), norm)
    with pytest.raises(RuntimeError, match="init_stats"):
        await pend.rollout(2)
    await norm.ainit_stats(num_iter=200)
    assert norm.loc.shape == () and norm.scale.shape == ()
    assert "loc" in norm.state_dict()
    raw = await norm.parent.rollout(200)
    assert abs(((raw["next", "th"] - norm.loc) / norm.scale).mean().item()) < 0.5
    assert isinstance(pend.observation_spec["th"], Bounded)  # bounds mapped
    await acheck_env_specs(pend)


async def test_vecnorm_normalizes_and_partial_reset():
    t = VecNorm(in_keys=["th", "thdot"], decay=1.0)
    env = TransformedEnv(PendulumEnv(seed=0), t)
    td = await env.reset(TensorDict({}, [16]))
    r = await env.rollout(50, tensordict=td, auto_reset=False)
    assert abs(r["next", "thdot"].mean().item()) < 0.3
    assert 0.5 < r["next", "thdot"].std().item() < 1.5
    await acheck_env_specs(env, tensordict=TensorDict({}, [16]))
    count = t.count_0.item()
    # a partial reset updates the statistics with the reset elements only
    env2 = TransformedEnv(CountingEnv(batch_size=(4,)), VecNorm(decay=1.0))
    td = await env2.reset()
    before = env2.transform[0].count_0.item()
    td["_reset"] = torch.tensor([[True], [False], [False], [False]])
    await env2.reset(td)
    assert env2.transform[0].count_0.item() == before + 1
    frozen = t.frozen_copy()
    assert frozen.frozen and frozen.count_0.item() == count and frozen.count_0 is not t.count_0
    with pytest.raises(ValueError):
        t.to_observation_norm()
    on = env2.transform[0].to_observation_norm()
    assert isinstance(on, ObservationNorm) and on.standard_normal


async def test_vecnorm_on_cartpole():
    env = TransformedEnv(GymEnv("CartPole-v1"), VecNorm(decay=0.99))
    r = await env.rollout(20)
    assert torch.isfinite(r["next", "observation"]).all()
    await acheck_env_specs(env)
