"""TorchRL's Q-value modules and DQN loss on aenv envs and specs (aenv.torchrl's adapted
classes), as TorchRL's DQN tutorial uses them: the actor collects through aenv's collector
and the loss trains on what it collected.

Runs where torchrl is installed (CI: the ``.venv-torchrl`` venv, as tests/libs/test_torchrl.py);
elsewhere only the "not installed" test runs."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

import aenv.torchrl as atrl
from aenv.exceptions import BackendUnavailableError

pytestmark = pytest.mark.timeout(120)

HAS_TORCHRL = importlib.util.find_spec("torchrl") is not None
needs_torchrl = pytest.mark.skipif(not HAS_TORCHRL, reason="torchrl is not installed")


@pytest.mark.skipif(HAS_TORCHRL, reason="torchrl is installed")
def test_without_torchrl_the_names_say_how_to_install_it():
    with pytest.raises(BackendUnavailableError, match="aenv\\[torchrl\\]"):
        atrl.QValueActor  # noqa: B018


def _net(n_actions: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, n_actions))


@needs_torchrl
def test_plain_torchrl_refuses_aenv_specs():
    """What the adapted classes are for: TorchRL's own look the spec's class up."""
    from torchrl.modules import QValueModule

    spec = atrl.GymEnv("CartPole-v1").action_spec
    with pytest.raises((TypeError, ValueError)):
        QValueModule(spec=spec)


@needs_torchrl
@pytest.mark.parametrize("categorical", [False, True])
def test_dqn_collection_and_loss_on_aenv_specs(categorical):
    from torchrl.modules import QValueActor as TorchRLQValueActor

    env = atrl.TransformedEnv(
        atrl.GymEnv("CartPole-v1", categorical_action_encoding=categorical), atrl.StepCounter()
    )
    n = 2
    actor = atrl.QValueActor(_net(n), in_keys=["observation"], spec=env.action_spec)
    assert isinstance(actor, TorchRLQValueActor)
    assert actor.action_space == ("categorical" if categorical else "one_hot")
    collector = atrl.SyncDataCollector(env, actor, frames_per_batch=64, total_frames=128)
    batches = list(collector)
    collector.shutdown()
    assert len(batches) == 2
    data = batches[0]
    greedy = data["action_value"].argmax(-1)
    if categorical:
        assert torch.equal(data["action"], greedy)
    else:
        assert torch.equal(data["action"].argmax(-1), greedy) and bool(
            (data["action"].sum(-1) == 1).all()
        )
    assert not data["action_value"].requires_grad

    loss_module = atrl.DQNLoss(actor, action_space=env.action_spec, delay_value=False)
    loss_module.make_value_estimator(gamma=0.99)
    before = [p.detach().clone() for p in actor.parameters()]
    optim = torch.optim.SGD(actor.parameters(), lr=0.1)
    loss = loss_module(data)["loss"]
    assert loss.requires_grad and torch.isfinite(loss)
    loss.backward()
    optim.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, actor.parameters(), strict=True))
    env.close()


@needs_torchrl
def test_qvalue_module_takes_a_composite_spec_and_pickles():
    import pickle

    env = atrl.GymEnv("CartPole-v1")
    module = atrl.QValueModule(spec=env.full_action_spec)
    assert module.action_space == "one_hot"
    td = env.reset()
    td["action_value"] = torch.tensor([0.1, 0.7])
    assert module(td)["action"].tolist() == [0, 1]
    again = pickle.loads(pickle.dumps(module))
    assert type(again) is type(module)
    env.close()
