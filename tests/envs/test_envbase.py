"""EnvBase: specs, locking, step/reset semantics, partial steps and resets, checks."""

from __future__ import annotations

import pickle
import threading

import pytest
import torch
from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict
from tensordict.nn import TensorDictModule

from aenv import (
    BatchSizeError,
    Bounded,
    Categorical,
    Composite,
    DoneAfterResetError,
    EnvBase,
    EnvClosedError,
    EnvMetaData,
    LockedSpecError,
    SpecViolationError,
    Unbounded,
)
from aenv.testing import CountingEnv, DynamicSpecEnv, LatencyEnv, NestedCountingEnv, TextEnv


class ZeroResetEnv(EnvBase):
    """Returns zeros after reset; "val" entries at the root and under two agents."""

    def __init__(self, nested: bool = False):
        super().__init__()
        self.nested = nested
        flag = Categorical(2, shape=(2,), dtype=torch.bool)
        if nested:
            self.observation_spec = Composite(
                agent0=Composite(val=Unbounded((2,), dtype=torch.int64)),
                agent1=Composite(val=Unbounded((2,), dtype=torch.int64)),
            )
            self.full_done_spec = Composite(
                done=flag, agent0=Composite(done=flag.clone()), agent1=Composite(done=flag.clone())
            )
        else:
            self.observation_spec = Composite(val=Unbounded((2,), dtype=torch.int64))
            self.full_done_spec = Composite(done=flag)
        self.action_spec = Unbounded((1,))
        self.seen = None

    def _reset(self, td):
        self.seen = td.clone() if td is not None else None
        zeros = torch.zeros(2, dtype=torch.int64)
        falses = torch.zeros(2, dtype=torch.bool)
        if self.nested:
            return TensorDict(
                {
                    ("agent0", "val"): zeros,
                    ("agent1", "val"): zeros.clone(),
                    "done": falses,
                    ("agent0", "done"): falses.clone(),
                    ("agent1", "done"): falses.clone(),
                },
                [],
            )
        return TensorDict({"val": zeros, "done": falses}, [])

    def _step(self, td):
        raise AssertionError("not stepped in these tests")

    def _set_seed(self, seed):
        pass


# ---------------------------------------------------------------------------- specs
def test_specs_and_keys_of_counting_env():
    env = CountingEnv(batch_size=(3,))
    assert env.batch_size == torch.Size([3])
    assert env.action_spec.shape == torch.Size([3, 1])
    assert env.reward_spec.shape == torch.Size([3, 1])
    assert set(env.done_keys) == {"done", "terminated"}
    assert env.action_keys == ["action"]
    assert env.observation_keys == ["observation"]
    assert env.reward_key == "reward"
    assert env.reset_keys == ["_reset"]
    assert isinstance(env.full_done_spec, Composite)
    assert env.output_spec.is_locked and env.input_spec.is_locked
    with pytest.raises(KeyError, match="done_keys"):
        _ = env.done_key


def test_nested_keys_and_reset_keys():
    env = NestedCountingEnv(n_agents=3, batch_size=(2,))
    assert ("agents", "action") in env.action_keys
    assert set(env.reset_keys) == {"_reset", ("agents", "_reset")}
    assert env.full_reward_spec["agents", "reward"].shape == torch.Size([2, 3, 1])


def test_done_spec_completion_and_default_reward():
    class OnlyDone(EnvBase):
        def __init__(self):
            super().__init__(batch_size=(2,))
            self.observation_spec = Composite(obs=Unbounded((2, 1)), shape=(2,))
            self.done_spec = Categorical(2, shape=(2, 1), dtype=torch.bool)
            self.action_spec = Unbounded((2, 1))

        def _reset(self, td):
            return TensorDict({"obs": torch.zeros(2, 1)}, [2])

        def _step(self, td):
            return TensorDict(
                {"obs": torch.ones(2, 1), "done": torch.tensor([[True], [False]])}, [2]
            )

        def _set_seed(self, seed):
            pass

    env = OnlyDone()
    assert set(env.done_keys) == {"done", "terminated"}
    assert env.reward_spec.shape == torch.Size([2, 1])


def test_spec_shape_must_include_batch_size():
    env = CountingEnv(batch_size=(4,))
    with pytest.raises(BatchSizeError, match=r"\(4,\)"):
        env.observation_spec = Composite(observation=Unbounded((1,)))


def test_spec_locking_rules():
    env = CountingEnv()
    with pytest.raises(LockedSpecError):
        env.observation_spec["extra"] = Unbounded((1,))
    # assignment unlocks, replaces, clears caches and relocks
    env.observation_spec = Composite(observation=Unbounded((1,)), extra=Unbounded((2,)))
    assert set(env.observation_keys) == {"observation", "extra"}
    assert env.output_spec.is_locked
    env.set_spec_lock_(False)
    env.observation_spec["more"] = Unbounded((3,))
    assert "more" in env.observation_keys
    env.set_spec_lock_(True)
    assert env.output_spec.is_locked
    with pytest.raises(LockedSpecError):
        del env.observation_spec["more"]


