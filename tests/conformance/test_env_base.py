"""EnvBase, as TorchRL's test_env_base.py checks it (async methods; sync facades where the
TorchRL test is a script)."""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict
from torch import nn

from aenv import GymEnv, acheck_env_specs
from aenv.exceptions import BatchSizeError, LockedSpecError, SpecViolationError
from aenv.specs import Unbounded
from aenv.sync import SyncEnv
from aenv.testing import CountingEnv, DynamicSpecEnv, NestedCountingEnv
from conformance._envs import (
    BinaryActionEnv,
    DoneOnlyEnv,
    DoublingEnv,
    NothingEnv,
    StateEnv,
    TerminatedOnlyEnv,
)

pytestmark = pytest.mark.timeout(60)


async def test_check_env_specs_passes_and_catches_a_wrong_dtype():
    env = CountingEnv()
    await acheck_env_specs(env)
    env.set_spec_lock_(False)
    env.output_spec["full_observation_spec", "observation"] = Unbounded((1,), dtype=torch.float16)
    # aenv raises AssertionError naming the key (TorchRL: a TypeError)
    with pytest.raises(AssertionError, match="observation"):
        await acheck_env_specs(env)


async def test_check_env_specs_accepts_state_keys_in_the_step_output():
    # issue 24 item 2: "hidden" is in state_spec and _step returns it too
    env = StateEnv()
    await acheck_env_specs(env)
    td = await env.rollout(3)
    assert td["next", "hidden"][-1].tolist() == [3.0] * 4


def test_specs_are_locked_and_survive_pickling():
    env = CountingEnv()
    for _ in range(2):
        assert env.is_spec_locked and env.output_spec.is_locked and env.input_spec.is_locked
        with pytest.raises(LockedSpecError):
            env.input_spec["full_action_spec", "action"] = Unbounded(())
        env = pickle.loads(pickle.dumps(env))
    env = CountingEnv(spec_locked=False)
    assert not env.is_spec_locked and not env.input_spec.is_locked


def test_shape_is_the_batch_size():
    # issue 24 item 3
    assert CountingEnv(batch_size=(4, 2)).shape == torch.Size([4, 2])
    assert CountingEnv().shape == torch.Size([])


def test_unbatched_spec_views():
    # a smaller difference of issue 24: TorchRL's *_spec_unbatched
    env = NestedCountingEnv(batch_size=(3, 1, 7))
    for name in (
        "full_action_spec",
        "full_done_spec",
        "full_observation_spec",
        "full_reward_spec",
        "input_spec",
        "output_spec",
    ):
        assert not getattr(env, f"{name}_unbatched").shape, name
    assert env.full_action_spec_unbatched[env.action_key].shape
    assert env.output_spec.is_in(env.output_spec_unbatched.expand(*env.shape).zero())
    assert env.input_spec.is_in(env.input_spec_unbatched.expand(*env.shape).zero())


@pytest.mark.parametrize("env_cls", [DoneOnlyEnv, TerminatedOnlyEnv])
async def test_done_and_terminated_complete_each_other(env_cls):
    env = env_cls(max_steps=[1, 2], batch_size=(2,))
    td = env.rand_action(await env.reset())
    td = await env.step(td)
    assert td["next", "done"].tolist() == [[True], [False]]
    assert td["next", "terminated"].tolist() == [[True], [False]]


@pytest.mark.parametrize("batch_size", [(), (2,), (8, 3)])
async def test_partial_reset_with_reset_flags(batch_size, max_steps=3):
    torch.manual_seed(0)
    env = CountingEnv(max_steps=max_steps, batch_size=batch_size)
    action = env.full_action_spec["action"].rand()
    for i in range(max_steps + 1):
        td = await env.step(TensorDict({"action": action}, batch_size=batch_size))
        assert (td["next", "observation"] == i + 1).all()
    assert td["next", "done"].all()
    reset = torch.rand((*batch_size, 1)) < 0.5
    reset.reshape(-1)[0] = True
    data = td["next"].exclude("reward").set("_reset", reset)
    out = await env.reset(data)
    assert (out["done"][reset] == 0).all() and (out["observation"][reset] == 0).all()
    assert (out["done"][~reset] == 1).all()
    assert (out["observation"][~reset] == max_steps + 1).all()


