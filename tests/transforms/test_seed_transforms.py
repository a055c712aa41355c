"""The seeds' transforms that were missing: each through sync facades and as its async twin."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from aenv import (
    AsyncEnvPool,
    BatchSizeTransform,
    BurnInTransform,
    Composite,
    DiscreteActionProjection,
    EndOfLifeTransform,
    EnvBase,
    GymEnv,
    GymWrapper,
    KLRewardTransform,
    PendulumEnv,
    PinMemoryTransform,
    RandomCropTensorDict,
    Reward2GoTransform,
    SerialEnv,
    SyncEnv,
    TargetReturn,
    TimeMaxPool,
    TransformedEnv,
    Unbounded,
    acheck_env_specs,
    check_env_specs,
    gSDENoise,
)
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(60)


class SequenceEnv(EnvBase):
    """Outputs a fixed sequence of observations, one per step."""

    def __init__(self, values):
        super().__init__()
        self.values = values
        self.observation_spec = Composite(observation=Unbounded((1,)))
        self.action_spec = Unbounded((1,))
        self.i = 0

    def _set_seed(self, seed):
        pass

    def _reset(self, td):
        self.i = 0
        return TensorDict(observation=torch.tensor([float(self.values[0])]))

    def _step(self, td):
        self.i += 1
        return TensorDict(observation=torch.tensor([float(self.values[self.i])]))


class LivesEnv(gymnasium.Env):
    """A gymnasium env with Atari-style lives: one lost every 3 steps, over after 3."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.lives, self.t = 3, 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t % 3 == 0:
            self.lives -= 1
        return np.zeros(1, np.float32), 1.0, self.lives == 0, False, {}


# ---------------------------------------------------------------- BatchSizeTransform
def test_batch_size_transform_sync():
    env = SyncEnv(TransformedEnv(PendulumEnv(), BatchSizeTransform([4])))
    check_env_specs(env)
    assert env.batch_size == (4,) and env.action_spec.shape == (4, 1)
    r = env.rollout(3)
    assert r.batch_size == (4, 3) and r["params", "g"].shape == (4, 3)
    with pytest.raises(ValueError, match="batch-unlocked"):
        TransformedEnv(CountingEnv(), BatchSizeTransform([2]))
    with pytest.raises(ValueError, match="must end with"):
        TransformedEnv(CountingEnv(batch_size=(3,)), BatchSizeTransform([2]))


async def test_batch_size_transform_in_a_pool_async():
    make = lambda: TransformedEnv(PendulumEnv(), BatchSizeTransform([3]))  # noqa: E731
    async with AsyncEnvPool([make, make]) as pool:
        await acheck_env_specs(pool)
        assert (await pool.rollout(5)).batch_size == (2, 3, 5)


def test_batch_size_transform_reshapes_a_batched_env_sync():
    base = CountingEnv(max_steps=[[2, 3, 4], [5, 6, 7]], batch_size=(2, 3))
    flat = BatchSizeTransform(reshape_fn=lambda td: td.reshape(-1))
    env = SyncEnv(TransformedEnv(base, flat))
    check_env_specs(env)
    assert env.batch_size == (6,) and env.observation_spec["observation"].shape == (6, 1)
    r = env.rollout(4, break_when_any_done=False)
    assert r["next", "observation"][:, -1].squeeze(-1).tolist() == [2, 1, 4, 4, 4, 4]
    td = env._step_mdp(env.rand_step(env.reset()))
    td["_reset"] = torch.tensor([True, False, False, False, False, True]).unsqueeze(-1)
    assert env.reset(td)["observation"].squeeze(-1).tolist() == [0, 1, 1, 1, 1, 0]
    with pytest.raises(ValueError, match="one of"):
        BatchSizeTransform()
    with pytest.raises(ValueError, match="same number"):
        TransformedEnv(base, BatchSizeTransform(reshape_fn=lambda td: td[:1]))


async def test_batch_size_transform_partial_step_after_reshape_async():
    base = CountingEnv(max_steps=10, batch_size=(2, 3))
    env = TransformedEnv(base, BatchSizeTransform(reshape_fn=lambda td: td.unsqueeze(0)))
    assert env.batch_size == (1, 2, 3)
    td = env.rand_action(await env.reset())
    td["_step"] = torch.tensor([[[True, False, True], [False, True, False]]])
    out = await env.step(td)
    assert out["next", "observation"].squeeze(-1).tolist() == [[[1, 0, 1], [0, 1, 0]]]


# ---------------------------------------------------------------- TargetReturn
def test_target_return_on_a_serial_env_sync():
    env = TransformedEnv(
        SerialEnv(2, CountingEnv, [{"max_steps": 2}, {"max_steps": 3}]), TargetReturn(10.0)
    )
    try:
        check_env_specs(env)
        r = env.rollout(5, break_when_any_done=False)
        # each env's target restarts at 10 when it is reset
        assert r["next", "target_return"][0].squeeze(-1).tolist() == [9, 8, 9, 8, 9]
        assert r["next", "target_return"][1].squeeze(-1).tolist() == [9, 8, 7, 9, 8]
    finally:
        env.close()


