"""The TorchRL bridge both ways: TorchRL envs as aenv envs (TorchRLWrapper) and aenv envs and
pools as TorchRL envs (to_torchrl), with the spec conversion both use.

Skipped where torchrl is not installed (TorchRL 0.14 pins tensordict 0.14.x: see the README's
"Other libraries" section for the venv that runs these).
"""

from __future__ import annotations

import functools

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

# (torchrl.envs: the submodule proves the real package is there)
pytest.importorskip(
    "torchrl.envs", reason="torchrl is not installed (pip install 'aenv[torchrl]' to run these)"
)

from torchrl import data as tdata
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs import GymEnv as TorchRLGymEnv
from torchrl.envs import ParallelEnv as TorchRLParallelEnv
from torchrl.envs import StepCounter as TorchRLStepCounter
from torchrl.envs import TransformedEnv as TorchRLTransformedEnv
from torchrl.envs.utils import check_env_specs as torchrl_check_env_specs

from aenv import AsyncEnvPool, SyncEnv, acheck_env_specs, check_env_specs, specs
from aenv.exceptions import SpecError
from aenv.libs.gym import GymEnv
from aenv.libs.torchrl import (
    AenvTorchRLEnv,
    TorchRLWrapper,
    from_torchrl_spec,
    to_torchrl,
    to_torchrl_spec,
)

pytestmark = pytest.mark.timeout(120)


