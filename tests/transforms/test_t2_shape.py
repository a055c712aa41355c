"""Shape transforms: UnsqueezeTransform, SqueezeTransform, FlattenObservation, PermuteTransform."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import aenv
from aenv.specs import Bounded
from aenv.testing import CountingEnv
from aenv.transforms import (
    Compose,
    FlattenObservation,
    PermuteTransform,
    SqueezeTransform,
    TransformedEnv,
    UnsqueezeTransform,
)


async def test_unsqueeze_observation_and_inverse_action():
    # PendulumEnv reads "th" back as state: write the unsqueezed copy elsewhere
    t = UnsqueezeTransform(-1, in_keys=["th"], out_keys=["th_u"], in_keys_inv=["action"])
    env = TransformedEnv(aenv.PendulumEnv(seed=0), t)
    assert env.observation_spec["th_u"].shape == (1,)
    assert env.action_spec.shape == (1, 1)
    assert isinstance(env.observation_spec["th_u"], Bounded)
    td = await env.reset()
    assert td["th_u"].shape == (1,)
    td["action"] = torch.ones(1, 1)
    td = await env.step(td)
    assert td["next", "th_u"].shape == (1,)
    torch.testing.assert_close(td["next", "th_u"], td["next", "th"].unsqueeze(-1))
    assert td["action"].shape == (1, 1)  # the outer action keeps its shape
    await aenv.acheck_env_specs(env)
    # batched, batch-unlocked: negative dims do not care about the batch size
    td = await env.reset(TensorDict({}, batch_size=[4]))
    assert td["th_u"].shape == (4, 1)
    td = await env.rollout(2, tensordict=td, auto_reset=False)
    assert td["next", "th_u"].shape == (4, 2, 1)


async def test_unsqueeze_on_counting_env_specs():
    env = TransformedEnv(
        CountingEnv(batch_size=(2,)),
        UnsqueezeTransform(-2, in_keys=["observation"], in_keys_inv=["action"]),
    )
    assert env.observation_spec["observation"].shape == (2, 1, 1)
    await aenv.acheck_env_specs(env)


async def test_squeeze_roundtrip():
    env = TransformedEnv(
        CountingEnv(batch_size=(3,)),
        Compose(SqueezeTransform(-1, in_keys=["observation"], in_keys_inv=["action"])),
    )
    assert env.observation_spec["observation"].shape == (3,)
    assert env.action_spec.shape == (3,)
    r = await env.rollout(4)
    assert r["next", "observation"].shape == (3, 4)
    torch.testing.assert_close(r["next", "observation"][0], torch.arange(1.0, 5.0))
    await aenv.acheck_env_specs(env)
    with pytest.raises(ValueError):
        SqueezeTransform(0)
    with pytest.raises(aenv.SpecError):  # dim -2 of (3, 1) has size 3
        TransformedEnv(CountingEnv(batch_size=(3,)), SqueezeTransform(-2, in_keys=["observation"]))


async def test_flatten_observation():
    t = FlattenObservation(-2, -1, in_keys=["observation"])
    env = TransformedEnv(
        CountingEnv(batch_size=(2,)), Compose(UnsqueezeTransform(-1, in_keys=["observation"]), t)
    )
    assert env.observation_spec["observation"].shape == (2, 1)
    await aenv.acheck_env_specs(env)
    x = torch.arange(24.0).view(2, 3, 4)
    out = FlattenObservation(-2, -1, in_keys=["x"])(TensorDict(x=x, batch_size=[2]))["x"]
    torch.testing.assert_close(out, x.view(2, 12))


async def test_permute_forward_inverse_and_spec_bounds():
    t = PermuteTransform([-1, -3, -2], in_keys=["x"], in_keys_inv=["x"])
    x = torch.arange(24.0).view(2, 3, 4)
    td = TensorDict(x=x)
    out = t(td.clone())["x"]
    assert out.shape == (4, 2, 3)
    torch.testing.assert_close(out, x.permute(2, 0, 1))
    back = t.inv(TensorDict(x=out))["x"]
    torch.testing.assert_close(back, x)
    spec = Bounded(torch.zeros(2, 3, 4), x + 1)
    new = t._transform_spec(spec)
    assert new.shape == (4, 2, 3)
    torch.testing.assert_close(new.high, (x + 1).permute(2, 0, 1))
    with pytest.raises(ValueError):
        PermuteTransform([0, 1])


async def test_permute_in_env():
    env = TransformedEnv(
        CountingEnv(batch_size=(2,)),
        Compose(
            UnsqueezeTransform(-1, in_keys=["observation"]),
            PermuteTransform([-1, -2], in_keys=["observation"]),
        ),
    )
    assert env.observation_spec["observation"].shape == (2, 1, 1)
    await aenv.acheck_env_specs(env)
