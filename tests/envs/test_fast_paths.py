"""The fast paths give what the general paths give.

The rollout matrix: default step hooks vs overridden (row-writing) ones, on every env kind,
equal exactly. Then the helpers: ``fast_step_mdp`` vs ``step_mdp``, ``fast_stack`` vs
``torch.stack``, ``getter`` vs ``td.get``, and the pendulum's cached coefficients vs changed
parameters.
"""

from __future__ import annotations

import types

import pytest
import torch
from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict

from aenv import EnvBase, PendulumEnv, step_mdp
from aenv._mdp import fast_stack, fast_step_mdp, getter
from aenv.envs._rowplan import writes_rows
from aenv.libs.gym import GymEnv
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


def _reset_out(batch: list[int]) -> TensorDict:
    return TensorDict(
        {
            "text": NonTensorData("hi", batch_size=batch),
            "done": torch.zeros(*batch, 1, dtype=torch.bool),
            "obs": torch.ones(*batch, 2),
        },
        batch,
    )


@pytest.mark.parametrize("batch", [[], [2]])
def test_fast_update_matches_update(batch):
    from aenv._mdp_tree import fast_update

    def start() -> TensorDict:
        return TensorDict(
            {"prompt": NonTensorData("q", batch_size=batch), "obs": torch.zeros(*batch, 2)},
            batch,
        )

    out = _reset_out(batch)
    fast, slow = fast_update(start(), out), start().update(out)
    assert list(fast.keys()) == list(slow.keys()) == ["prompt", "obs", "text", "done"]
    for key in out.keys():  # stored by reference, as update stores them
        assert fast._tensordict[key] is slow._tensordict[key] is out._tensordict[key]
    assert fast["prompt"] == slow["prompt"]


def test_fast_update_leaves_merges_and_refusals_to_update():
    from aenv._mdp_tree import fast_update

    # a sub-tensordict is merged into the one there, not put in its place
    td = TensorDict({"sub": {"a": torch.zeros(1)}}, [])
    fast_update(td, TensorDict({"sub": {"b": torch.ones(1)}}, []))
    assert sorted(td["sub"].keys()) == ["a", "b"]
    # locked: update's own refusal
    with pytest.raises(RuntimeError):
        fast_update(TensorDict({}, []).lock_(), _reset_out([]))
    # another batch size: update's own rules (here: a prefix batch size is accepted)
    td = fast_update(TensorDict({}, []), _reset_out([2]))
    assert td["obs"].shape == (2, 2)


def test_prompt_tensordict_builds_fitting_prompts_and_refuses_others():
    from aenv.agents._groups import prompt_tensordict

    prompt = {"q": "2+2", "t": torch.ones(2), "meta": {"id": 3}}
    td = prompt_tensordict(prompt, torch.Size())
    assert td["q"] == "2+2" and td["meta", "id"] == 3 and td["t"] is not prompt["t"]
    assert torch.equal(td["t"], prompt["t"])
    td = prompt_tensordict({"q": "a", "t": torch.ones(3, 2)}, torch.Size([3]))
    assert td.batch_size == (3,) and td.get("q").batch_size == (3,) and td["q"] == "a"
    with pytest.raises(RuntimeError, match="batch"):
        prompt_tensordict({"t": torch.ones(2)}, torch.Size([3]))  # does not fit [3]


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


# ---------------------------------------------------------------- the rollout matrix
# Default step hooks vs overridden ones, on every env kind: the rollout loop keeps the steps
# of an env whose hooks write rows in time rows, and those of any other as TensorDicts; both
# must give the same rollout, exactly (values, dtypes, shapes, episode ends and resets), draw
# the same random numbers and leave the env in the same state.


def _default_hooks(env):
    env._step_into = EnvBase._step_into.__get__(env)
    env._reset_into = EnvBase._reset_into.__get__(env)
    return env


def _write(out, index, td) -> bool:
    """Copy ``td`` into ``out`` (its row ``index`` when given), as a writing hook does."""
    keys = set(out.keys(True, True))
    if keys != set(td.keys(True, True)):
        return False
    for key in keys:
        dst = out.get(key)
        (dst[index] if index is not None else dst).copy_(td.get(key))
    return True


