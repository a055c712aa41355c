"""aenv.torchrl: TorchRL's names with TorchRL's sync behaviour, and the regressions the
"TorchRL script on aenv" issue listed (each named in its test)."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

import aenv
from aenv.exceptions import EnvClosedError
from aenv.testing import CountingEnv
from aenv.torchrl import (
    Bounded,
    Collector,
    Composite,
    EnvBase,
    GymEnv,
    ObservationNorm,
    ParallelEnv,
    SerialEnv,
    StepCounter,
    SyncDataCollector,
    Transform,
    TransformedEnv,
    Unbounded,
    _apply_to_composite,
    async_env,
    check_env_specs,
)

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


class Walk(EnvBase):
    """A TorchRL-style env: seeds itself in __init__, any batch (class attribute)."""

    batch_locked = False

    def __init__(self, seed=0):
        super().__init__()
        self.observation_spec = Composite(x=Unbounded((1,)))
        self.action_spec = Bounded(-1.0, 1.0, shape=(1,))
        self.set_seed(seed)

    def _set_seed(self, seed):
        self.rng = torch.Generator().manual_seed(seed)

    def _reset(self, td):
        shape = td.shape if td is not None else self.batch_size
        return TensorDict(x=torch.rand(*shape, 1, generator=self.rng), batch_size=shape)

    def _step(self, td):
        x = td["x"] + td["action"]
        return TensorDict(x=x, reward=-x.abs(), batch_size=td.shape)


# ---------------------------------------------------------------------- sync verbs
def test_verbs_are_sync_and_set_seed_in_init_works():
    env = Walk(seed=3)
    for verb in ("reset", "step", "rollout", "set_seed", "rand_step", "step_and_maybe_reset"):
        assert not inspect.iscoroutinefunction(getattr(env, verb)), verb
    first = env.reset()["x"]
    assert torch.equal(first, Walk(seed=3).reset()["x"])  # seeded in __init__
    assert not torch.equal(first, Walk(seed=4).reset()["x"])
    td = env.rand_step(env.reset())
    assert td["next", "reward"].shape == (1,)
    assert env.rollout(4).batch_size == (4,)
    assert env.set_seed(7) == 8


def test_async_api_intact_through_the_face():
    env = Walk(seed=1)
    face = async_env(env)
    assert inspect.iscoroutinefunction(face.reset)
    assert isinstance(face, Walk) and isinstance(face, aenv.EnvBase)
    face.batch_size  # noqa: B018  # one state: the face sees what the env holds
    env.extra = 5
    assert face.extra == 5

    async def main():
        async with aenv.AsyncEnvPool([lambda: async_env(Walk(seed=2))] * 2) as pool:
            return await pool.rollout(3)

    assert asyncio.run(main()).batch_size == (2, 3)


def test_batch_locked_class_attribute():
    """Regression 1: `batch_locked = False` as a class attribute was ignored by reset."""
    env = Walk()
    assert env.batch_locked is False
    td = env.reset(TensorDict(batch_size=[10]))
    assert td["x"].shape == (10, 1)
    assert env.rollout(3, auto_reset=False, tensordict=td).batch_size == (10, 3)
    env.batch_locked = True  # still settable, per env
    assert env.batch_locked and Walk().batch_locked is False


def test_close_and_eval():
    env = Walk()
    assert env.eval() is env and env.train() is env  # nn.Module callers
    env.close()
    env.close()  # idempotent
    with pytest.raises(EnvClosedError):
        env.reset()


# ---------------------------------------------------------------------- check_env_specs
class BadObs(Walk):
    def _step(self, td):
        out = super()._step(td)
        out["x"] = out["x"].double()  # not the spec's dtype
        return out


def test_check_env_specs_checks_even_with_warnings_ignored():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert check_env_specs(Walk()) is None
        with pytest.raises(AssertionError, match="x"):
            check_env_specs(BadObs())
        with pytest.raises(AssertionError, match="x"):
            aenv.check_env_specs(async_env(BadObs()))


def test_check_env_specs_and_verbs_inside_a_running_loop():
    async def notebook_cell():  # sync code inside a running loop, as in Jupyter
        env = Walk()
        check_env_specs(env)
        with pytest.raises(AssertionError):
            check_env_specs(BadObs())
        return env.rollout(2).batch_size

    assert asyncio.run(notebook_cell()) == (2,)


# ---------------------------------------------------------------------- transforms
def test_transformed_env_transform_is_the_transform():
    """Regression 5: TransformedEnv(env, t).transform was a Compose, not t."""
    t = StepCounter(5)
    env = TransformedEnv(Walk(), t)
    assert env.transform is t
    assert t.parent is not None
    env.append_transform(ObservationNorm(loc=0.0, scale=2.0, in_keys=["x"]))
    assert type(env.transform).__name__ == "Compose" and env.transform[0] is t
    r = env.rollout(10)
    assert r["next", "step_count"][-1].item() == 5 and r.batch_size == (5,)


def test_transformed_env_over_a_sync_facade():
    base = SerialEnv(2, lambda: Walk(seed=0))
    env = TransformedEnv(base, StepCounter())
    assert env.base_env is base
    assert not inspect.iscoroutinefunction(env.rollout)
    r = env.rollout(3)
    assert r.batch_size == (2, 3) and r["next", "step_count"][0, -1].item() == 3
    env.close()
    assert base.is_closed


def test_apply_to_composite():
    class Sin(Transform):
        def _apply_transform(self, obs):
            return obs.sin()

        def _reset(self, td, td_reset):
            return self._call(td_reset)

        @_apply_to_composite
        def transform_observation_spec(self, spec):
            return Bounded(-1, 1, shape=spec.shape, dtype=spec.dtype)

    env = TransformedEnv(Walk(), Sin(in_keys=["x"], out_keys=["s"]))
    spec = env.observation_spec["s"]
    assert isinstance(spec, Bounded) and spec.high.max().item() == 1
    check_env_specs(env)


def test_observation_norm_state_dict_keeps_standard_normal():
    """Regression 3: ObservationNorm(**sd) computed obs * scale + loc."""
    t = ObservationNorm(loc=1.0, scale=2.0, standard_normal=True, in_keys=["x"])
    sd = t.state_dict()
    assert bool(sd["standard_normal"])
    again = ObservationNorm(**sd, in_keys=["x"])
    x = TensorDict(x=torch.tensor([3.0]))
    assert again(x.clone())["x"].item() == t(x.clone())["x"].item() == 1.0


def test_init_stats_from_sync_code():
    norm = ObservationNorm(in_keys=["x"], out_keys=["x_norm"], standard_normal=True)
    env = TransformedEnv(Walk(seed=0), norm)
    assert not env.transform.initialized
    env.transform.init_stats(num_iter=50, reduce_dim=0, cat_dim=0)  # sync: no await
    assert env.transform.loc.shape == (1,)
    r = env.rollout(50)
    expected = (r["x"] - norm.loc) / norm.scale
    assert torch.allclose(r["x_norm"], expected)


# ---------------------------------------------------------------------- batched envs
def test_indexing_a_batched_env_steps_only_those_envs():
    penv = SerialEnv(3, lambda: CountingEnv(max_steps=100))
    penv.reset()
    sub = penv[1:]
    assert sub.batch_size == (2,)
    assert penv[0].batch_size == (1,)
    assert penv[np.array([0, 2])].batch_size == (2,)
    assert penv[torch.tensor([0, 2])].batch_size == (2,)
    sub.rollout(4)
    counts = penv.count  # per sub-env, read where each lives
    assert [c.item() for c in counts] == [0.0, 4.0, 4.0]
    sub.close()
    assert not penv.is_closed  # the subset shares the envs
    assert penv.rand_step()["next", "observation"].shape == (3, 1)
    penv.close()


@pytest.mark.timeout(60)
def test_set_seed_after_close_does_not_hang():
    """Regression 4: ParallelEnv.set_seed() after close() hung forever."""
    plain = aenv.ParallelEnv(2, CountingEnv, num_processes=1)
    plain.close()
    with pytest.raises(EnvClosedError):
        plain.set_seed(3)
    env = ParallelEnv(2, CountingEnv, mp_start_method="fork")  # TorchRL: restarts
    env.close()
    assert env.set_seed(3) == 5 and not env.is_closed
    assert env.rollout(2).batch_size == (2, 2)
    env.close()


def test_parallel_env_options():
    env = ParallelEnv(1, CountingEnv, serial_for_single=True)
    assert isinstance(env, SerialEnv)
    env.close()
    env = ParallelEnv(2, CountingEnv, mp_start_method="fork")
    assert env.mp_start_method == "fork"
    env.close()


@pytest.mark.timeout(180)
def test_global_fork_start_method_and_no_main_guard(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            from torch import multiprocessing
            multiprocessing.set_start_method("fork")
            from aenv.torchrl import GymEnv, ParallelEnv
            env = ParallelEnv(2, lambda: GymEnv("CartPole-v1"))  # no __main__ guard
            print(env.mp_start_method, tuple(env.rollout(3).batch_size))
            env.close()
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=170,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["fork", "(2,", "3)"]


# ---------------------------------------------------------------------- collectors
def test_collector_is_the_sync_collector_and_collects_without_grad():
    """Regression 2: SyncDataCollector batches carried the policy's graph."""
    assert Collector is SyncDataCollector
    net = torch.nn.Linear(1, 1)
    policy = TensorDictModule(net, in_keys=["x"], out_keys=["action"])
    collector = Collector(Walk(), policy, frames_per_batch=4, total_frames=8)
    batches = list(collector)  # iterable: TorchRL's sync Collector
    assert len(batches) == 2 and not batches[0]["action"].requires_grad
    collector.shutdown()
    keep = aenv.SyncDataCollector(
        async_env(Walk()), policy, frames_per_batch=4, total_frames=4, no_grad=False
    )
    assert next(iter(keep))["action"].requires_grad
    keep.shutdown()


def test_collector_factories_of_namespace_envs():
    collector = SyncDataCollector(
        [lambda: Walk(seed=0), lambda: Walk(seed=1)], None, frames_per_batch=4, total_frames=4
    )
    assert next(iter(collector)).batch_size == (2, 2)
    collector.shutdown()


# ---------------------------------------------------------------------- gym, specs
def test_gym_env_available_envs_and_unbatched_space():
    assert "CartPole-v1" in GymEnv.available_envs
    env = GymEnv("Pendulum-v1")
    space = env.action_spec_unbatched.space
    assert space.low.item() == -2.0 and space.high.item() == 2.0
    assert env.rollout(3).batch_size == (3,)
    env.close()
