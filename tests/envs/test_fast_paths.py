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
