"""step_mdp and terminated_or_truncated, as TorchRL's test_step_mdp.py and test_nested.py
check them."""

from __future__ import annotations

import itertools

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from aenv import step_mdp, terminated_or_truncated
from aenv.testing import NestedCountingEnv

pytestmark = pytest.mark.timeout(30)


def _stepped(lazy: bool) -> TensorDict:
    torch.manual_seed(0)
    td = TensorDict(
        {
            "reward": torch.randn(4, 1),
            "done": torch.zeros(4, 1, dtype=torch.bool),
            "ledzep": torch.randn(4, 2),
            "next": {
                "ledzep": torch.randn(4, 2),
                "reward": torch.randn(4, 1),
                "done": torch.zeros(4, 1, dtype=torch.bool),
            },
            "beatles": torch.randn(4, 1),
            "action": torch.randn(4, 2),
        },
        [4],
    )
    if not lazy:
        return td
    parts = td.unbind(0)
    parts[0]["this", "one"] = torch.zeros(2)
    parts[1]["but", "not", "this", "one"] = torch.ones(2)
    parts[0]["next", "this", "one"] = torch.ones(2) * 2
    return LazyStackedTensorDict.lazy_stack(parts, 0)


FLAGS = list(itertools.product([True, False], repeat=4))


@pytest.mark.parametrize("lazy", [False, True], ids=["dense", "lazy"])
@pytest.mark.parametrize("keep_other, exclude_reward, exclude_done, exclude_action", FLAGS)
@pytest.mark.parametrize("has_out", [False, True], ids=["new", "into"])
def test_flags_choose_what_moves_and_what_stays(
    lazy, keep_other, exclude_reward, exclude_done, exclude_action, has_out
):
    td = _stepped(lazy).lock_()
    dest = TensorDict(batch_size=[4]) if has_out else None
    if has_out and lazy:
        dest = LazyStackedTensorDict.lazy_stack(dest.unbind(0), 0)
    out = step_mdp(
        td,
        next_tensordict=dest,
        keep_other=keep_other,
        exclude_reward=exclude_reward,
        exclude_done=exclude_done,
        exclude_action=exclude_action,
    )
    if has_out:
        assert out is dest  # next_tensordict is the destination, as in TorchRL
    assert (out["ledzep"] == td["next", "ledzep"]).all()
    assert ("beatles" in out.keys()) == keep_other
    assert ("reward" in out.keys()) == (not exclude_reward)
    assert ("action" in out.keys()) == (not exclude_action)
    assert ("done" in out.keys()) == (not exclude_done)
    if not exclude_reward:
        assert (out["reward"] == td["next", "reward"]).all()
    if not exclude_action:
        assert (out["action"] == td["action"]).all()
    if lazy:
        # keys only some elements have: the next one moves up, the root one stays
        assert (out[0]["this", "one"] == 2).all()
        if keep_other:
            assert (out[1]["but", "not", "this", "one"] == 1).all()
    elif not has_out:
        assert out["ledzep"] is td["next", "ledzep"]  # moved, not copied


def test_nested_key_arguments():
    # issue 24 item 11: a tuple of strings is one nested key
    td = TensorDict(
        {
            "obs": torch.zeros(2),
            "data": {"reward": torch.zeros(2), "x": torch.zeros(2)},
            "next": {"obs": torch.ones(2), "data": {"reward": torch.ones(2), "x": torch.ones(2)}},
        },
        [2],
    )
    out = step_mdp(td, reward_keys=("data", "reward"))
    assert set(out.keys(True, True)) == {"obs", ("data", "x")}
    assert (out["data", "x"] == 1).all()
    out = step_mdp(td, reward_keys=[("data", "reward")], exclude_reward=False)
    assert (out["data", "reward"] == 1).all()
    out = step_mdp(td, done_keys="obs", exclude_done=True)
    assert "obs" not in out.keys() and ("data", "x") in out.keys(True)


def test_heterogeneous_lazy_stack_steps_element_by_element():
    # issue 24 item 10: elements whose entries differ in shape
    parts = [
        TensorDict(
            {"obs": torch.zeros(n), "action": torch.zeros(n), "next": {"obs": torch.ones(n)}}, []
        )
        for n in (3, 2)
    ]
    out = step_mdp(LazyStackedTensorDict.lazy_stack(parts, 0))
    assert isinstance(out, LazyStackedTensorDict)
    assert [t["obs"].tolist() for t in out.tensordicts] == [[1.0] * 3, [1.0] * 2]
    assert "action" not in out.tensordicts[0].keys()


async def test_nested_env_step_mdp_moves_agent_entries():
    env = NestedCountingEnv(batch_size=(2,))
    td = await env.rand_step(await env.reset())
    out = env._step_mdp(td)
    assert (out["agents", "observation"] == td["next", "agents", "observation"]).all()
    assert ("agents", "action") not in out.keys(True)
    assert ("agents", "reward") not in out.keys(True)


@pytest.mark.parametrize("done_key", ["done", "terminated", "truncated"])
def test_terminated_or_truncated_root_prevails(done_key):
    data = TensorDict({done_key: torch.zeros(5, 1, dtype=torch.bool)}, [5])
    assert not terminated_or_truncated(data, write_full_false=False)
    assert "_reset" not in data.keys()
    data[done_key][2] = True
    assert terminated_or_truncated(data)
    assert data["_reset"].squeeze(-1).tolist() == [False, False, True, False, False]


def test_terminated_or_truncated_nested_levels():
    data = TensorDict(
        {
            "agents": {"done": torch.zeros(2, 3, 1, dtype=torch.bool)},
            "done": torch.zeros(2, 1, dtype=torch.bool),
        },
        [2],
    )
    data["agents", "done"][1, 2] = True
    assert terminated_or_truncated(data)
    assert data["agents", "_reset"][1, 2].item() and data["agents", "_reset"].sum() == 1
    assert "_reset" not in data.keys()  # an all-False level gets no mask...
    assert terminated_or_truncated(data, write_full_false=True)
    assert not data["_reset"].any()  # ...unless asked for