async def _writer_step(self, tensordict, out, index=None):
    res = await EnvBase._step_into(self, tensordict, out, index)
    if out is not None and _write(out, index, res):
        return bool(res.get("done").any())
    return res


async def _writer_reset(self, stepped, out, index=None):
    res = await EnvBase._reset_into(self, stepped, out, index)
    if out is not None and _write(out, index, res):
        return True
    return res


def _overridden_hooks(env):
    """The env's own writing hooks where it has them, else hooks that write rows."""
    if writes_rows(env):
        return env
    env._step_into = types.MethodType(_writer_step, env)
    env._reset_into = types.MethodType(_writer_reset, env)
    assert writes_rows(env)
    return env


ENVS = {
    "counting": lambda: CountingEnv(max_steps=7),
    "pendulum": lambda: PendulumEnv(seed=0),
    "cartpole-onehot": lambda: GymEnv("CartPole-v1"),
    "cartpole-categorical": lambda: GymEnv("CartPole-v1", categorical_action_encoding=True),
    "frozenlake": lambda: GymEnv("FrozenLake-v1"),
    # (a scalar observation: rows of 0-d values)
    "frozenlake-categorical": lambda: GymEnv("FrozenLake-v1", categorical_action_encoding=True),
    "text": lambda: TextEnv(max_steps=3),
}


def _random_policy(env):
    # a policy (checked actions, TensorDicts in the loop) drawing its actions at random
    return env.rand_action


def _extra_key_policy(env):
    # from step 3 on, the policy writes a key more: rows hand over to TensorDicts
    calls = [0]

    def policy(td):
        calls[0] += 1
        td = env.rand_action(td)
        if calls[0] > 3:
            td.set("extra", torch.ones(1))
        return td

    return policy


def _obs_replacing_policy(env):
    # from step 3 on, the policy replaces its input's observations (kept as the step's
    # root entries): rows hand over to TensorDicts
    calls = [0]

    def policy(td):
        calls[0] += 1
        td = env.rand_action(td)
        if calls[0] > 3:
            for key in env.observation_keys:
                value = td.get(key)
                if isinstance(value, torch.Tensor):
                    td.set(key, value.clone())
        return td

    return policy


def _other_dtype_policy(env):
    # actions of another dtype that holds their values: the step's checks cast them
    def policy(td):
        td = env.rand_action(td)
        for key in env.action_keys:
            value = td.get(key)
            if isinstance(value, torch.Tensor) and value.dtype != torch.float64:
                td.set(key, value.to(torch.float64))
        return td

    return policy


CASES = {
    "random-until-done": (150, None, {"break_when_any_done": True}),
    "random-through-ends": (150, None, {"break_when_any_done": False}),
    "random-1": (1, None, {"break_when_any_done": False}),
    "random-2": (2, None, {"break_when_any_done": False}),
    "policy-through-ends": (90, _random_policy, {"break_when_any_done": False}),
    "policy-until-done": (90, _random_policy, {}),
    "policy-extra-key": (40, _extra_key_policy, {"break_when_any_done": False}),
    "policy-replaces-obs": (40, _obs_replacing_policy, {"break_when_any_done": False}),
    "policy-other-dtype": (60, _other_dtype_policy, {"break_when_any_done": False}),
}


def _assert_same(a, b):
    assert type(a) is type(b) and a.batch_size == b.batch_size and a.names == b.names
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        va, vb = a.get(key), b.get(key)
        if not isinstance(va, torch.Tensor):
            assert va.tolist() == vb.tolist(), key
            continue
        assert va.dtype == vb.dtype and va.shape == vb.shape, key
        assert torch.equal(va, vb), key


# where the overridden hooks must have had the steps kept in time rows (pendulum keeps
# state at the root, the text env's data is no tensor: TensorDicts both ways)
ROWS = {
    "counting",
    "cartpole-onehot",
    "cartpole-categorical",
    "frozenlake",
    "frozenlake-categorical",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(ENVS))
