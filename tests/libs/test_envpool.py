"""MultiThreadedEnv / MultiThreadedEnvWrapper over EnvPool (skipped without envpool)."""

from __future__ import annotations

import warnings

import pytest
import torch
from tensordict import TensorDict

from aenv import (
    MultiThreadedEnv,
    MultiThreadedEnvWrapper,
    StepCounter,
    SyncEnv,
    TransformedEnv,
    acheck_env_specs,
    check_env_specs,
)

envpool = pytest.importorskip("envpool")
pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::UserWarning"),  # gymnasium's float64 Box notes
]


def test_multithreaded_env_sync():
    env = SyncEnv(MultiThreadedEnv(4, "CartPole-v1"))
    check_env_specs(env)
    assert env.batch_size == (4,) and env.action_spec.shape == (4, 2)  # one-hot
    r = env.rollout(60, break_when_any_done=False)
    assert r.batch_size == (4, 60)
    done = r["next", "done"].squeeze(-1)
    assert done.any()  # CartPole episodes end within 60 random steps
    # after a done the env was reset: the next step starts a fresh episode, near 0
    b, t = done.nonzero()[0].tolist()
    assert r["observation"][b, t + 1].abs().max() < 0.06
    assert r["next", "reward"].eq(1).all()  # EnvPool's own auto-reset (reward 0) never ran
    env.close()


async def test_seeding_and_partial_steps_async():
    env = MultiThreadedEnv(3, "CartPole-v1", categorical_action_encoding=True)
    await acheck_env_specs(env)
    await env.set_seed(7)
    a = await env.reset()
    await env.set_seed(7)
    b = await env.reset()
    assert torch.equal(a["observation"], b["observation"])
    b["action"] = torch.ones(3, dtype=torch.int64)
    b["_step"] = torch.tensor([True, False, True])
    out = await env.step(b)
    assert torch.equal(out["next", "observation"][1], b["observation"][1])  # not stepped
    assert not torch.equal(out["next", "observation"][0], b["observation"][0])
    await env.aclose()


async def test_wrapper_partial_reset_and_transforms_async():
    raw = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=2, seed=1)
    env = TransformedEnv(MultiThreadedEnvWrapper(raw), StepCounter(5))
    td = await env.reset()
    r = await env.rollout(7, tensordict=td, auto_reset=False, break_when_any_done=False)
    assert r["next", "step_count"][0].squeeze(-1).tolist() == [1, 2, 3, 4, 5, 1, 2]
    nxt = env._step_mdp(r[:, -1])
    nxt["_reset"] = torch.tensor([[True], [False]])
    out = await env.reset(nxt)
    assert out["step_count"].squeeze(-1).tolist() == [0, 2]
    assert env.config["num_envs"] == 2  # attribute reads reach the EnvPool env
    with pytest.raises(TypeError, match="EnvPool"):
        MultiThreadedEnvWrapper(TensorDict({}, []))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        await env.aclose()
