"""Policies a Collector accepts: modules, plain callables, async callables, None."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from aenv.collectors import Collector
from aenv.testing import CountingEnv, LatencyEnv

pytestmark = pytest.mark.timeout(60)


class Doubler(nn.Module):
    """A plain module on observations: wrapped in a TensorDictModule by the collector."""

    def forward(self, observation):
        return (observation[..., :1] * 0 + 0.5).clamp(-1, 1)


async def collect_one(policy, env=None, **kw):
    c = Collector(env or LatencyEnv(0.0), policy, frames_per_batch=3, **kw)
    try:
        return c, await c.rollout()
    finally:
        await c.ashutdown()


async def test_tensordict_module():
    policy = TensorDictModule(lambda obs: obs[..., :1] * 0 - 0.25, ["observation"], ["action"])
    c, b = await collect_one(policy)
    assert c.policy is policy
    assert b["action"].flatten().tolist() == [-0.25] * 3


async def test_plain_module_is_wrapped_by_parameter_names():
    c, b = await collect_one(Doubler())
    assert isinstance(c.policy, TensorDictModule)
    assert c.policy.in_keys == ["observation"] and c.policy.out_keys == ["action"]
    assert b["action"].flatten().tolist() == [0.5] * 3


async def test_plain_function_on_all_observations_in_order():
    def policy(a, b):  # two params, not observation names: all observations, in spec order
        return (a[..., :1] * 0 + b * 0 + 0.75).clamp(-1, 1)

    c, b = await collect_one(policy)
    assert c.policy.in_keys == ["observation", "latency"]
    assert b["action"].flatten().tolist() == [0.75] * 3


async def test_tensordict_signatures_are_not_wrapped():
    def by_name(tensordict):
        tensordict["action"] = torch.full((1,), 0.125)
        return tensordict

    def by_annotation(data: TensorDictBase):  # noqa: F821 - resolved as a string
        data["action"] = torch.full((1,), 0.375)

    for fn, value in ((by_name, 0.125), (by_annotation, 0.375)):
        c, b = await collect_one(fn)
        assert c.policy is fn
        assert b["action"].flatten().tolist() == [value] * 3


async def test_async_policy():
    async def policy(td):
        td["action"] = torch.full((1,), -1.0)
        return td

    c, b = await collect_one(policy)
    assert c.policy is policy
    assert b["action"].flatten().tolist() == [-1.0] * 3


async def test_none_is_random_within_spec():
    _, b = await collect_one(None, env=CountingEnv(max_steps=100))
    assert set(b["action"].flatten().tolist()) <= {0, 1}


def test_unmatched_signature_raises_and_trust_policy_skips_checks():
    def policy(x, y, z):
        return x

    with pytest.raises(TypeError, match="cannot tell how to call"):
        Collector(LatencyEnv(0.0), policy, frames_per_batch=2)
    c = Collector(LatencyEnv(0.0), policy, frames_per_batch=2, trust_policy=True)
    assert c.policy is policy


async def test_compile_policy():
    policy = TensorDictModule(nn.Linear(4, 1), ["observation"], ["action"])
    c = Collector(LatencyEnv(0.0), policy, frames_per_batch=3, compile_policy={"backend": "eager"})
    assert type(c._run_policy).__name__ == "OptimizedModule"
    b = await c.rollout()
    with torch.no_grad():
        expected = policy.module(b["observation"])
    torch.testing.assert_close(b["action"], expected)
    await c.ashutdown()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where CUDA is missing")
def test_cudagraph_policy_warns_without_cuda():
    policy = TensorDictModule(nn.Linear(4, 1), ["observation"], ["action"])
    with pytest.warns(UserWarning, match="cudagraph_policy needs a CUDA"):
        c = Collector(LatencyEnv(0.0), policy, frames_per_batch=3, cudagraph_policy=True)
    assert c._run_policy is c.policy


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device (CUDA)")
async def test_policy_device_copy_and_weight_update():
    # a CPU policy run on CUDA is copied there; update_policy_weights_ syncs the copy
    net = TensorDictModule(nn.Linear(4, 1), ["observation"], ["action"])
    c = Collector(LatencyEnv(0.0), net, frames_per_batch=3, policy_device="cuda", env_device="cpu")
    assert c.policy is not net and c.policy.module.weight.device.type == "cuda"
    with torch.no_grad():
        net.module.weight.zero_()
        net.module.bias.fill_(0.5)
    c.update_policy_weights_()
    b = await c.rollout()
    assert b["action"].flatten().tolist() == [0.5] * 3
    assert b.device is None or b.device.type == "cpu"
    await c.ashutdown()