class _FallingPolicy(torch.nn.Module):
    """Pushes the cart the way that topples the pole: episodes end within ~10 steps, so a
    short rollout crosses resets. Deterministic, so two loops given the same seed agree."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot((obs[..., 2] < 0).long(), 2)


def _policy() -> TensorDictModule:
    return TensorDictModule(_FallingPolicy(), in_keys=["observation"], out_keys=["action"])


def _torchrl_cartpole(seed: int | None = None, counter: bool = True) -> TorchRLWrapper:
    base = TorchRLGymEnv("CartPole-v1")
    env = TorchRLTransformedEnv(base, TorchRLStepCounter()) if counter else base
    if seed is not None:
        env.set_seed(seed)
    return TorchRLWrapper(env)


def _torchrl_reference(seed: int, steps: int) -> TensorDict:
    env = TorchRLTransformedEnv(TorchRLGymEnv("CartPole-v1"), TorchRLStepCounter())
    env.set_seed(seed)
    out = env.rollout(steps, _policy(), break_when_any_done=False)
    env.close()
    return out


# ---------------------------------------------------------------------- specs
def _torchrl_all_kinds() -> tdata.Composite:
    mask = torch.tensor([True, False, True, True])
    return tdata.Composite(
        obs=tdata.Bounded(-1.0, torch.tensor([1.0, 2.0, 3.0]).expand(2, 3).clone(), (2, 3)),
        free=tdata.Unbounded((2, 1), dtype=torch.int32),
        cat=tdata.Categorical(4, (2,), mask=mask.expand(2, 4).clone()),
        onehot=tdata.OneHot(3, (2, 3)),
        bits=tdata.Binary(5, (2, 5)),
        multi=tdata.MultiCategorical([2, 3], (2, 2)),
        multi_onehot=tdata.MultiOneHot([2, 3], (2, 5)),
        text=tdata.NonTensor(shape=(2,), example_data="hi"),
        nested=tdata.Composite(x=tdata.Unbounded((2, 4), dtype=torch.float64), shape=(2,)),
        hetero=torch.stack([tdata.Unbounded((2,)), tdata.Unbounded((3,))], 0),
        shape=(2,),
    )


def test_spec_conversion_every_kind_round_trips():
    trl = _torchrl_all_kinds()
    ours = from_torchrl_spec(trl)
    assert isinstance(ours, specs.Composite) and ours.shape == (2,)
    kinds = {
        "obs": specs.Bounded,
        "free": specs.Unbounded,
        "cat": specs.Categorical,
        "onehot": specs.OneHot,
        "bits": specs.Binary,
        "multi": specs.MultiCategorical,
        "multi_onehot": specs.MultiOneHot,
        "text": specs.NonTensor,
        "hetero": specs.Stacked,
    }
    for key, cls in kinds.items():
        assert isinstance(ours[key], cls), key
        assert ours[key].shape == trl[key].shape, key
    assert torch.equal(ours["obs"].high[1], torch.tensor([1.0, 2.0, 3.0]))
    assert ours["free"].dtype == torch.int32
    assert ours["nested", "x"].dtype == torch.float64
    assert ours["text"].example_data == "hi"
    # the action mask survives: masked-out values are never drawn
    assert not (ours["cat"].rand(torch.Size([200])) == 1).any()
    assert torch.equal(ours["multi"].nvec, torch.tensor([2, 3]))
    back = to_torchrl_spec(ours)
    assert back == trl  # TorchRL's equality: kinds, shapes, dtypes, bounds, masks


def test_spec_conversion_checks_values_like_the_original():
    ours = from_torchrl_spec(tdata.Bounded(0.0, 1.0, (3,)))
    assert ours.is_in(torch.full((3,), 0.5)) and not ours.is_in(torch.full((3,), 2.0))


def test_unknown_spec_kind_is_named():
    # TorchRL's Choice (a spec over a set of given values) has no aenv counterpart
    spec = tdata.Composite(
        a=tdata.Composite(b=tdata.Choice([tdata.Unbounded(1), tdata.Unbounded(1)]), shape=()),
        shape=(),
    )
    with pytest.raises(SpecError, match=r"a/b: Choice has no counterpart"):
        from_torchrl_spec(spec)


# ---------------------------------------------------------------------- TorchRL -> aenv
def test_wrapper_rejects_non_torchrl_envs():
    with pytest.raises(TypeError, match=r"torchrl\.envs\.EnvBase, got GymEnv"):
        TorchRLWrapper(GymEnv("CartPole-v1"))


async def test_wrapper_transformed_env_specs_and_rollout_match_torchrl():
    env = _torchrl_cartpole(seed=3)
    await acheck_env_specs(env)
    assert isinstance(env.observation_spec["step_count"], specs.Bounded)
    assert isinstance(env.action_spec, specs.OneHot) and env.blocking
    await env.set_seed(3)
    ours = await env.rollout(40, _policy(), break_when_any_done=False)
    ref = _torchrl_reference(3, 40)
    assert ref["next", "done"].any()  # the rollout crossed a reset
    for key in ("observation", ("next", "observation"), ("next", "step_count"), "action"):
        assert torch.equal(ours[key], ref[key]), key
    assert torch.equal(ours["next", "done"], ref["next", "done"])
    await env.aclose()
    assert env.env.is_closed


def test_wrapper_sync_check_env_specs_and_getattr():
    env = _torchrl_cartpole()
    check_env_specs(env)
    assert env.transform is env.env.transform  # public names reach the TorchRL env
    env.close()


@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_wrapper_in_a_pool_matches_torchrl(backend):
    pool = AsyncEnvPool(
        [functools.partial(_torchrl_cartpole, seed=s) for s in (11, 12)], backend=backend
    )
    try:
        await acheck_env_specs(pool)
        # reseed: the spec check stepped the envs
        await pool.set_seed(11)
        ours = await pool.rollout(30, _policy(), break_when_any_done=False)
    finally:
        await pool.aclose()
    for i, seed in enumerate((11, 12)):
        ref = _torchrl_reference(seed, 30)
        assert torch.equal(ours["observation"][i], ref["observation"]), (backend, i)
        assert torch.equal(ours["next", "step_count"][i], ref["next", "step_count"])


async def test_wrapper_torchrl_parallel_env_partial_reset():
    penv = TorchRLParallelEnv(2, functools.partial(TorchRLGymEnv, "CartPole-v1"))
    env = TorchRLWrapper(penv)
    try:
        assert env.batch_size == (2,)
        await acheck_env_specs(env)
        td = await env.reset()
        first = td["observation"].clone()
        td = await env.rand_step(td)
        moved = td["next", "observation"].clone()
        nxt = td["next"].clone()
        nxt["_reset"] = torch.tensor([[True], [False]])
        out = await env.reset(nxt)
        assert not torch.equal(out["observation"][0], moved[0])  # reset: a new start
        assert out["observation"][0].abs().max() <= 0.05  # CartPole starts in [-0.05, 0.05]
        assert torch.equal(out["observation"][1], moved[1])  # kept
        assert not torch.equal(first, moved)
    finally:
        await env.aclose()
    assert penv.is_closed


# ---------------------------------------------------------------------- aenv -> TorchRL
def test_to_torchrl_check_env_specs_and_rollout_match_aenv():
    tenv = to_torchrl(GymEnv("CartPole-v1"))
    assert isinstance(tenv, AenvTorchRLEnv)
    torchrl_check_env_specs(tenv)
    tenv.set_seed(5)
    theirs = tenv.rollout(40, _policy(), break_when_any_done=False)
    # aenv's own loop on the same env, same seed (aenv's seeding: the next reset uses it)
    ref_env = SyncEnv(GymEnv("CartPole-v1"))
    ref_env.set_seed(5)
    ref = ref_env.rollout(40, _policy(), break_when_any_done=False)
    assert ref["next", "done"].any()
    assert torch.equal(theirs["observation"], ref["observation"])
    assert torch.equal(theirs["next", "terminated"], ref["next", "terminated"])
    tenv.close()
    assert tenv.aenv_env.is_closed
    ref_env.close()


@pytest.mark.parametrize("backend", ["coroutine", "process"])
def test_pool_feeds_torchrl_collector_and_replay_buffer(backend):
    from aenv.sync import run_sync

    pool = AsyncEnvPool([functools.partial(GymEnv, "CartPole-v1")] * 2, backend=backend)
    tenv = to_torchrl(pool)
    try:
        assert tenv.batch_size == (2,)
        torchrl_check_env_specs(tenv)
        tenv.set_seed(21)  # env i gets 21 + i
        collector = Collector(tenv, _policy(), frames_per_batch=60, total_frames=60)
        (batch,) = list(collector)
        collector.shutdown(close_env=False)
        assert batch.batch_size == (2, 30)
        # aenv's own loop, same seeds: equal observations, resets at the same steps
        ref_pool = AsyncEnvPool([functools.partial(GymEnv, "CartPole-v1")] * 2)

        async def ref_rollout() -> TensorDict:
            await ref_pool.set_seed(21)
            try:
                return await ref_pool.rollout(30, _policy(), break_when_any_done=False)
            finally:
                await ref_pool.aclose()

        ref = run_sync(ref_rollout)
        assert ref["next", "done"].any()
        assert torch.equal(batch["observation"], ref["observation"])
        assert torch.equal(batch["next", "done"], ref["next", "done"])
        rb = ReplayBuffer(storage=LazyTensorStorage(100))
        rb.extend(batch.reshape(-1))
        assert len(rb) == 60 and rb.sample(8)["observation"].shape == (8, 4)
    finally:
        tenv.close()
    assert pool.is_closed


def test_to_torchrl_partial_reset_reaches_only_flagged_envs():
    tenv = to_torchrl(AsyncEnvPool([functools.partial(GymEnv, "CartPole-v1")] * 3))
    try:
        td = tenv.reset()
        td = tenv.rand_step(td)
        nxt = td["next"].clone()
        nxt["_reset"] = torch.tensor([[False], [True], [False]])
        before = nxt["observation"].clone()
        out = tenv.reset(nxt)  # TorchRL updates its input in place
        assert torch.equal(out["observation"][0], before[0])
        assert torch.equal(out["observation"][2], before[2])
        assert not torch.equal(out["observation"][1], before[1])
        assert out["observation"][1].abs().max() <= 0.05  # a fresh CartPole start
    finally:
        tenv.close()


def test_to_torchrl_rejects_non_aenv_envs():
    with pytest.raises(TypeError, match="aenv EnvBase, got GymEnv"):
        to_torchrl(TorchRLGymEnv("CartPole-v1"))


def test_round_trip_keeps_specs_and_unwraps():
    env = GymEnv("CartPole-v1")
    for spec in (env.output_spec, env.input_spec):
        # TorchRL puts device-less leaves on the CPU: compare there
        assert from_torchrl_spec(to_torchrl_spec(spec)).to("cpu") == spec.to("cpu")
    tenv = to_torchrl(env)
    with pytest.raises(TypeError, match="use its aenv_env attribute"):
        TorchRLWrapper(tenv)
    base = TorchRLGymEnv("CartPole-v1")
    assert to_torchrl(TorchRLWrapper(base)) is base  # no second bridge: the env itself
    with pytest.raises(TypeError, match="use its env attribute"):
        AenvTorchRLEnv(TorchRLWrapper(base))
    tenv.close()
    base.close()


def test_a_torchrl_transform_in_aenvs_transformed_env_is_refused_naming_the_aenv_way() -> None:
    from aenv import TransformedEnv
    from aenv.testing import CountingEnv

    with pytest.raises(TypeError, match=r"TorchRL's StepCounter.*aenv\.transforms\.StepCounter"):
        TransformedEnv(CountingEnv(), TorchRLStepCounter())