async def test_target_return_constant_async():
    env = TransformedEnv(CountingEnv(max_steps=3), TargetReturn(5.0, mode="constant"))
    r = await env.rollout(3)
    assert r["next", "target_return"].squeeze(-1).tolist() == [5, 5, 5]
    with pytest.raises(ValueError, match="mode"):
        TargetReturn(1.0, mode="sum")


# ---------------------------------------------------------------- TimeMaxPool
def test_time_max_pool_sync():
    env = SyncEnv(TransformedEnv(SequenceEnv([3, 1, 2, 0, 0, 5, 1]), TimeMaxPool(T=2)))
    td = env.reset()
    assert td["observation"].item() == 3
    r = env.rollout(6, tensordict=td, auto_reset=False)
    # max over the last 2 raw observations: (3,1) (1,2) (2,0) (0,0) (0,5) (5,1)
    assert r["next", "observation"].squeeze(-1).tolist() == [3, 2, 2, 0, 5, 5]


async def test_time_max_pool_restarts_on_reset_async():
    env = TransformedEnv(SequenceEnv([9, 1, 2, 3]), TimeMaxPool(T=3, out_keys=["pooled"]))
    r = await env.rollout(3)
    # windows of 3: (9, 9, 1) (9, 1, 2) (1, 2, 3)
    assert r["next", "pooled"].squeeze(-1).tolist() == [9, 9, 3]
    td = await env.reset()
    assert td["pooled"].item() == 9 and td["observation"].item() == 9
    with pytest.raises(ValueError, match="T >= 1"):
        TimeMaxPool(T=0)


# ---------------------------------------------------------------- EndOfLifeTransform
def test_end_of_life_sync():
    env = SyncEnv(TransformedEnv(GymWrapper(LivesEnv()), EndOfLifeTransform(eol_attribute="lives")))
    check_env_specs(env)
    r = env.rollout(9)
    assert r["next", "lives"].squeeze(-1).tolist() == [3, 3, 2, 2, 2, 1, 1, 1, 0]
    eol = r["next", "end-of-life"].squeeze(-1).tolist()
    assert eol == [False, False, True, False, False, True, False, False, True]


async def test_end_of_life_on_a_thread_pool_async():
    pool = AsyncEnvPool([lambda: GymWrapper(LivesEnv())] * 2, backend="thread")
    async with TransformedEnv(pool, EndOfLifeTransform(eol_attribute="unwrapped.lives")) as env:
        r = await env.rollout(4)
        assert r["next", "end-of-life"].squeeze(-1).tolist() == [[False, False, True, False]] * 2


# ---------------------------------------------------------------- DiscreteActionProjection
def test_discrete_action_projection_one_hot_sync():
    env = SyncEnv(TransformedEnv(GymEnv("CartPole-v1"), DiscreteActionProjection(2, 7)))
    assert env.action_spec.shape == (7,)
    check_env_specs(env)
    t = env.transform[0]
    torch.manual_seed(0)
    mapped = t.inv(TensorDict(action=torch.nn.functional.one_hot(torch.tensor(6), 7)))
    assert mapped["action"].shape == (2,) and mapped["action"].sum() == 1
    kept = t.inv(TensorDict(action=torch.nn.functional.one_hot(torch.tensor(1), 7)))
    assert kept["action"].tolist() == [0, 1]
    td = env.reset()
    td["action"] = torch.nn.functional.one_hot(torch.tensor(5), 7)
    assert env.step(td)["next", "observation"].shape == (4,)


async def test_discrete_action_projection_categorical_async():
    env = TransformedEnv(
        GymEnv("CartPole-v1", categorical_action_encoding=True), DiscreteActionProjection(2, 5)
    )
    assert env.action_spec.n == 5
    await acheck_env_specs(env)
    mapped = env.transform[0].inv(TensorDict(action=torch.tensor([4, 1, 3, 0]), batch_size=[4]))
    assert mapped["action"][1].item() == 1 and mapped["action"][3].item() == 0
    assert bool((mapped["action"] < 2).all())
    with pytest.raises(ValueError, match="num_actions_effective"):
        TransformedEnv(GymEnv("CartPole-v1"), DiscreteActionProjection(3, 5))


# ---------------------------------------------------------------- gSDENoise
def test_gsde_noise_is_drawn_per_episode_sync():
    env = TransformedEnv(SerialEnv(2, PendulumEnv), gSDENoise(state_dim=3, action_dim=1))
    try:
        td = env.reset()
        eps = td["_eps_gSDE"]
        assert eps.shape == (2, 1, 3) and eps.std() > 0
        r = env.rollout(3, tensordict=td, auto_reset=False)
        assert torch.equal(r["next", "_eps_gSDE"][:, -1], eps)  # carried along
        nxt = env._step_mdp(r[:, -1])
        nxt["_reset"] = torch.tensor([[True], [False]])
        out = env.reset(nxt)
        assert not torch.equal(out["_eps_gSDE"][0], eps[0])  # redrawn
        assert torch.equal(out["_eps_gSDE"][1], eps[1])  # kept
    finally:
        env.close()


