"""Auto-resetting envs, partial steps and non-tensor envs, as TorchRL's test_auto_reset.py
(TestAutoReset, TestNonTensorEnv) and test_env_base.py check them."""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorStack

from aenv.sync import ParallelEnv, SerialEnv, SyncEnv
from aenv.testing import CountingEnv, TextEnv
from aenv.transforms import StepCounter, TransformedEnv
from conformance._envs import SelfResettingEnv

pytestmark = pytest.mark.timeout(60)


async def test_self_resetting_env_rollout_marks_done_steps():
    # TorchRL's test_auto_reset: the done step's observation is a placeholder, the next
    # step starts from the first observation the env gave with the done flags
    env = SelfResettingEnv(max_steps=3, auto_reset=True)
    td = await env.rollout(7, break_when_any_done=False)
    nxt = td["next", "observation"].squeeze(-1)
    assert torch.isnan(nxt[2]) and torch.isnan(nxt[5])
    assert nxt[[0, 1, 3, 4, 6]].tolist() == [1, 2, 1, 2, 1]
    assert td["observation"].squeeze(-1).tolist() == [0, 1, 2, 0, 1, 2, 0]


async def test_self_resetting_env_with_a_transform_resets_its_state():
    env = TransformedEnv(SelfResettingEnv(max_steps=2, auto_reset=True), StepCounter())
    td = await env.rollout(5, break_when_any_done=False)
    assert td["step_count"].squeeze(-1).tolist() == [0, 1, 0, 1, 0]


@pytest.mark.parametrize("batched", ["serial", "parallel"])
def test_self_resetting_envs_batched(batched):
    cls = SerialEnv if batched == "serial" else ParallelEnv
    with cls(2, SelfResettingEnv, [{"max_steps": 2, "auto_reset": True}] * 2) as env:
        td = env.rollout(4, break_when_any_done=False)
        assert td["observation"].squeeze(-1).tolist() == [[0, 1, 0, 1]] * 2
        assert torch.isnan(td["next", "observation"][:, 1]).all()


async def test_partial_step_leaves_the_other_elements_as_they_were():
    env = CountingEnv(batch_size=(3,), max_steps=10)
    td = await env.reset()
    td = env._step_mdp(await env.rand_step(td))
    td["_step"] = torch.tensor([True, False, True])
    out = await env.rand_step(td)
    assert out["next", "observation"].squeeze(-1).tolist() == [2, 1, 2]
    assert out["next", "reward"].squeeze(-1).tolist() == [1, 0, 1]
    assert env.count.squeeze(-1).tolist() == [2, 1, 2]


async def test_break_when_all_done_stops_stepping_done_elements():
    env = CountingEnv(batch_size=(2,), max_steps=[2, 4])
    td = await env.rollout(10, break_when_any_done=False, break_when_all_done=True)
    assert td.batch_size == (2, 4)
    # env 0 finished after 2 steps and was not stepped again
    assert td["next", "observation"][0].squeeze(-1).tolist() == [1, 2, 2, 2]
    assert td["next", "observation"][1].squeeze(-1).tolist() == [1, 2, 3, 4]


def _text_policy(td):
    if td.batch_dims:
        td.set("action", NonTensorStack(*["ab"] * td.batch_size[0]))
    else:
        td.set_non_tensor("action", "ab")
    return td


@pytest.mark.parametrize("where", ["single", "serial", "parallel"])
def test_non_tensor_env_rollouts(where):
    # TorchRL's TestNonTensorEnv: strings in and out, episodes reset
    if where == "single":
        env = SyncEnv(TextEnv(max_steps=3))
    else:
        cls = SerialEnv if where == "serial" else ParallelEnv
        env = cls(2, TextEnv, {"max_steps": 3})
    with env:
        td = env.rollout(4, _text_policy, break_when_any_done=False)
        histories = td["next", "history"]
        rows = [histories] if where == "single" else list(histories)
        for row in rows:
            assert list(row) == ["hello ab", "hello ab ab", "hello ab ab ab", "hello ab"]
        assert (td["next", "reward"] == 2).all()


@pytest.mark.parametrize("batched", ["serial", "parallel"])
def test_non_tensor_partial_reset_keeps_the_other_envs_strings(batched):
    cls = SerialEnv if batched == "serial" else ParallelEnv
    with cls(2, TextEnv, {"max_steps": 10}) as env:
        td = env.reset()
        td = env.step_mdp(env.step(_text_policy(td)))
        td["_reset"] = torch.tensor([[True], [False]])
        out = env.reset(td)
        assert list(out["history"]) == ["hello", "hello ab"]
