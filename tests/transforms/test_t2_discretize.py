"""ActionDiscretizer."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import aenv
from aenv.specs import Categorical, MultiCategorical, MultiOneHot, OneHot
from aenv.testing import NestedCountingEnv
from aenv.transforms import ActionDiscretizer, TransformedEnv
from aenv.transforms._base import Transform


class _Recorder(Transform):
    """Records the action the base env receives (its inverse runs last, nearest the base)."""

    def __init__(self):
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def _inv_call(self, td):
        self.seen.append(td["action"].clone())
        return td


async def _base_actions(discretizer, actions):
    rec = _Recorder()
    env = TransformedEnv(aenv.PendulumEnv(seed=0), rec)
    env.append_transform(discretizer)
    td = await env.reset()
    for a in actions:
        td["action"] = a
        td = env._step_mdp(await env.step(td))
    return env, torch.stack(rec.seen)


async def test_median_values_and_spec():
    env, seen = await _base_actions(ActionDiscretizer(5), [torch.tensor([i]) for i in range(5)])
    assert isinstance(env.action_spec, Categorical) and env.action_spec.n == 5
    assert env.action_spec.shape == (1,)
    torch.testing.assert_close(seen.squeeze(-1), torch.tensor([-1.6, -0.8, 0.0, 0.8, 1.6]))
    assert seen.dtype == torch.float32
    await aenv.acheck_env_specs(env)


@pytest.mark.parametrize(
    "sampling, expected",
    [
        (ActionDiscretizer.SamplingStrategy.LOW, [-2.0, -1.0, 0.0, 1.0]),
        (ActionDiscretizer.SamplingStrategy.HIGH, [-1.0, 0.0, 1.0, 2.0]),
    ],
)
async def test_low_high(sampling, expected):
    _, seen = await _base_actions(
        ActionDiscretizer(4, sampling=sampling), [torch.tensor([i]) for i in range(4)]
    )
    torch.testing.assert_close(seen.squeeze(-1), torch.tensor(expected))


async def test_random_stays_in_interval():
    torch.manual_seed(0)
    _, seen = await _base_actions(
        ActionDiscretizer(2, sampling=ActionDiscretizer.SamplingStrategy.RANDOM),
        [torch.tensor([0])] * 5 + [torch.tensor([1])] * 5,
    )
    seen = seen.squeeze(-1)
    assert bool((seen[:5] >= -2).all() and (seen[:5] <= 0).all())
    assert bool((seen[5:] >= 0).all() and (seen[5:] <= 2).all())
    assert seen[:5].unique().numel() > 1


async def test_one_hot_and_out_key():
    env, seen = await _base_actions(
        ActionDiscretizer(3, categorical=False, out_action_key="action"),
        [torch.tensor([False, False, True])],
    )
    assert isinstance(env.action_spec, OneHot) and env.action_spec.shape == (3,)
    torch.testing.assert_close(seen.squeeze(-1), torch.tensor([4.0 / 3]))
    await aenv.acheck_env_specs(env)

    env = TransformedEnv(aenv.PendulumEnv(), ActionDiscretizer(3, out_action_key="action_idx"))
    assert env.action_keys == ["action_idx"]
    td = await env.rand_step(await env.reset())
    assert "action" not in td.keys()
    await aenv.acheck_env_specs(env)


async def test_multi_dim_actions():
    env = TransformedEnv(
        NestedCountingEnv(n_agents=2), ActionDiscretizer(4, action_key=("agents", "action"))
    )
    spec = env.full_action_spec["agents", "action"]
    assert isinstance(spec, Categorical) and spec.shape == (2, 1)
    await aenv.acheck_env_specs(env)
    t = ActionDiscretizer([2, 3], action_key=("agents", "action"))
    with pytest.raises(aenv.SpecError):  # 2 counts for a 1-dim action
        TransformedEnv(NestedCountingEnv(n_agents=2), t)
    # per-dim counts on a 2-dim action: MultiCategorical / MultiOneHot
    from aenv.testing import LatencyEnv

    env = TransformedEnv(LatencyEnv(action_dim=2), ActionDiscretizer([2, 3]))
    assert isinstance(env.action_spec, MultiCategorical)
    td = await env.reset()
    td["action"] = torch.tensor([1, 2])
    inner = env.transform[0].inv(td)
    torch.testing.assert_close(inner["action"], torch.tensor([0.5, 2 / 3]))
    await aenv.acheck_env_specs(env)
    env = TransformedEnv(LatencyEnv(action_dim=2), ActionDiscretizer([2, 3], categorical=False))
    assert isinstance(env.action_spec, MultiOneHot) and env.action_spec.shape == (5,)
    inner = env.transform[0].inv(TensorDict(action=torch.tensor([1, 0, 0, 0, 1], dtype=torch.bool)))
    torch.testing.assert_close(inner["action"], torch.tensor([-0.5, 2 / 3]))
    await aenv.acheck_env_specs(env)


async def test_refuses_discrete_base():
    from aenv.testing import CountingEnv

    with pytest.raises(aenv.SpecError):
        TransformedEnv(CountingEnv(), ActionDiscretizer(3))
