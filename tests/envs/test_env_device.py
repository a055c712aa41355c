"""An env's outputs live on ``env.device`` (TorchRL's contract), and a pool refuses a device
its sub-envs' outputs are not on instead of labelling CPU data with it."""

from __future__ import annotations

import functools

import pytest
import torch
from tensordict import TensorDict

from aenv import AsyncEnvPool, Composite, EnvBase, PendulumEnv, Unbounded

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