# ---------------------------------------------------------------------------- step / reset
async def test_reset_and_step_next_nesting():
    env = CountingEnv(max_steps=3)
    td = await env.reset()
    assert set(td.keys()) == {"observation", "done", "terminated"}
    assert not td["done"].any()
    td = await env.rand_step(td)
    assert td["next", "observation"].item() == 1.0
    assert td["next", "reward"].item() == 1.0
    assert "action" in td.keys()


async def test_done_terminated_truncated_completion():
    class Env(EnvBase):
        def __init__(self, out):
            super().__init__()
            self.out = out
            self.observation_spec = Composite(obs=Unbounded((1,)))
            self.full_done_spec = Composite(
                done=Categorical(2, (1,), dtype=torch.bool),
                terminated=Categorical(2, (1,), dtype=torch.bool),
                truncated=Categorical(2, (1,), dtype=torch.bool),
            )
            self.action_spec = Unbounded((1,))

        def _reset(self, td):
            return TensorDict({"obs": torch.zeros(1)}, [])

        def _step(self, td):
            return TensorDict({"obs": torch.zeros(1), **self.out}, [])

        def _set_seed(self, seed):
            pass

    t, f = torch.tensor([True]), torch.tensor([False])
    # only truncated: done is the union, terminated False
    td = await Env({"truncated": t, "terminated": f}).rand_step()
    assert td["next", "done"].item() and not td["next", "terminated"].item()
    # only done: terminated copies it, truncated filled False
    td = await Env({"done": t}).rand_step()
    assert td["next", "terminated"].item() and not td["next", "truncated"].item()
    # done given False but terminated True: done is the union
    td = await Env({"done": f, "terminated": t}).rand_step()
    assert td["next", "done"].item()
    # no reward given: zero reward
    assert td["next", "reward"].item() == 0.0
    # reset gives done flags even when the env gave none
    td0 = await Env({}).reset()
    assert set(td0.keys()) >= {"done", "terminated", "truncated"}


async def test_seed_partial_reset_examples():
    env = ZeroResetEnv()
    # single reset at the root
    data = TensorDict({"val": [1, 1], "_reset": [False, True]}, [])
    await env.reset(data)
    assert data.get("val").tolist() == [1, 0]
    assert "_reset" not in data.keys()

    env = ZeroResetEnv(nested=True)
    data = TensorDict(
        {
            ("agent0", "val"): [1, 1],
            ("agent0", "_reset"): [False, True],
            ("agent1", "val"): [2, 2],
            ("agent1", "_reset"): [True, False],
        },
        [],
    )
    await env.reset(data)
    assert data.get(("agent0", "val")).tolist() == [1, 0]
    assert data.get(("agent1", "val")).tolist() == [0, 2]
    assert ("agent0", "_reset") not in data.keys(True)

    # nested resets are overridden by a root "_reset"
    data = TensorDict(
        {
            "_reset": [True, True],
            ("agent0", "val"): [1, 1],
            ("agent0", "_reset"): [False, True],
            ("agent1", "val"): [2, 2],
            ("agent1", "_reset"): [True, False],
        },
        [],
    )
    await env.reset(data)
    assert data.get(("agent0", "val")).tolist() == [0, 0]
    assert data.get(("agent1", "val")).tolist() == [0, 0]
    # the env itself saw the overridden nested masks
    assert env.seen["agent0", "_reset"].all()


async def test_partial_reset_batched_counting_env():
    env = CountingEnv(max_steps=10, batch_size=(3,))
    td = await env.reset()
    for _ in range(2):
        td = env._step_mdp(await env.rand_step(td))
    td["_reset"] = torch.tensor([[True], [False], [True]])
    out = await env.reset(td)
    assert out["observation"].squeeze(-1).tolist() == [0.0, 2.0, 0.0]
    assert env.count.squeeze(-1).tolist() == [0.0, 2.0, 0.0]
    assert "_reset" not in out.keys()


async def test_all_false_reset_touches_nothing():
    env = CountingEnv(max_steps=10, batch_size=(2,))
    td = env._step_mdp(await env.rand_step(await env.reset()))
    td["_reset"] = torch.zeros(2, 1, dtype=torch.bool)
    out = await env.reset(td)
    assert env.count.squeeze(-1).tolist() == [1.0, 1.0]
    assert "_reset" not in out.keys()


