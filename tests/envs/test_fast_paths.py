"""The per-step fast paths give what the general tensordict paths give.

``fast_step_mdp`` vs ``step_mdp``, ``fast_stack`` vs ``torch.stack``, ``getter`` vs
``td.get``, and the pendulum's cached coefficients vs changed parameters.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict

from aenv import PendulumEnv, step_mdp
from aenv._mdp import fast_stack, fast_step_mdp, getter
from aenv.testing import CountingEnv, NestedCountingEnv, TextEnv

DROP_NEXT = frozenset({"reward"})
DROP_ROOT = frozenset({"next", "_reset", "_step", "reward", "done", "terminated", "action"})


def _stepped() -> TensorDict:
    return TensorDict(
        {
            "obs": torch.zeros(2, 1),
            "hidden": torch.full((2, 3), 7.0),
            "action": torch.ones(2, 1),
            "done": torch.zeros(2, 1, dtype=torch.bool),
            "_reset": torch.ones(2, 1, dtype=torch.bool),
            "memory": {"h": torch.ones(2, 4)},
            "params": {"g": torch.full((2,), 10.0)},
            "next": {
                "obs": torch.ones(2, 1),
                "reward": torch.ones(2, 1),
                "done": torch.ones(2, 1, dtype=torch.bool),
                "terminated": torch.ones(2, 1, dtype=torch.bool),
                "params": {"g": torch.full((2,), 9.0)},
            },
        },
        [2],
    )


def test_fast_step_mdp_matches_step_mdp():
    td = _stepped()
    slow = step_mdp(td)
    fast = fast_step_mdp(td, td["next"], DROP_NEXT, DROP_ROOT)
    assert fast is not None
    assert set(fast.keys(True, True)) == set(slow.keys(True, True))
    assert (fast == slow).all()
    # tensors are shared with the stepped data, containers are not
    assert fast["obs"] is td["next", "obs"]
    assert fast["hidden"] is td["hidden"]
    assert fast["params"] is not td["next", "params"]
    assert fast["memory"] is not td["memory"]
    fast["params"].set("g", torch.zeros(2))
    fast["memory"].set("h", torch.zeros(2, 4))
    assert td["next", "params", "g"].eq(9.0).all() and td["memory", "h"].eq(1.0).all()


def test_fast_step_mdp_carries_root_entries_into_shared_containers():
    td = _stepped()
    td["params", "extra"] = torch.ones(2)
    out = fast_step_mdp(td, td["next"], DROP_NEXT, DROP_ROOT)
    assert out is not None
    # "next" wins where both hold an entry, the root fills what "next" lacks
    assert out["params", "g"].eq(9.0).all() and out["params", "extra"].eq(1.0).all()
    assert "extra" not in td["next", "params"].keys()


def test_fast_step_mdp_declines_other_tensordicts():
    td = _stepped()
    lazy = LazyStackedTensorDict.lazy_stack(list(td.unbind(0)), 0)
    assert fast_step_mdp(lazy, lazy.get("next"), DROP_NEXT, DROP_ROOT) is None


def test_fast_step_mdp_keeps_non_tensor_data():
    td = TensorDict({"text": NonTensorData("a"), "next": {"text": NonTensorData("b")}}, [])
    out = fast_step_mdp(td, td["next"], DROP_NEXT, DROP_ROOT)
    assert out is not None and out["text"] == "b"


@pytest.mark.parametrize("dim", [0, 1])
def test_fast_stack_matches_torch_stack(dim):
    tds = [_stepped() for _ in range(3)]
    for i, td in enumerate(tds):
        td["obs"] += i
    fast = fast_stack(tds, dim)
    slow = torch.stack(tds, dim)
    assert fast is not None
    assert fast.batch_size == slow.batch_size
    assert fast["next"].batch_size == slow["next"].batch_size
    assert (fast == slow).all()


def test_fast_stack_declines_or_raises_like_torch_stack():
    a, b = _stepped(), _stepped()
    del b["hidden"]
    assert fast_stack([a, b], 0) is None  # differing keys
    c = _stepped()
    c.set("hidden", torch.zeros(2, 5))
    with pytest.raises(RuntimeError):
        fast_stack([a, c], 0)  # differing shapes, as torch.stack
    lazy = LazyStackedTensorDict.lazy_stack(list(a.unbind(0)), 0)
    assert fast_stack([lazy, lazy], 0) is None
    named = _stepped()
    named.refine_names("b")
    assert fast_stack([named, named], 0) is None


def test_getter_reads_like_get():
    td = _stepped()
    get = getter(td)
    assert get("obs") is td.get("obs")
    assert get(("next", "reward")) is td.get(("next", "reward"))
    assert get("missing") is None
    lazy = LazyStackedTensorDict.lazy_stack(list(td.unbind(0)), 0)
    lazy_get = getter(lazy)
    assert (lazy_get("obs") == td["obs"]).all() and lazy_get("missing") is None


@pytest.mark.parametrize(
    "make", [CountingEnv, lambda: NestedCountingEnv(batch_size=(2,)), TextEnv, PendulumEnv]
)
async def test_env_step_mdp_fast_and_general_agree(make):
    env = make()
    td = await env.rand_step(await env.reset())
    general = step_mdp(td, reward_keys=env.reward_keys, _tree=env._mdp_tree)
    ours = env._step_mdp(td)
    assert set(ours.keys(True, True)) == set(general.keys(True, True))
    for key in general.keys(True, True):
        a, b = ours.get(key), general.get(key)
        assert a == b if isinstance(a, str) else (a == b).all(), key


async def test_pendulum_coefficients_follow_parameter_changes():
    env = PendulumEnv(seed=0)
    td = await env.reset()
    td["action"] = torch.zeros(1)
    base = (await env.step(td.clone()))["next", "thdot"]
    # in place: same tensor, new version
    td["params", "g"].fill_(20.0)
    heavier = (await env.step(td.clone()))["next", "thdot"]
    # replaced: another tensor
    td["params", "g"] = torch.tensor(10.0)
    again = (await env.step(td.clone()))["next", "thdot"]
    assert not torch.equal(base, heavier)
    assert torch.equal(base, again)
    # a batch with per-element parameters
    batch = await env.reset(TensorDict({"params": env.gen_params(batch_size=(2,))["params"]}, [2]))
    batch["params", "g"][1] = 20.0
    batch["th"] = torch.full((2,), 1.0)
    batch["thdot"] = torch.zeros(2)
    batch["action"] = torch.zeros(2, 1)
    out = (await env.step(batch))["next", "thdot"]
    assert out[1] == pytest.approx(2 * out[0].item())


# ---------------------------------------------------------------- per-step shortcuts


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        # all declared flags given, one element each, all False: left exactly as given
        ({"done": False, "terminated": False, "truncated": False}, (False, False, False)),
        # any flag set: completed as usual (done is the union)
        ({"done": False, "terminated": True, "truncated": False}, (True, True, False)),
        ({"done": False, "terminated": False, "truncated": True}, (True, False, True)),
        # a declared flag missing: added (not skipped)
        ({"done": False, "terminated": False}, (False, False, False)),
        ({"done": False}, (False, False, False)),
    ],
)
def test_complete_done_shortcut_only_when_nothing_to_do(given, expected):
    from aenv._mdp import complete_done

    groups = {(): ["done", "terminated", "truncated"]}
    td = TensorDict({k: torch.tensor([v]) for k, v in given.items()}, [])
    before = {k: td[k] for k in given}
    complete_done(td, groups, {(): torch.zeros(1, dtype=torch.bool)})
    got = (td["done"].item(), td["terminated"].item(), td["truncated"].item())
    assert got == expected
    if not any(given.values()) and len(given) == 3:
        assert all(td[k] is before[k] for k in given)  # nothing rewritten


def test_complete_done_batched_flags_take_the_general_path():
    from aenv._mdp import complete_done

    td = TensorDict(
        {"done": torch.tensor([[False], [False]]), "terminated": torch.tensor([[False], [True]])},
        [2],
    )
    complete_done(td, {(): ["done", "terminated"]})
    assert td["done"].squeeze(-1).tolist() == [False, True]


def test_any_true_matches_any():
    from aenv._mdp import any_true

    for t in (
        torch.tensor([True]),
        torch.tensor([False]),
        torch.tensor(True),
        torch.tensor([[False], [True]]),
        torch.zeros(3, dtype=torch.bool),
        torch.zeros(0, dtype=torch.bool),
    ):
        assert any_true(t) == bool(t.any())


def test_put_writes_like_set_and_falls_back():
    from aenv._mdp import put

    td = TensorDict({}, [2])
    put(td, "a", torch.ones(2, 3))
    assert td["a"].shape == (2, 3)
    with pytest.raises(RuntimeError):
        put(td, "b", torch.ones(3))  # wrong batch size: set's own error
    td.lock_()
    with pytest.raises(RuntimeError):
        put(td, "c", torch.ones(2))  # locked: set refuses


def test_bounded_uniform_rand_stays_in_bounds_and_follows_bound_changes():
    from aenv.specs import Bounded

    spec = Bounded(-2.0, 3.0, shape=(1000,), dtype=torch.float32)
    x = spec.rand()
    assert x.dtype == torch.float32 and x.shape == (1000,)
    assert x.min() >= -2.0 and x.max() <= 3.0 and x.min() < -1.5 and x.max() > 2.5
    spec64 = Bounded(0.0, 1e-3, shape=(4, 2), dtype=torch.float64)
    assert spec64.rand((3,)).shape == (3, 4, 2) and spec64.is_in(spec64.rand())
    # per-element bounds keep the general path, still in bounds
    per = Bounded(torch.tensor([0.0, 10.0]), torch.tensor([1.0, 11.0]))
    assert per._uniform_bounds() is None
    y = per.rand((500,))
    assert (y[:, 0] <= 1.0).all() and (y[:, 1] >= 10.0).all()
    # bounds changed in place: the cached floats follow
    spec.low.fill_(5.0)
    spec.high.fill_(6.0)
    assert spec.rand().min() >= 5.0


async def test_pendulum_unbatched_step_matches_batched_step():
    env = PendulumEnv(seed=0)
    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        td = await env.reset()
        td["th"] = (torch.rand((), generator=gen) * 2 - 1) * 4.0
        td["thdot"] = (torch.rand((), generator=gen) * 2 - 1) * 8.0
        td["action"] = (torch.rand((1,), generator=gen) * 2 - 1) * 3.0  # clamped to 2
        one = env._step(td)
        batched = env._step(td.unsqueeze(0))
        assert one.batch_size == () and batched.batch_size == (1,)
        for key in ("th", "thdot", "reward", "done", "terminated"):
            a, b = one[key], batched[key].squeeze(0)
            assert a.dtype == b.dtype and a.shape == b.shape, key
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


async def test_pendulum_keeps_gradients_through_the_batched_path():
    env = PendulumEnv(seed=0)
    td = await env.reset()
    action = torch.tensor([0.5], requires_grad=True)
    td["action"] = action
    out = env._step(td)
    out["thdot"].backward()
    assert action.grad is not None and action.grad.item() != 0.0


async def test_random_rollout_skips_no_check_a_policy_needs():
    env = CountingEnv()

    def bad_policy(td):
        td["action"] = torch.full((1,), 0.5)  # the spec says int64: 0.5 is not cast
        return td

    with pytest.raises(Exception, match="dtype"):
        await env.rollout(3, bad_policy)
    roll = await env.rollout(3, break_when_any_done=False)
    assert all(env.action_spec.is_in(a) for a in roll["action"].unbind(0))


def test_spec_derived_values_are_cached_only_while_locked():
    env = CountingEnv()
    first = env.action_keys
    assert env.action_keys is first and env.__dict__["action_keys"] is first
    env.set_spec_lock_(False)
    assert "action_keys" not in env.__dict__
    assert env.action_keys is not env.action_keys  # recomputed at each read
    env.set_spec_lock_(True)
    env.reward_spec = env.reward_spec.clone()  # assignment drops every cached value
    assert "_done_groups" not in env.__dict__ and "action_keys" not in env.__dict__
    assert env._done_groups == {(): ["done", "terminated"]}
