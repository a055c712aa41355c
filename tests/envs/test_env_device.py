"""An env's outputs live on ``env.device`` (TorchRL's contract), and a pool refuses a device
its sub-envs' outputs are not on instead of labelling CPU data with it."""

from __future__ import annotations

import functools

import pytest
import torch
from tensordict import TensorDict

from aenv import AsyncEnvPool, Composite, EnvBase, FinancialRegimeEnv, PendulumEnv, Unbounded

pytestmark = pytest.mark.timeout(60)


class _DevicelessOutputs(EnvBase):
    """Declares a device but builds its outputs without one."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.observation_spec = Composite(obs=Unbounded(shape=(2,)))
        self.action_spec = Unbounded(shape=(1,))
        self.reward_spec = Unbounded(shape=(1,))

    def _reset(self, tensordict, **kwargs):
        return TensorDict({"obs": torch.zeros(2)}, [])

    def _step(self, tensordict):
        return TensorDict({"obs": torch.ones(2), "reward": torch.ones(1)}, [])

    def _set_seed(self, seed):
        pass


async def test_outputs_take_the_env_device_whatever_the_env_built():
    env = _DevicelessOutputs(device="cpu")
    r = await env.reset()
    assert r.device == torch.device("cpu")
    s = await env.step(env.rand_action(r))
    assert s["next"].device == torch.device("cpu")
    roll = await env.rollout(4)
    assert roll.device == torch.device("cpu") and roll["next"].device == torch.device("cpu")
    # no device declared: no device given
    assert (await _DevicelessOutputs().reset()).device is None


@pytest.mark.parametrize("batch", [(), (3,)])
async def test_pendulum_builds_on_its_device(batch):
    env = PendulumEnv(device="cpu")
    # (a tensordict handed to reset is the caller's and is updated in place: given on
    # the env's device here)
    td = env.gen_params(batch_size=batch).to(env.device) if batch else None
    r = await env.reset(td)
    assert r.device == torch.device("cpu") and r["params"].device == torch.device("cpu")
    roll = await env.rollout(3, tensordict=r, auto_reset=False)
    assert roll.device == torch.device("cpu")
    assert roll.batch_size == (*batch, 3)
    # without a device, nothing is labelled
    assert (await PendulumEnv().reset()).device is None


@pytest.mark.parametrize("backend", ["coroutine", "thread"])
async def test_pool_refuses_a_device_its_envs_are_not_on(backend):
    fns = [functools.partial(PendulumEnv, device="cpu")] * 2
    with pytest.raises(ValueError, match=r"device='meta'.*outputs are on cpu.*DeviceCastTransform"):
        AsyncEnvPool(fns, backend=backend, device="meta")
    with pytest.raises(ValueError, match=r"their device is None"):
        AsyncEnvPool([PendulumEnv] * 2, backend=backend, device="meta")
    # the device the envs are on is taken, with or without an index
    async with AsyncEnvPool(fns, backend=backend, device="cpu") as pool:
        assert pool.device == torch.device("cpu")
        assert (await pool.reset()).device == torch.device("cpu")


async def test_rollout_storing_device():
    env = PendulumEnv()
    r = await env.rollout(4, storing_device="cpu")
    assert r.device == torch.device("cpu") and r["next"].device == torch.device("cpu")
    assert (await env.rollout(4)).device is None


class _DeviceProbe(torch.nn.Module):
    """A policy that records the device of what it is handed (its parameter on the CPU)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen = []

    def forward(self, td):
        self.seen.append(td.device)
        td.set("action", torch.zeros(*td.batch_size, 1))  # in place, on the copy it got


async def test_auto_cast_to_device_hands_the_policy_its_device_and_keeps_its_action():
    # the env without a device, the policy's parameter on the CPU: the policy is handed
    # a copy cast to the CPU, and the action it writes into that copy is stepped with
    env = PendulumEnv()
    policy = _DeviceProbe()
    r = await env.rollout(3, policy, auto_cast_to_device=True)
    assert policy.seen == [torch.device("cpu")] * 3
    assert torch.equal(r["action"], torch.zeros(3, 1))
    # without the flag the policy sees the step's own input
    policy.seen.clear()
    await env.rollout(3, policy)
    assert policy.seen == [None] * 3


async def test_financial_env_builds_on_its_device():
    env = FinancialRegimeEnv(device="cpu")
    assert env.td_params.device == torch.device("cpu")
    r = await env.rollout(3)
    assert r.device == torch.device("cpu") and r["next"].device == torch.device("cpu")
    assert (await FinancialRegimeEnv().reset()).device is None