async def test_partial_step_batch_locked():
    env = CountingEnv(max_steps=10, batch_size=(3,))
    td = env._step_mdp(await env.rand_step(await env.reset()))
    td = env.rand_action(td)
    td["_step"] = torch.tensor([True, False, True])
    out = await env.step(td)
    assert out["next", "observation"].squeeze(-1).tolist() == [2.0, 1.0, 2.0]
    assert out["next", "reward"].squeeze(-1).tolist() == [1.0, 0.0, 1.0]
    assert env.count.squeeze(-1).tolist() == [2.0, 1.0, 2.0]


async def test_partial_step_batch_unlocked_pendulum():
    from aenv import PendulumEnv

    env = PendulumEnv(seed=0)
    td = await env.reset(TensorDict({}, [4]))
    th0 = td["th"].clone()
    td = env.rand_action(td)
    td["_step"] = torch.tensor([True, False, False, True])
    out = await env.step(td)
    nth = out["next", "th"]
    assert torch.equal(nth[1:3], th0[1:3])
    assert not torch.equal(nth[0], th0[0])
    assert out["next", "reward"][1:3].eq(0).all()


async def test_done_after_reset_raises_unless_allowed():
    class DoneAtReset(CountingEnv):
        def _reset(self, td, **kw):
            out = super()._reset(td, **kw)
            out["done"] = torch.ones_like(out["done"])
            return out

    with pytest.raises(DoneAfterResetError, match="allow_done_after_reset"):
        await DoneAtReset().reset()
    td = await DoneAtReset(allow_done_after_reset=True).reset()
    assert td["done"].all()


async def test_batch_locked_wrong_batch_size():
    env = CountingEnv(batch_size=(3,))
    td = TensorDict({"action": torch.zeros(2, 1, dtype=torch.int64)}, [2])
    with pytest.raises(BatchSizeError, match=r"expected .*\(3,\).*got \(2,\)"):
        await env.step(td)


@pytest.mark.parametrize(
    "action, match",
    [
        (None, "missing"),
        (torch.zeros(2, dtype=torch.int64), "shape"),
        # a float the int64 spec cannot hold exactly (a whole float is cast)
        (torch.full((1,), 0.5), "does not fit dtype torch.int64"),
    ],
)
async def test_bad_actions_raise_before_step(action, match):
    env = CountingEnv()
    td = await env.reset()
    if action is not None:
        td["action"] = action
    with pytest.raises(SpecViolationError, match=match) as info:
        await env.step(td)
    assert "action" in str(info.value)
    assert env.count.item() == 0.0


async def test_out_of_spec_action_with_checks():
    env = CountingEnv(run_type_checks=True)
    td = await env.reset()
    td["action"] = torch.tensor([5])
    with pytest.raises(SpecViolationError, match="outside"):
        await env.step(td)
    assert env.count.item() == 0.0


# ---------------------------------------------------------------------------- execution modes
class ThreadProbe(CountingEnv):
    blocking = True

    def _step(self, td):
        self.thread = threading.get_ident()
        return super()._step(td)


async def test_blocking_sync_step_runs_in_thread():
    env = ThreadProbe()
    await env.rand_step(await env.reset())
    assert env.thread != threading.get_ident()
    plain = CountingEnv()
    assert not plain.blocking


async def test_async_env_and_sync_env_give_same_api():
    env = LatencyEnv(latency=0.0, max_steps=3)
    rollout = await env.rollout(10)
    assert rollout.batch_size == torch.Size([3])
    assert rollout["next", "truncated"][-1].item()


# ---------------------------------------------------------------------------- rollout
async def test_rollout_time_dim_and_break_when_any_done():
    env = CountingEnv(max_steps=4)
    r = await env.rollout(10)
    assert r.batch_size == torch.Size([4])
    assert r.names[-1] == "time"
    assert r["next", "done"][-1].item() and not r["next", "done"][:-1].any()


async def test_rollout_break_when_all_done_uses_partial_steps():
    env = CountingEnv(max_steps=[2, 4], batch_size=(2,))
    r = await env.rollout(10, break_when_all_done=True)
    assert r.batch_size == torch.Size([2, 4])
    assert env.count.squeeze(-1).tolist() == [2.0, 4.0]
    assert r["next", "observation"][0].squeeze(-1).tolist() == [1.0, 2.0, 2.0, 2.0]


async def test_rollout_auto_reset_continues():
    env = CountingEnv(max_steps=3)
    r = await env.rollout(7, break_when_any_done=False)
    assert r.batch_size == torch.Size([7])
    assert r["next", "observation"].squeeze(-1).tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert r["observation"].squeeze(-1).tolist() == [0, 1, 2, 0, 1, 2, 0]


