"""Transforms on envs, as TorchRL's transform tests check them (the env-facing behaviour:
specs, reset, partial resets, batched envs)."""

from __future__ import annotations

import pytest
import torch

from aenv import acheck_env_specs
from aenv.pool import AsyncEnvPool
from aenv.specs import Composite, Unbounded
from aenv.sync import SerialEnv
from aenv.testing import CountingEnv
from aenv.transforms import (
    CatFrames,
    Compose,
    DoubleToFloat,
    ExcludeTransform,
    InitTracker,
    ObservationNorm,
    RenameTransform,
    RewardScaling,
    RewardSum,
    StepCounter,
    TensorDictPrimer,
    TransformedEnv,
    UnsqueezeTransform,
)
from conformance._envs import MethodEnv

pytestmark = pytest.mark.timeout(30)


async def test_step_counter_counts_truncates_and_resets():
    env = TransformedEnv(CountingEnv(max_steps=100), StepCounter(max_steps=3))
    await acheck_env_specs(env)
    td = await env.rollout(10)
    assert td["next", "step_count"].squeeze(-1).tolist() == [1, 2, 3]
    assert td["next", "truncated"].squeeze(-1).tolist() == [False, False, True]
    assert (await env.reset())["step_count"].item() == 0


async def test_reward_sum_accumulates_within_an_episode():
    env = TransformedEnv(CountingEnv(max_steps=2), RewardSum())
    await acheck_env_specs(env)
    td = await env.rollout(5, break_when_any_done=False)
    assert td["next", "episode_reward"].squeeze(-1).tolist() == [1, 2, 1, 2, 1]


async def test_transforms_on_a_pool_reset_only_the_flagged_envs():
    pool = AsyncEnvPool((3, CountingEnv))
    env = TransformedEnv(pool, Compose(StepCounter(), RewardSum()))
    td = await env.reset()
    for _ in range(2):
        td = env._step_mdp(await env.rand_step(td))
    td["_reset"] = torch.tensor([[True], [False], [True]])
    out = await env.reset(td)
    assert out["step_count"].squeeze(-1).tolist() == [0, 2, 0]
    assert out["episode_reward"].squeeze(-1).tolist() == [0, 2, 0]
    await env.aclose()


async def test_compose_applies_in_order_and_is_indexable():
    t = Compose(RenameTransform(["observation"], ["obs"]), UnsqueezeTransform(-1, ["obs"]))
    env = TransformedEnv(CountingEnv(), t)
    assert isinstance(env.transform[0], RenameTransform) and len(env.transform) == 2
    td = await env.reset()
    assert "observation" not in td.keys() and td["obs"].shape == (1, 1)
    assert env.observation_spec["obs"].shape == (1, 1)
    env.append_transform(StepCounter())
    assert "step_count" in (await env.reset()).keys()


async def test_observation_norm_moves_data_and_specs():
    env = TransformedEnv(
        CountingEnv(max_steps=10), ObservationNorm(loc=1.0, scale=2.0, in_keys=["observation"])
    )
    td = await env.rollout(3)
    assert td["next", "observation"].squeeze(-1).tolist() == [3.0, 5.0, 7.0]
    await acheck_env_specs(env)


async def test_reward_scaling():
    env = TransformedEnv(CountingEnv(), RewardScaling(loc=0.5, scale=2.0))
    td = await env.rollout(2)
    assert td["next", "reward"].squeeze(-1).tolist() == [2.5, 2.5]


async def test_init_tracker_marks_only_first_steps():
    env = TransformedEnv(CountingEnv(max_steps=2), InitTracker())
    td = await env.rollout(4, break_when_any_done=False)
    assert td["is_init"].squeeze(-1).tolist() == [True, False, True, False]


async def test_cat_frames_stacks_the_last_n_observations():
    env = TransformedEnv(CountingEnv(max_steps=10), CatFrames(3, dim=-1, in_keys=["observation"]))
    assert env.observation_spec["observation"].shape == (3,)
    td = await env.rollout(3)
    assert td["next", "observation"].tolist() == [[0, 0, 1], [0, 1, 2], [1, 2, 3]]


class DoubleCounting(CountingEnv):
    """A counting env whose observation is float64."""

    def __init__(self) -> None:
        super().__init__(max_steps=10)
        self.observation_spec = Composite(observation=Unbounded((1,), dtype=torch.float64))

    def _reset(self, td, **kwargs):
        out = super()._reset(td, **kwargs)
        return out.set("observation", out["observation"].double())

    def _step(self, td):
        out = super()._step(td)
        return out.set("observation", out["observation"].double())


async def test_double_to_float_changes_spec_and_data():
    base = DoubleCounting()
    assert (await base.reset())["observation"].dtype == torch.float64
    env = TransformedEnv(base, DoubleToFloat(in_keys=["observation"]))
    assert env.observation_spec["observation"].dtype == torch.float32
    td = await env.rollout(2)
    assert td["observation"].dtype == td["next", "observation"].dtype == torch.float32
    await acheck_env_specs(env)


async def test_exclude_transform_drops_keys_from_data_and_specs():
    env = TransformedEnv(CountingEnv(), ExcludeTransform("observation"))
    assert "observation" not in env.observation_spec.keys()
    td = await env.rollout(2)
    assert "observation" not in td.keys() and ("next", "observation") not in td.keys(True)
    await acheck_env_specs(env)


async def test_primer_adds_state_entries():
    env = TransformedEnv(CountingEnv(), TensorDictPrimer(hidden=Unbounded((4,))))
    assert "hidden" in env.state_spec.keys()
    td = await env.rollout(3)
    assert td["hidden"].shape == (3, 4) and ("next", "hidden") in td.keys(True)
    await acheck_env_specs(env)


def test_transformed_env_reaches_the_base_env_attributes():
    env = TransformedEnv(MethodEnv(), StepCounter())
    assert env.custom_prop == 2 and env.custom_fun() == 0 and env.calls == 1


def test_transformed_batched_env_fans_out_through_the_facade():
    with SerialEnv(2, lambda: TransformedEnv(MethodEnv(), StepCounter())) as env:
        assert env.custom_fun() == [0, 0]
        td = env.rollout(3)
        assert td["next", "step_count"][0].squeeze(-1).tolist() == [1, 2, 3]
