"""Envs built alike share their spec objects (aenv/envs/_spec_share.py): built once per
configuration (``EnvBase._specs_once``), held by every env of it, locked for good and copied
by an env before it changes them, so that no env's change reaches another's."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.envs._spec_share import TEMPLATES, empty_roots
from aenv.envs._specs import _SpecDerived
from aenv.exceptions import LockedSpecError
from aenv.specs import Bounded, Categorical, Composite, Unbounded
from aenv.testing import LatencyEnv
from aenv.transforms import StepCounter, TransformedEnv


def _fresh(**kwargs: Any) -> LatencyEnv:
    """A LatencyEnv that builds its own specs (the path every env took before templates),
    locked as the others are."""
    env = LatencyEnv(spec_locked=False, **kwargs)
    env.set_spec_lock_(True)
    return env


class TestOneFactory:
    def test_envs_of_one_configuration_hold_the_same_settled_specs(self) -> None:
        a, b = LatencyEnv(seed=0), LatencyEnv(seed=1)
        assert a.output_spec is b.output_spec and a.input_spec is b.input_spec
        # the same specs an env building its own gets: default reward, done completed
        own = _fresh()
        assert own.output_spec is not a.output_spec
        assert a.output_spec == own.output_spec and a.input_spec == own.input_spec
        assert a.done_keys == own.done_keys == ["done", "terminated", "truncated"]
        assert a.is_spec_locked and b.is_spec_locked
        # the derived key lists are computed once for both
        assert a.observation_keys is b.observation_keys

    def test_another_configuration_gets_its_own(self) -> None:
        a, b = LatencyEnv(obs_dim=3), LatencyEnv(obs_dim=5)
        assert a.output_spec is not b.output_spec
        assert a.observation_spec["observation"].shape == (3,)
        assert b.observation_spec["observation"].shape == (5,)
        assert LatencyEnv(obs_dim=5).output_spec is b.output_spec

    def test_assigning_a_spec_on_one_env_leaves_the_others_alone(self) -> None:
        a, b = LatencyEnv(seed=0), LatencyEnv(seed=1)
        a.observation_spec = Composite(
            observation=Unbounded((4,)), latency=Unbounded((1,)), extra=Unbounded((2,))
        )
        a.action_spec = Bounded(-2.0, 2.0, shape=(1,))
        assert "extra" in a.observation_keys and "extra" not in b.observation_keys
        assert float(a.action_spec.high.max()) == 2.0
        assert float(b.action_spec.high.max()) == 1.0
        assert b.output_spec is LatencyEnv(seed=2).output_spec  # the template is intact
        assert "extra" not in LatencyEnv(seed=3).observation_keys

    def test_a_shared_spec_cannot_be_changed_in_place(self) -> None:
        a, b = LatencyEnv(seed=0), LatencyEnv(seed=1)
        with pytest.raises(LockedSpecError):
            a.full_observation_spec["extra"] = Unbounded((1,))
        # unlocking the shared object itself is refused: it would unlock it for both
        with pytest.raises(LockedSpecError, match="set_spec_lock_"):
            a.output_spec.unlock_()
        with pytest.raises(LockedSpecError):
            a.full_done_spec.unlock_()
        assert b.output_spec.is_locked and "extra" not in b.observation_keys

    def test_unlocking_one_env_gives_it_its_own_copy(self) -> None:
        a, b = LatencyEnv(seed=0), LatencyEnv(seed=1)
        a.set_spec_lock_(False)
        assert a.output_spec is not b.output_spec
        a.full_observation_spec["extra"] = Unbounded((1,))
        a.full_done_spec["truncated"] = Categorical(2, (1,), dtype=torch.bool)
        a.set_spec_lock_(True)
        assert "extra" in a.observation_keys
        assert "extra" not in b.observation_keys and "extra" not in LatencyEnv().observation_keys
        assert b.output_spec.is_locked
        # a clone of a shared spec is an ordinary, unlockable one
        clone = b.output_spec.clone()
        clone.unlock_()
        clone["full_observation_spec", "more"] = Unbounded((1,))
        assert "more" not in b.observation_keys

    def test_an_env_built_unlocked_owns_its_specs(self) -> None:
        a = LatencyEnv()
        unlocked = LatencyEnv(spec_locked=False)
        assert unlocked.output_spec is not a.output_spec
        unlocked.full_observation_spec["extra"] = Unbounded((1,))
        assert "extra" in unlocked.observation_keys and "extra" not in a.observation_keys

    def test_a_subclass_changing_the_specs_in_its_constructor(self) -> None:
        class Extra(LatencyEnv):
            def __init__(self, **kwargs: Any) -> None:
                super().__init__(**kwargs)
                # in place, while the env is still unlocked, as constructors may
                self.full_observation_spec["extra"] = Unbounded((2,))
                self.full_done_spec["done"] = Categorical(2, (1,), dtype=torch.bool)

        plain = LatencyEnv()
        sub, sub2 = Extra(), Extra()
        assert "extra" in sub.observation_keys and "extra" in sub2.observation_keys
        assert "extra" not in plain.observation_keys
        assert "extra" not in LatencyEnv().observation_keys  # the template is intact
        assert sub.output_spec is not plain.output_spec

    def test_derived_values_are_kept_per_class(self) -> None:
        class Reversed(LatencyEnv):
            @_SpecDerived
            def observation_keys(self) -> list[Any]:
                return list(reversed(self.full_observation_spec.keys(True, True)))

        plain, rev = LatencyEnv(), Reversed()
        assert plain.output_spec is rev.output_spec  # the same builder, the same template
        assert rev.observation_keys == list(reversed(plain.observation_keys))
        assert LatencyEnv().observation_keys == plain.observation_keys

    async def test_envs_sharing_specs_step_and_reset_each_their_own(self) -> None:
        a, b = LatencyEnv(seed=0), LatencyEnv(seed=1)
        ta, tb = await a.reset(), await b.reset()
        ta = await a.rand_step(ta)
        assert ta["next", "observation"].tolist() == [1.0] * 4
        assert tb["observation"].tolist() == [0.0] * 4
        # the outputs are the env's own tensors, never the shared zeros
        assert ta["next", "done"].data_ptr() != tb["done"].data_ptr()

    def test_a_pickled_env_keeps_consistent_specs(self) -> None:
        a = LatencyEnv(seed=0)
        copy = pickle.loads(pickle.dumps(a))
        assert copy.output_spec == a.output_spec and copy.observation_keys == a.observation_keys
        copy.observation_spec = Composite(observation=Unbounded((4,)), x=Unbounded((1,)))
        assert "x" in copy.observation_keys and "x" not in a.observation_keys


class _Counter(EnvBase):
    """Specs built once per configuration; declares only ``done`` and no reward."""

    def __init__(self, size: int = 2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._specs_once(_counter_specs, size)
        self.n = 0

    def _set_seed(self, seed: int | None) -> None:
        pass

    def _reset(self, td: Any, **kwargs: Any) -> TensorDictBase:
        self.n = 0
        return TensorDict(count=torch.zeros(self.batch_size + (1,)), batch_size=self.batch_size)

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        self.n += 1
        return TensorDict(
            count=torch.full(self.batch_size + (1,), float(self.n)),
            reward=torch.ones(self.batch_size + (1,)),
            done=torch.full(self.batch_size + (1,), self.n >= 2),
            batch_size=self.batch_size,
        )


def _counter_specs(env: EnvBase, size: int) -> None:
    bs = env.batch_size
    env.observation_spec = Composite(count=Unbounded((*bs, 1)), shape=bs)
    env.action_spec = Unbounded((*bs, size))
    env.full_done_spec = Composite(done=Categorical(2, (*bs, 1), dtype=torch.bool), shape=bs)


class TestTemplates:
    def test_a_template_is_settled_as_an_env_building_its_own(self) -> None:
        own = _Counter(spec_locked=False)
        own.set_spec_lock_(True)
        a, b = _Counter(), _Counter()
        assert a.output_spec is b.output_spec
        assert a.output_spec == own.output_spec and a.input_spec == own.input_spec
        assert a.reward_keys == ["reward"]  # the default reward
        assert sorted(a.done_keys) == ["done", "terminated"]  # completed

    def test_batch_size_and_device_are_part_of_the_key(self) -> None:
        a, b = _Counter(batch_size=(3,)), _Counter(batch_size=(3,))
        assert a.output_spec is b.output_spec
        assert a.action_spec.shape == (3, 2)
        c = _Counter(batch_size=(4,))
        assert c.output_spec is not a.output_spec and c.action_spec.shape == (4, 2)
        d = _Counter(device="cpu")
        assert d.output_spec is not _Counter().output_spec
        assert d.output_spec.device == torch.device("cpu")

    async def test_a_templated_env_runs_a_rollout(self) -> None:
        env = _Counter(batch_size=(2,))
        roll = await env.rollout(5)
        assert roll.batch_size == (2, 2)
        assert roll["next", "terminated"].all(-1).tolist() == [[False, True]] * 2

    def test_templates_are_bounded(self) -> None:
        limit = TEMPLATES.limit
        TEMPLATES.limit = 2
        try:
            envs = [_Counter(size=s) for s in (11, 12, 13)]
            assert [e.action_spec.shape for e in envs] == [(11,), (12,), (13,)]
            assert TEMPLATES.get((_counter_specs, (11,), torch.Size(), None)) is None
            assert envs[0].output_spec.is_locked  # its envs keep their specs
            assert _Counter(size=13).output_spec is envs[2].output_spec
        finally:
            TEMPLATES.limit = limit

    def test_an_env_assigning_no_spec_gets_the_defaults(self) -> None:
        class Bare(EnvBase):
            def _set_seed(self, seed: int | None) -> None:
                pass

        env = Bare()
        empty = empty_roots(env.batch_size, env.device)
        assert env.output_spec is not empty.output_spec
        assert env.reward_keys == ["reward"] and sorted(env.done_keys) == ["done", "terminated"]
        assert empty.output_spec["full_reward_spec"].is_empty()  # the shared start is intact
        assert not empty.output_spec["full_done_spec"].keys()


class TestTransforms:
    async def test_a_transform_over_a_shared_spec_changes_only_its_env(self) -> None:
        base, other = LatencyEnv(seed=0, max_steps=3), LatencyEnv(seed=1, max_steps=3)
        env = TransformedEnv(base, StepCounter())
        assert "step_count" in env.observation_keys
        assert "step_count" not in base.observation_keys
        assert "step_count" not in other.observation_keys
        assert base.output_spec is other.output_spec  # the base env still shares
        roll = await env.rollout(3)
        assert roll["next", "step_count"].squeeze(-1).tolist() == [1, 2, 3]
        # two transformed envs of one factory do not share through their transforms
        env2 = TransformedEnv(LatencyEnv(seed=2), StepCounter(max_steps=5))
        assert env2.output_spec is not env.output_spec
        env2.set_spec_lock_(False)
        env2.full_observation_spec["more"] = Unbounded((1,))
        assert "more" not in env.observation_keys and "more" not in base.observation_keys
