"""ActionMask, ConditionalSkip, TensorDictPrimer, and transforms in and around pools."""

from __future__ import annotations

import asyncio
from functools import partial

import torch
from tensordict import TensorDict

from aenv import EnvBase, PendulumEnv, acheck_env_specs
from aenv.libs.gym import GymEnv
from aenv.pool import AsyncEnvPool
from aenv.specs import Binary, Categorical, Composite, Unbounded
from aenv.testing import CountingEnv
from aenv.transforms import (
    ActionMask,
    Compose,
    ConditionalSkip,
    RewardSum,
    StepCounter,
    TensorDictPrimer,
    TransformedEnv,
)


class MaskedEnv(EnvBase):
    """Four actions, a new random subset allowed at every step; a forbidden action raises."""

    def __init__(self, batch_size=(), seed=0):
        super().__init__(batch_size=batch_size)
        bs = self.batch_size
        self.observation_spec = Composite(
            action_mask=Binary(n=4, shape=(*bs, 4), dtype=torch.bool), shape=bs
        )
        self.action_spec = Categorical(4, shape=bs)
        self.gen = torch.Generator().manual_seed(seed)

    def _new_mask(self):
        mask = torch.rand((*self.batch_size, 4), generator=self.gen) > 0.5
        mask[..., 0] |= ~mask.any(-1)  # at least one allowed action
        self.mask = mask
        return mask.clone()

    def _set_seed(self, seed):
        self.gen.manual_seed(seed)

    def _reset(self, td, **kw):
        return TensorDict(action_mask=self._new_mask(), batch_size=self.batch_size)

    def _step(self, td):
        action = td["action"]
        allowed = self.mask.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        if not bool(allowed.all()):
            raise AssertionError("a forbidden action was taken")
        return TensorDict(
            action_mask=self._new_mask(),
            reward=torch.ones((*self.batch_size, 1)),
            batch_size=self.batch_size,
        )


async def test_action_mask_random_policy_is_always_allowed():
    with_mask = TransformedEnv(MaskedEnv(), ActionMask())
    r = await with_mask.rollout(50)  # the default policy is env.rand_action
    assert r.batch_size == (50,)
    await acheck_env_specs(with_mask)
    batched = TransformedEnv(MaskedEnv(batch_size=(4,)), ActionMask())
    r = await batched.rollout(20)
    assert r.batch_size == (4, 20)
    # without the transform the random policy hits forbidden actions
    raw = MaskedEnv()
    try:
        await raw.rollout(50)
        raised = False
    except AssertionError:
        raised = True
    assert raised


async def test_action_mask_partial_reset_keeps_other_masks():
    env = TransformedEnv(MaskedEnv(batch_size=(2,)), ActionMask())
    td = await env.reset()
    kept = td["action_mask"][1].clone()
    td["_reset"] = torch.tensor([[True], [False]])
    td = await env.reset(td)
    assert torch.equal(env.action_spec.mask[1], kept)
    assert torch.equal(env.action_spec.mask[0], td["action_mask"][0])


async def test_conditional_skip_seed_example():
    base = TransformedEnv(PendulumEnv(seed=0), StepCounter(step_count_key="inner_count"))
    middle = TransformedEnv(
        base,
        Compose(
            StepCounter(step_count_key="middle_count"),
            ConditionalSkip(lambda td: td["step_count"] % 2 == 1),
        ),
    )
    env = TransformedEnv(middle, StepCounter(step_count_key="step_count"))
    r = await env.rollout(10)
    assert r["inner_count"].squeeze(-1).tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5]
    assert r["middle_count"].squeeze(-1).tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5]
    assert r["step_count"].squeeze(-1).tolist() == list(range(10))
    obs = r["th"]
    assert torch.equal(obs[1], obs[2]) and torch.equal(obs[3], obs[4])
    await acheck_env_specs(env)


async def test_conditional_skip_batched_and_async_cond():
    async def cond(td):
        await asyncio.sleep(0)
        return torch.tensor([False, True, False])

    env = TransformedEnv(
        CountingEnv(max_steps=10, batch_size=(3,)), Compose(RewardSum(), ConditionalSkip(cond))
    )
    r = await env.rollout(3)
    assert r["next", "observation"][:, -1].squeeze(-1).tolist() == [3.0, 0.0, 3.0]
    assert r["next", "episode_reward"][:, -1].squeeze(-1).tolist() == [3.0, 0.0, 3.0]
    pend = TransformedEnv(PendulumEnv(), ConditionalSkip(lambda td: torch.tensor([True, False])))
    td = await pend.reset(TensorDict({}, [2]))
    before = td["th"].clone()
    out = await pend.step(pend.rand_action(td))
    assert torch.equal(out["next", "th"][0], before[0])
    assert not torch.equal(out["next", "th"][1], before[1])


async def test_primer():
    env = TransformedEnv(
        CountingEnv(batch_size=(2,)), TensorDictPrimer(hidden=Unbounded((3,)), default_value=1.0)
    )
    assert env.observation_spec["hidden"].shape == (2, 3)
    assert "hidden" in env.state_spec.keys()
    td = await env.reset()
    assert td["hidden"].tolist() == [[1.0] * 3] * 2

    def policy(td):
        td["hidden"] = td["hidden"] + 1
        return env.rand_action(td)

    r = await env.rollout(3, policy)
    assert r["next", "hidden"][0, :, 0].tolist() == [2.0, 3.0, 4.0]
    td = env._step_mdp(r[:, -1])
    td["_reset"] = torch.tensor([[True], [False]])
    td = await env.reset(td)
    assert td["hidden"][:, 0].tolist() == [1.0, 4.0]
    await acheck_env_specs(env)
    rnd = TransformedEnv(
        GymEnv("CartPole-v1"), TensorDictPrimer({"h": Unbounded((2, 4))}, random=True)
    )
    td = await rnd.reset()
    assert td["h"].shape == (2, 4)
    await acheck_env_specs(rnd)


def _transformed_counting(max_steps):
    return TransformedEnv(CountingEnv(max_steps=max_steps), Compose(StepCounter(), RewardSum()))


async def test_transformed_env_as_pool_sub_env(backend="coroutine"):
    for backend in ("coroutine", "thread"):
        async with AsyncEnvPool(
            [partial(_transformed_counting, 2 + i) for i in range(3)], backend=backend
        ) as pool:
            assert "step_count" in pool.observation_spec.keys()
            r = await pool.rollout(4, break_when_any_done=False)
            assert r["next", "step_count"][0].squeeze(-1).tolist() == [1, 2, 1, 2]
            assert r["next", "episode_reward"][2].squeeze(-1).tolist() == [1.0, 2.0, 3.0, 4.0]
            await acheck_env_specs(pool)


async def test_transforms_on_a_pool():
    pool = AsyncEnvPool([partial(CountingEnv, max_steps=2 + i) for i in range(3)])
    env = TransformedEnv(pool, Compose(StepCounter(), RewardSum()))
    r = await env.rollout(4, break_when_any_done=False)
    assert r["next", "step_count"][0].squeeze(-1).tolist() == [1, 2, 1, 2]
    assert r["next", "episode_reward"][1].squeeze(-1).tolist() == [1.0, 2.0, 3.0, 1.0]
    await acheck_env_specs(env)
    await env.aclose()
    assert pool.is_closed