async def test_rollout_default_and_overridden_hooks_agree(name, case, monkeypatch):
    from aenv.envs import _rollout

    steps, make_policy, kwargs = CASES[case]
    made: list[bool] = []
    make = _rollout._TimeRows.make

    def spy(*args, **kw):
        rows = make(*args, **kw)
        made.append(rows is not None)
        return rows

    monkeypatch.setattr(_rollout._TimeRows, "make", staticmethod(spy))
    outs, rng, tails = [], [], []
    for hooks in (_default_hooks, _overridden_hooks):
        made.clear()
        env = hooks(ENVS[name]())
        await env.set_seed(3)
        torch.manual_seed(3)
        policy = make_policy(env) if make_policy is not None else None
        outs.append(await env.rollout(steps, policy, **kwargs))
        used = made == [True]
        assert used == (hooks is _overridden_hooks and name in ROWS and steps > 1)
        rng.append(torch.get_rng_state())
        # the state the rollout left the env in: a further rollout, the default hooks on both
        _default_hooks(env)
        tails.append(await env.rollout(20, break_when_any_done=False))
        await env.aclose()
    _assert_same(*outs)
    _assert_same(*tails)
    assert torch.equal(*rng)
    out = outs[0]
    assert out.names[-1] == "time"
    if kwargs.get("break_when_any_done", True):
        assert not out["next", "done"][:-1].any()
    elif name in ("counting", "cartpole-onehot", "frozenlake-categorical") and steps > 100:
        assert out["next", "done"].sum() >= 2  # episode ends (and resets) inside


async def test_rows_follow_a_given_tensordict_and_set_truncated():
    outs = []
    for hooks in (_default_hooks, _overridden_hooks):
        env = hooks(GymEnv("CartPole-v1"))
        torch.manual_seed(0)
        td = await env.reset(seed=1)
        outs.append(
            await env.rollout(
                50, auto_reset=False, tensordict=td, break_when_any_done=False, set_truncated=True
            )
        )
    _assert_same(*outs)
    assert outs[0]["next", "truncated"][-1].all() and outs[0]["next", "done"][-1].all()


def test_which_hooks_write_rows_is_decided_by_one_rule():
    env = CountingEnv()
    assert not writes_rows(env)
    assert writes_rows(GymEnv("CartPole-v1"))
    gym = GymEnv("CartPole-v1")
    _default_hooks(gym)  # an instance assignment counts
    assert not writes_rows(gym)

    class Replaced(GymEnv):  # a subclass replacing _step below the writer: the defaults
        def _step(self, tensordict):
            return super()._step(tensordict)

    assert not writes_rows(Replaced("CartPole-v1"))


async def test_random_rollout_actions_come_from_the_specs_draws():
    # the rollout draws its actions a chunk of steps at a time, through the spec's rand
    env = CountingEnv(max_steps=1000)
    torch.manual_seed(5)
    out = await env.rollout(40, break_when_any_done=False)
    torch.manual_seed(5)
    spec = env.full_action_spec["action"]
    first = spec.rand((16,))
    second = spec.rand((24,))
    assert torch.equal(out["action"], torch.cat([first, second]))


def _bad_action_policy(bad):
    # a one-hot CartPole policy that, from its fourth call on, gives the action ``bad``
    # makes (None: writes a key of its own instead of the action)
    calls = [0]

    def policy(td):
        calls[0] += 1
        idx = (td.get("observation")[2] > 0).long()
        action = torch.nn.functional.one_hot(idx, 2)
        if calls[0] <= 3:
            td.set("action", action)
        elif bad is None:
            td.set("other", action)
        else:
            td.set("action", bad(action))
        return td

    return policy


@pytest.mark.parametrize(
    "bad, match",
    [
        (None, "action key 'action' is missing"),
        (lambda a: torch.cat([a, a]), r"action 'action' has shape \(4,\), expected \(2,\)"),
        (lambda a: a[None], r"action 'action' has shape \(1, 2\), expected \(2,\)"),
    ],
)
async def test_a_policy_step_the_rows_cannot_take_fails_as_with_tensordicts(bad, match):
    # time rows hand such a step to TensorDicts: the same error as the default hooks give,
    # naming the key and the spec, after the same steps
    from aenv.exceptions import SpecViolationError

    errors = []
    for hooks in (_default_hooks, _overridden_hooks):
        env = hooks(GymEnv("CartPole-v1"))
        await env.set_seed(0)
        with pytest.raises(SpecViolationError, match=match) as info:
            await env.rollout(10, _bad_action_policy(bad), break_when_any_done=False)
        errors.append(str(info.value))
        assert "OneHot" in errors[-1] or bad is None
        await env.aclose()
    assert errors[0] == errors[1]
