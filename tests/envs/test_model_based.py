"""ModelBasedEnvBase (a world model stepped as an env) and the Dreamer imagination env."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from aenv import (
    Bounded,
    Composite,
    DreamerDecoder,
    DreamerEnv,
    ModelBasedEnvBase,
    SyncEnv,
    TransformedEnv,
    Unbounded,
    acheck_env_specs,
    check_env_specs,
)

pytestmark = pytest.mark.timeout(60)


class LinearWorld(ModelBasedEnvBase):
    """obs' = A obs + B action; reward = -|obs'|^2; done once |obs'| > 10."""

    def __init__(self, model):
        super().__init__(model)
        self.observation_spec = Composite(obs=Unbounded((3,)))
        self.action_spec = Unbounded((1,))
        self.reward_spec = Unbounded((1,))

    def _reset(self, td):
        batch = td.batch_size if td is not None else torch.Size()
        return TensorDict(obs=torch.ones(*batch, 3), batch_size=batch)


def linear_model() -> TensorDictSequential:
    torch.manual_seed(0)
    dynamics = TensorDictModule(
        lambda obs, action: obs * 1.5 + action, in_keys=["obs", "action"], out_keys=["obs"]
    )
    scale = nn.Linear(3, 3, bias=False)
    nn.init.eye_(scale.weight)
    mix = TensorDictModule(scale, in_keys=["obs"], out_keys=["obs"])
    reward = TensorDictModule(
        lambda obs: -(obs**2).sum(-1, keepdim=True), in_keys=["obs"], out_keys=["reward"]
    )
    done = TensorDictModule(
        lambda obs: obs.norm(dim=-1, keepdim=True) > 10, in_keys=["obs"], out_keys=["done"]
    )
    return TensorDictSequential(dynamics, mix, reward, done)


def test_model_based_env_steps_through_the_world_model_sync():
    env = SyncEnv(LinearWorld(linear_model()))
    check_env_specs(env)
    td = env.reset()
    td["action"] = torch.tensor([0.5])
    out = env.step(td)
    assert out["next", "obs"].tolist() == [2.0, 2.0, 2.0]  # 1 * 1.5 + 0.5
    assert out["next", "reward"].item() == pytest.approx(-12.0)
    assert not out["next", "done"].item() and not out["next", "terminated"].item()
    r = env.rollout(10, policy=lambda td: td.set("action", torch.zeros(*td.batch_size, 1)))
    # 1.5 ** k: |obs| = sqrt(3) * 1.5 ** k passes 10 at k = 5
    assert r.batch_size == (5,) and r["next", "done"][-1].item()


async def test_imagination_is_batched_and_differentiable_async():
    model = linear_model()
    env = LinearWorld(model)
    await acheck_env_specs(env, tensordict=TensorDict({}, [8]))
    weight = model[1].module.weight
    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["obs"], out_keys=["action"])
    start = await env.reset(TensorDict({}, [8]))
    r = await env.rollout(3, policy, tensordict=start, auto_reset=False)
    assert r.batch_size == (8, 3)
    loss = -r["next", "reward"].sum()
    loss.backward()
    # gradients reach both the policy and the world model through the imagined steps
    assert policy.module.weight.grad is not None and policy.module.weight.grad.abs().sum() > 0
    assert weight.grad is not None and weight.grad.abs().sum() > 0


async def test_world_model_that_writes_no_observation_is_an_error():
    env = LinearWorld(lambda td: TensorDict(reward=torch.zeros(1)))
    td = await env.reset()
    td["action"] = torch.zeros(1)
    with pytest.raises(KeyError, match="obs"):
        await env.step(td)
    env = LinearWorld(lambda td: td["obs"])
    with pytest.raises(TypeError, match="TensorDict"):
        await env.step(td)


class RSSMPrior(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(4 + 2, 8)
        self.to_state = nn.Linear(8, 4)

    def forward(self, state, belief, action):
        belief = self.cell(torch.cat([state, action], -1), belief)
        return torch.tanh(self.to_state(belief)), belief


def dreamer_world_model() -> TensorDictSequential:
    torch.manual_seed(1)
    prior = TensorDictModule(
        RSSMPrior(), in_keys=["state", "belief", "action"], out_keys=["state", "belief"]
    )
    reward = TensorDictModule(nn.Linear(4 + 8, 1), in_keys=["features"], out_keys=["reward"])
    cat = TensorDictModule(
        lambda s, b: torch.cat([s, b], -1), in_keys=["state", "belief"], out_keys=["features"]
    )
    return TensorDictSequential(prior, cat, reward)


def decoder(state, belief):
    return torch.cat([state, belief], -1).reshape(*state.shape[:-1], 3, 2, 2)


def test_dreamer_env_and_decoder_sync():
    env = DreamerEnv(
        dreamer_world_model(), (4,), (8,), action_spec=Bounded(-1, 1, (2,)), obs_decoder=decoder
    )
    env = SyncEnv(TransformedEnv(env, DreamerDecoder(shape=(3, 2, 2))))
    check_env_specs(env)
    td = env.reset()
    assert td["state"].eq(0).all() and td["reco_pixels"].shape == (3, 2, 2)
    r = env.rollout(5)
    assert r["next", "belief"].shape == (5, 8) and r["next", "reco_pixels"].shape == (5, 3, 2, 2)
    expected = decoder(r["next", "state"], r["next", "belief"])
    assert torch.equal(r["next", "reco_pixels"], expected)
    assert not torch.equal(r["next", "belief"][0], r["next", "belief"][1])


async def test_dreamer_imagines_from_given_latents_async():
    env = DreamerEnv(dreamer_world_model(), (4,), (8,), action_spec=Bounded(-1, 1, (2,)))
    start = TensorDict({"state": torch.randn(6, 4), "belief": torch.randn(6, 8)}, [6])
    td = await env.reset(start.clone())
    assert torch.equal(td["state"], start["state"]) and torch.equal(td["belief"], start["belief"])
    r = await env.rollout(4, tensordict=td, auto_reset=False)
    assert r.batch_size == (6, 4) and r["next", "reward"].shape == (6, 4, 1)
    with pytest.raises(RuntimeError, match="obs_decoder"):
        await TransformedEnv(env, DreamerDecoder(shape=(1,))).reset()