async def test_batch_locked_env_refuses_other_batch_sizes():
    env = CountingEnv(batch_size=(2,))
    td = env.rand_action(await env.reset())
    with pytest.raises(BatchSizeError, match=r"\(2,\)"):
        await env.step(td.expand(3, 2).clone())
    await env.step(td)


async def test_batch_unlocked_env_takes_extra_leading_dims():
    env = DoublingEnv()
    assert not env.batch_locked
    td = env.rand_action(await env.reset())
    out = await env.step(td.expand(3).clone())
    assert out["next", "observation"].shape == (3, 2)
    torch.testing.assert_close(out["next", "observation"], out["action"] * 2)
    # aenv differs on purpose: batch_locked is settable on an env (TorchRL: read-only), so
    # an env that can take any batch says so after its constructor
    env.batch_locked = True
    with pytest.raises(BatchSizeError):
        await env.step(td.expand(3).clone())


async def test_seeded_rollouts_are_reproducible():
    env = GymEnv("Pendulum-v1")
    assert await env.set_seed(0) == 1
    torch.manual_seed(0)
    first = await env.rollout(30)
    await env.set_seed(0)
    torch.manual_seed(0)
    second = await env.rollout(30)
    torch.testing.assert_close(first["observation"], second["observation"])
    # each step starts where the previous ended
    torch.testing.assert_close(first["observation"][1:], first["next", "observation"][:-1])
    await env.aclose()


async def test_rollout_stops_at_the_first_done():
    env = CountingEnv(max_steps=3)
    td = await env.rollout(10)
    assert td.batch_size == (3,) and td.names[-1] == "time"
    assert td["next", "done"].squeeze(-1).tolist() == [False, False, True]


async def test_rollout_without_break_resets_done_envs():
    env = CountingEnv(max_steps=2)
    td = await env.rollout(5, break_when_any_done=False)
    assert td["next", "observation"].squeeze(-1).tolist() == [1, 2, 1, 2, 1]
    assert td["observation"].squeeze(-1).tolist() == [0, 1, 0, 1, 0]


async def test_rollout_set_truncated_marks_the_last_step():
    env = CountingEnv(max_steps=10)
    env.add_truncated_keys()
    td = await env.rollout(3, set_truncated=True)
    assert td["next", "truncated"].squeeze(-1).tolist() == [False, False, True]
    assert td["next", "done"].squeeze(-1).tolist() == [False, False, True]


async def test_rollout_from_a_given_tensordict_without_auto_reset():
    env = CountingEnv(max_steps=10)
    td = await env.reset()
    for _ in range(2):
        td = env._step_mdp(await env.rand_step(td))
    out = await env.rollout(2, auto_reset=False, tensordict=td)
    assert out["observation"].squeeze(-1).tolist() == [2, 3]


async def test_step_and_maybe_reset_resets_what_is_done():
    env = CountingEnv(max_steps=1)
    td = env.rand_action(await env.reset())
    stepped, nxt = await env.step_and_maybe_reset(td)
    assert stepped["next", "done"].all() and stepped["next", "observation"].item() == 1
    assert nxt["observation"].item() == 0 and not nxt["done"].any()


async def test_env_with_no_entries_runs():
    # TorchRL's env that does nothing (the batched cases are in test_batched.py)
    env = NothingEnv()
    await acheck_env_specs(env)
    td = await env.rollout(3)
    # aenv differs on purpose: an env always has a reward (a default spec, zero-filled
    # when _step leaves it out), so rollouts always match the specs
    rest = td.exclude("done", "terminated", ("next", "done"), ("next", "terminated"))
    assert set(rest.keys(True, True)) == {("next", "reward")}
    assert (rest["next", "reward"] == 0).all()


