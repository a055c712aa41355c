"""check_env_specs, step_mdp, terminated_or_truncated, RandomPolicy, exploration type."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from aenv import (
    Composite,
    EnvBase,
    ExplorationType,
    PendulumEnv,
    RandomPolicy,
    Unbounded,
    acheck_env_specs,
    exploration_type,
    get_available_libraries,
    set_exploration_type,
    step_mdp,
    terminated_or_truncated,
)
from aenv.testing import (
    CountingEnv,
    DynamicSpecEnv,
    LatencyEnv,
    NestedCountingEnv,
    SyncLatencyEnv,
    TextEnv,
)


@pytest.mark.parametrize(
    "make",
    [
        lambda: CountingEnv(),
        lambda: CountingEnv(batch_size=(3,)),
        lambda: NestedCountingEnv(batch_size=(2,)),
        lambda: LatencyEnv(latency=0.0),
        lambda: SyncLatencyEnv(latency=0.0),
        lambda: PendulumEnv(seed=0),
        lambda: DynamicSpecEnv(),
        lambda: TextEnv(),
    ],
)
async def test_check_env_specs_passes_on_testing_envs(make):
    env = make()
    contiguous = not isinstance(env, (DynamicSpecEnv, TextEnv))
    await acheck_env_specs(env, return_contiguous=contiguous, seed=0)


async def test_check_env_specs_batched_pendulum():
    env = PendulumEnv(seed=0)
    await acheck_env_specs(env, tensordict=TensorDict({}, [5]))


async def test_check_env_specs_catches_lying_env():
    class Liar(CountingEnv):
        def _step(self, td):
            out = super()._step(td)
            out["observation"] = out["observation"].double()
            return out

    with pytest.raises(AssertionError, match="dtype"):
        await acheck_env_specs(Liar())

    class Undeclared(CountingEnv):
        def _step(self, td):
            out = super()._step(td)
            out["secret"] = torch.zeros(1)
            return out

    with pytest.raises(AssertionError, match="secret"):
        await acheck_env_specs(Undeclared())


def test_step_mdp_moves_next_and_keeps_other():
    td = TensorDict(
        {
            "obs": torch.zeros(2, 1),
            "hidden": torch.ones(2, 3),
            "action": torch.ones(2, 1),
            "done": torch.zeros(2, 1, dtype=torch.bool),
            "next": {
                "obs": torch.ones(2, 1),
                "reward": torch.ones(2, 1),
                "done": torch.ones(2, 1, dtype=torch.bool),
            },
        },
        [2],
    )
    out = step_mdp(td)
    assert out["obs"].eq(1).all() and out["done"].all()
    assert "reward" not in out.keys() and "action" not in out.keys()
    assert out["hidden"].eq(1).all()
    out = step_mdp(td, keep_other=False, exclude_reward=False)
    assert "hidden" not in out.keys() and "reward" in out.keys()
    out = step_mdp(td, exclude_action=False)
    assert "action" in out.keys()


def test_terminated_or_truncated_writes_reset_per_level():
    td = TensorDict(
        {
            "done": torch.tensor([[False], [False]]),
            "agents": TensorDict(
                {"terminated": torch.tensor([[[True], [False]], [[False], [False]]])}, [2, 2]
            ),
        },
        [2],
    )
    assert terminated_or_truncated(td)
    assert ("agents", "_reset") in td.keys(True)
    assert "_reset" not in td.keys()
    td2 = TensorDict({"done": torch.zeros(3, 1, dtype=torch.bool)}, [3])
    assert not terminated_or_truncated(td2)
    assert not terminated_or_truncated(td2, write_full_false=True) and "_reset" in td2.keys()


async def test_random_policy_respects_spec():
    env = CountingEnv(batch_size=(4,))
    policy = RandomPolicy(env.full_action_spec)
    td = policy(await env.reset())
    assert env.full_action_spec.is_in(td.select("action"))
    leaf_policy = RandomPolicy(env.action_spec)
    td = leaf_policy(await env.reset())
    assert td["action"].shape == torch.Size([4, 1])
    pend = PendulumEnv(seed=0)
    td = RandomPolicy(pend.action_spec)(TensorDict({}, [7]))
    assert td["action"].shape == torch.Size([7, 1])


def test_exploration_type_context():
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        assert exploration_type() == ExplorationType.DETERMINISTIC
    with set_exploration_type(ExplorationType.RANDOM):
        assert exploration_type() == ExplorationType.RANDOM


def test_get_available_libraries():
    libs = get_available_libraries()
    assert libs["gymnasium"] is True
    assert isinstance(libs["ray"], bool)


async def test_pendulum_any_batch_size_and_reward_sign():
    env = PendulumEnv(seed=1)
    assert not env.batch_locked
    for batch in [(), (3,), (2, 4)]:
        td = await env.reset(TensorDict({}, batch))
        r = await env.rollout(4, tensordict=td, auto_reset=False)
        assert r.batch_size == torch.Size([*batch, 4])
        assert (r["next", "reward"] <= 0).all()


async def test_pendulum_seeding_reproducible():
    a, b = PendulumEnv(), PendulumEnv()
    await a.set_seed(7)
    await b.set_seed(7)

    def zero_torque(td):
        td["action"] = torch.zeros(1)

    ra, rb = await a.rollout(5, zero_torque), await b.rollout(5, zero_torque)
    assert torch.equal(ra["th"], rb["th"])
    await b.set_seed(8)
    rc = await b.rollout(5, zero_torque)
    assert not torch.equal(ra["th"], rc["th"])


async def test_latency_env_seeded_latencies():
    a = LatencyEnv(median=0.001, sigma=1.0, seed=3)
    b = LatencyEnv(median=0.001, sigma=1.0, seed=3)
    assert [a.draw_latency() for _ in range(5)] == [b.draw_latency() for _ in range(5)]
    c = LatencyEnv(median=0.001, sigma=1.0, seed=4)
    assert a.draw_latency() != c.draw_latency()


async def test_failing_and_hanging_envs():
    import anyio

    from aenv.testing import FailingEnv, HangingEnv

    env = FailingEnv(fail_after=2, message="kaput")
    td = await env.reset()
    td = env._step_mdp(await env.rand_step(td))
    td = env._step_mdp(await env.rand_step(td))
    with pytest.raises(RuntimeError, match="kaput"):
        await env.rand_step(td)

    hang = HangingEnv(hang_after=0)
    td = await hang.reset()
    with anyio.move_on_after(0.05) as scope:
        await hang.rand_step(td)
    assert scope.cancelled_caught


def test_composite_unbounded_smoke():
    c = Composite(a=Unbounded((2,)))
    assert c.zero()["a"].shape == torch.Size([2])


class _NoImpl(EnvBase):
    pass


async def test_missing_implementation_is_clear():
    env = _NoImpl()
    with pytest.raises(NotImplementedError, match="_reset"):
        await env.reset()


async def test_pendulum_dynamics_match_gymnasium():
    import gymnasium as gym
    import numpy as np

    genv = gym.make("Pendulum-v1").unwrapped
    genv.reset(seed=0)
    env = PendulumEnv(seed=0)
    td = await env.reset()
    th, thdot = float(td["th"]), float(td["thdot"])
    genv.state = np.array([th, thdot])
    for u in [0.5, -2.0, 1.3]:
        td["action"] = torch.tensor([u])
        td = await env.step(td)
        _, reward, *_ = genv.step(np.array([u], dtype=np.float32))
        g_th, g_thdot = genv.state
        wrapped = (g_th + np.pi) % (2 * np.pi) - np.pi
        assert abs(float(td["next", "th"]) - wrapped) < 1e-4
        assert abs(float(td["next", "thdot"]) - g_thdot) < 1e-4
        assert abs(float(td["next", "reward"]) - reward) < 1e-3
        td = env._step_mdp(td)


def test_step_mdp_does_not_share_nested_containers():
    td = TensorDict(
        {"obs": torch.zeros(1), "next": {"obs": torch.ones(1), "ep": {"r": torch.ones(1)}}}, []
    )
    out = step_mdp(td)
    out.update(TensorDict({"ep": {"r": torch.zeros(1)}}, []))
    assert td["next", "ep", "r"].item() == 1.0


def test_complete_done_cases_and_no_aliasing():
    from aenv._mdp import complete_done

    groups = {(): ["done", "terminated", "truncated"]}
    zeros = {(): torch.zeros(1, dtype=torch.bool)}
    t, f = torch.tensor([True]), torch.tensor([False])
    # nothing given: zeros, and the cached zero tensor is not handed out
    td = complete_done(TensorDict({}, []), groups, zeros)
    assert not td["done"].any() and not td["terminated"].any() and not td["truncated"].any()
    assert td["terminated"] is not zeros[()] and td["done"] is not td["terminated"]
    assert td["truncated"] is not td["done"] and td["truncated"] is not td["terminated"]
    assert list(td.keys()) == ["terminated", "done", "truncated"]
    td["done"][0] = True  # each a tensor of its own: writing one changes no other
    assert not td["terminated"].item() and not td["truncated"].item() and not zeros[()].item()
    # a level declaring no truncated gets none; a batched level gets zeros of its shape
    td = complete_done(TensorDict({}, []), {(): ["done", "terminated"]}, zeros)
    assert sorted(td.keys()) == ["done", "terminated"]
    bz = {(): torch.zeros(3, 1, dtype=torch.bool)}
    td = complete_done(TensorDict({}, [3]), groups, bz)
    assert td["done"].shape == (3, 1) and not td["truncated"].any()
    # a locked tensordict is written through its checks (which refuse new entries)
    with pytest.raises(RuntimeError):
        complete_done(TensorDict({}, []).lock_(), groups, zeros)
    # only done: terminated is a copy, not the same tensor
    td = complete_done(TensorDict({"done": t.clone()}, []), groups, zeros)
    assert td["terminated"].item() and td["terminated"] is not td["done"]
    # only terminated + truncated: done is the union
    td = complete_done(
        TensorDict({"terminated": f.clone(), "truncated": t.clone()}, []), groups, zeros
    )
    assert td["done"].item() and not td["terminated"].item()
    # done given False, truncated True: done becomes True
    td = complete_done(TensorDict({"done": f.clone(), "truncated": t.clone()}, []), groups, zeros)
    assert td["done"].item() and not td["terminated"].item()


def test_latency_ideal_steps_replays_the_env_draws():
    from aenv.testing import latency_ideal_steps

    env = LatencyEnv(median=0.01, sigma=1.0, seed=5)
    total, steps = 0.0, 0
    while True:
        total += env.draw_latency()
        if total > 0.5:
            break
        steps += 1
    assert latency_ideal_steps(0.5, median=0.01, sigma=1.0, seed=5) == steps
    assert latency_ideal_steps(1.0, latency=0.1) == 10