async def test_gsde_noise_async():
    env = TransformedEnv(PendulumEnv(), gSDENoise())
    assert (await env.reset())["_eps_gSDE"].shape == (1,)
    with pytest.raises(ValueError, match="both"):
        gSDENoise(state_dim=3)


# ---------------------------------------------------------------- KLRewardTransform
def _policy(td):
    td["action"] = torch.ones_like(td["observation"], dtype=torch.int64)
    td["sample_log_prob"] = torch.full(td["observation"].shape, -0.5)
    return td


def test_kl_reward_sync():
    ref = TensorDictModule(
        lambda obs: torch.full_like(obs, -1.0), in_keys=["observation"], out_keys=["ref_log_prob"]
    )
    env = SyncEnv(TransformedEnv(CountingEnv(max_steps=3), KLRewardTransform(ref, coef=0.2)))
    r = env.rollout(3, policy=_policy)
    # kl = -0.5 - (-1.0) = 0.5; reward 1 - 0.2 * 0.5
    assert r["next", "reward"].squeeze(-1).tolist() == pytest.approx([0.9] * 3)
    assert r["next", "kl"].squeeze(-1).tolist() == pytest.approx([0.5] * 3)
    with pytest.raises(KeyError, match="sample_log_prob"):
        env.rollout(2)  # random actions carry no log-prob


async def test_kl_reward_async_reference():
    async def ref(td):
        return torch.full(td["observation"].shape, -0.5)

    env = TransformedEnv(CountingEnv(max_steps=2), KLRewardTransform(ref))
    r = await env.rollout(2, policy=_policy)
    assert r["next", "reward"].squeeze(-1).tolist() == [1.0, 1.0]


# ---------------------------------------------------------------- PinMemoryTransform
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_pin_memory_refuses_without_an_accelerator():
    with pytest.raises(RuntimeError, match="CUDA"):
        PinMemoryTransform()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA to pin memory for")
async def test_pin_memory_pins_outputs():
    env = TransformedEnv(CountingEnv(max_steps=3), PinMemoryTransform())
    td = await env.reset()
    assert td["observation"].is_pinned()
    td = await env.rand_step(td)
    assert td["next", "observation"].is_pinned()
    with SyncEnv(TransformedEnv(CountingEnv(), PinMemoryTransform())) as sync:
        assert sync.reset()["observation"].is_pinned()


# ---------------------------------------------------------------- trajectory transforms
def test_reward_to_go_restarts_after_done_sync():
    with SerialEnv(2, CountingEnv, {"max_steps": 3}) as env:
        data = env.rollout(5, break_when_any_done=False)
    out = Reward2GoTransform(gamma=0.5)(data)
    assert out["next", "reward_to_go"][0].squeeze(-1).tolist() == [1.75, 1.5, 1.0, 1.5, 1.0]
    assert torch.equal(
        Reward2GoTransform(0.5).inv(data.clone())["next", "reward_to_go"],
        out["next", "reward_to_go"],
    )


async def test_trajectory_transforms_refuse_envs_async():
    for t in (Reward2GoTransform(), RandomCropTensorDict(2)):
        with pytest.raises(RuntimeError, match="trajectories"):
            TransformedEnv(CountingEnv(), t)
    data = await CountingEnv(max_steps=10).rollout(8)
    crop = RandomCropTensorDict(3)(data.unsqueeze(0).expand(5, 8).clone())
    obs = crop["observation"].squeeze(-1)
    assert crop.batch_size == (5, 3) and bool((obs[:, 1:] - obs[:, :-1] == 1).all())


def test_random_crop_honours_the_mask():
    data = TensorDict(
        {"t": torch.arange(8).expand(64, 8), "mask": torch.arange(8).expand(64, 8) < 4}, [64, 8]
    )
    out = RandomCropTensorDict(3, mask_key="mask")(data)
    assert bool((out["t"] < 4).all()) and set(out["t"][:, 0].tolist()) == {0, 1}
    with pytest.raises(ValueError, match="fewer"):
        RandomCropTensorDict(5, mask_key="mask")(data)


def test_burn_in_carries_the_recurrent_state():
    class Cell(torch.nn.Module):
        def forward(self, obs, h):
            return h + obs

    module = TensorDictModule(Cell(), in_keys=["obs", "h"], out_keys=[("next", "h")])
    seq = TensorDict(
        {"obs": torch.arange(1.0, 7.0).expand(2, 6).unsqueeze(-1), "h": torch.zeros(2, 6, 1)},
        [2, 6],
    )
    out = BurnInTransform(module, burn_in=4)(seq)
    assert out.batch_size == (2, 2)
    assert out["h"][:, 0].squeeze(-1).tolist() == [10.0, 10.0]  # 1 + 2 + 3 + 4
    assert out["obs"][:, 0].squeeze(-1).tolist() == [5.0, 5.0]
    with pytest.raises(ValueError, match="nothing after"):
        BurnInTransform(module, burn_in=6)(seq)