async def test_fake_tensordict_matches_a_step():
    env = NestedCountingEnv(batch_size=(2,))
    fake = env.fake_tensordict()
    real = await env.rand_step(await env.reset())
    assert set(fake.keys(True, True)) == set(real.keys(True, True))
    for key in fake.keys(True, True):
        assert fake[key].shape == real[key].shape and fake[key].dtype == real[key].dtype


async def test_action_dtype_held_exactly_is_cast():
    # issue 24 item 9: float one-hots and other integer dtypes are cast
    env = BinaryActionEnv()
    td = await env.reset()
    td["action"] = torch.tensor([1.0, 0.0, 1.0])
    out = await env.step(td)
    assert out["action"].dtype == torch.int8 and env.seen == [torch.int8]
    assert out["next", "observation"].item() == 2.0
    td = env._step_mdp(out)
    td["action"] = torch.tensor([1, 1, 0], dtype=torch.int64)
    assert (await env.step(td))["next", "observation"].item() == 2.0


@pytest.mark.parametrize("value", [[0.5, 0.0, 1.0], [300, 0, 1]])
async def test_action_dtype_that_cannot_hold_the_value_is_an_error(value):
    env = BinaryActionEnv()
    td = await env.reset()
    action = torch.tensor(value)
    td["action"] = action
    with pytest.raises(SpecViolationError, match=r"'action'.*Binary") as info:
        await env.step(td)
    assert str(value[0]) in str(info.value) and info.value.key == "action"
    assert td["action"] is action and env.seen == []  # nothing changed, nothing stepped


async def test_dynamic_spec_rollout_is_a_lazy_stack():
    env = DynamicSpecEnv(max_count=5)
    td = await env.rollout(4, return_contiguous=False)
    assert isinstance(td, LazyStackedTensorDict)
    assert [t["next", "observation"].shape[1] for t in td.unbind(0)] == [2, 3, 4, 5]
    await acheck_env_specs(env, return_contiguous=False)
    # aenv differs on purpose: return_contiguous=True gives the lazy stack too (TorchRL
    # raises): a dynamic spec has no contiguous form
    assert isinstance(await env.rollout(4), LazyStackedTensorDict)


def test_sync_facade_rollout_matches_the_async_one():
    env = SyncEnv(CountingEnv(max_steps=3))
    td = env.rollout(5)
    assert td["next", "observation"].squeeze(-1).tolist() == [1, 2, 3]
    env.close()


# items 4-6 of issue 24 (the lead's rollout rewrite)
async def test_out_of_place_policy_keeps_the_observation():
    env = CountingEnv(max_steps=10)
    action = env.full_action_spec["action"].zero()
    td = await env.rollout(3, lambda td: td.empty().set("action", action))
    assert "observation" in td.keys() and "done" in td.keys()


async def test_plain_module_policy_reads_the_observation():
    env = GymEnv("CartPole-v1", categorical_action_encoding=True)

    class ArgMax(nn.Module):
        def forward(self, values: torch.Tensor) -> torch.Tensor:
            return values.argmax(-1)

    policy = nn.Sequential(nn.Linear(4, 2), ArgMax())
    try:
        td = await env.rollout(5, policy)
        assert td["action"].dtype == torch.int64
    finally:
        await env.aclose()


async def test_chained_rollouts_continue_where_the_last_step_left():
    env = CountingEnv(max_steps=[2, 10], batch_size=(2,))
    first = await env.rollout(
        2, auto_reset=False, break_when_any_done=False, tensordict=await env.reset()
    )
    assert first["next", "done"][:, -1].squeeze(-1).tolist() == [True, False]
    nxt = env._step_mdp(first[..., -1])
    second = await env.rollout(2, auto_reset=False, break_when_any_done=False, tensordict=nxt)
    # env 0 was done after the last step: the second rollout resets it (its input says
    # so), env 1 goes on from 2; no transition that never happened
    assert second["observation"].squeeze(-1).tolist() == [[0, 1], [2, 3]]
    assert second["next", "observation"].squeeze(-1).tolist() == [[1, 2], [3, 4]]