async def test_rollout_policies_module_callable_async():
    env = CountingEnv(max_steps=100)
    module = TensorDictModule(
        lambda obs: torch.ones_like(obs, dtype=torch.int64),
        in_keys=["observation"],
        out_keys=["action"],
    )
    r = await env.rollout(3, module)
    assert r["action"].eq(1).all()

    def plain(td):
        td["action"] = torch.zeros(1, dtype=torch.int64)

    r = await env.rollout(3, plain)
    assert r["action"].eq(0).all()

    async def remote(td):
        td["action"] = torch.ones(1, dtype=torch.int64)
        return td

    calls = []
    r = await env.rollout(
        3, remote, callback=lambda e, td: calls.append(td["next", "observation"].item())
    )
    assert r["action"].eq(1).all() and calls == [1.0, 2.0, 3.0]


async def test_rollout_with_tensordict_and_set_truncated():
    env = CountingEnv(max_steps=100)
    with pytest.raises(RuntimeError, match="add_truncated_keys"):
        await env.rollout(3, set_truncated=True)
    env.add_truncated_keys()
    assert "truncated" in env.done_keys
    td = await env.reset()
    r = await env.rollout(3, tensordict=td, auto_reset=False, set_truncated=True)
    assert r["next", "truncated"][-1].item() and r["next", "done"][-1].item()
    assert not r["next", "truncated"][:-1].any()


async def test_dynamic_specs_rollout_lazy_stack():
    env = DynamicSpecEnv(max_count=5)
    r = await env.rollout(5, return_contiguous=False)
    assert isinstance(r, LazyStackedTensorDict)
    assert [t["next", "observation"].shape[1] for t in r.unbind(0)] == [2, 3, 4, 5, 6]


async def test_non_tensor_text_env():
    env = TextEnv(max_steps=3)

    def policy(td):
        td["action"] = NonTensorData("go")
        return td

    r = await env.rollout(5, policy, return_contiguous=False)
    assert r.batch_size[0] == 3
    assert r[-1]["next", "history"] == "hello go go go"
    assert r["next", "reward"].squeeze(-1).tolist() == [2.0, 2.0, 2.0]


async def test_nested_env_rollout_and_partial_reset():
    env = NestedCountingEnv(max_steps=2, n_agents=2)
    r = await env.rollout(5)
    assert r.batch_size == torch.Size([2])
    assert r["next", "agents", "done"][-1].all()
    td = env._step_mdp(r[-1])
    td["agents", "_reset"] = torch.tensor([[True], [False]])
    out = await env.reset(td)
    assert out["agents", "observation"].squeeze(-1).tolist() == [0.0, 2.0]


# ---------------------------------------------------------------------------- misc API
async def test_set_seed_returns_next_seed():
    env = CountingEnv()
    assert await env.set_seed(3) == 4
    assert env.seed == 3
    assert await env.set_seed(3, static_seed=True) == 3


async def test_fake_tensordict_matches_rollout_keys():
    env = NestedCountingEnv(batch_size=(2,))
    fake = env.fake_tensordict()
    r = await env.rollout(2)
    assert set(fake.keys(True, True)) == set(r[..., 0].keys(True, True))


async def test_aclose_and_context_manager():
    async with CountingEnv() as env:
        await env.reset()
    assert env.is_closed
    with pytest.raises(EnvClosedError):
        await env.reset()


async def test_step_and_maybe_reset():
    env = CountingEnv(max_steps=1)
    td = env.rand_action(await env.reset())
    stepped, nxt = await env.step_and_maybe_reset(td)
    assert stepped["next", "done"].item()
    assert nxt["observation"].item() == 0.0 and not nxt["done"].item()
    assert "_reset" not in nxt.keys()


def test_env_metadata_pickles():
    env = NestedCountingEnv(batch_size=(2,))
    meta = EnvMetaData.metadata_from_env(env)
    meta2 = pickle.loads(pickle.dumps(meta))
    assert meta2.batch_size == env.batch_size
    assert meta2.specs["output_spec"] == env.output_spec
    assert set(meta2.tensordict.keys(True, True)) == set(env.fake_tensordict().keys(True, True))
    assert meta2.expand(3, 2).batch_size == torch.Size([3, 2])


def test_bounded_action_spec_wrapping():
    env = CountingEnv()
    env.action_spec = Bounded(-1.0, 1.0, shape=(1,))
    assert isinstance(env.full_action_spec, Composite)
    assert env.full_action_spec["action"].shape == torch.Size([1])


async def test_long_rollout_is_chunk_stacked_in_order():
    env = CountingEnv(max_steps=10_000)
    r = await env.rollout(600)
    assert r.batch_size == torch.Size([600])
    assert r["next", "observation"].squeeze(-1).tolist() == [float(i) for i in range(1, 601)]
    assert r.names[-1] == "time"


async def test_long_dynamic_rollout_falls_back_to_lazy():
    env = DynamicSpecEnv(max_count=10_000)
    r = await env.rollout(300)
    assert isinstance(r, LazyStackedTensorDict)
    assert r[299]["next", "observation"].shape == torch.Size([3, 301, 2])
