"""Small envs for the conformance suite, after the mocks TorchRL's own tests use (written
for aenv): state keys in the step output, no entries at all, an int8 binary action, custom
methods, done-only or terminated-only outputs, actions of a given width."""

from __future__ import annotations

import os
import sys
from typing import Any

import cloudpickle
import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

from aenv import EnvBase
from aenv.specs import Binary, Bounded, Categorical, Composite, Unbounded
from aenv.testing import CountingEnv

# the envs travel to worker processes by value (this module is not importable there)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _flag(value: bool = False) -> torch.Tensor:
    return torch.tensor([value])


class StateEnv(EnvBase):
    """A hidden state in ``state_spec`` that ``_step`` also returns (as TorchRL's envs do)."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((3,)))
        self.state_spec = Composite(hidden=Unbounded((4,)))
        self.action_spec = Unbounded((1,))
        self.reward_spec = Unbounded((1,))

    def _reset(self, td: Any) -> TensorDictBase:
        return TensorDict(observation=torch.zeros(3), hidden=torch.zeros(4))

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        hidden = td["hidden"] + 1
        return TensorDict(
            observation=hidden[:3].clone(),
            hidden=hidden,
            reward=torch.zeros(1),
            done=_flag(),
            terminated=_flag(),
        )

    def _set_seed(self, seed: int | None) -> None:
        pass


class NothingEnv(EnvBase):
    """No observation, action or reward: only the done flags aenv completes."""

    def _reset(self, td: Any) -> TensorDictBase:
        return TensorDict()

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        return TensorDict()

    def _set_seed(self, seed: int | None) -> None:
        pass


class BinaryActionEnv(EnvBase):
    """An ``int8`` Binary action of 3 bits; the observation is how many bits were set."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((1,)))
        self.action_spec = Binary(n=3, dtype=torch.int8)
        self.reward_spec = Unbounded((1,))
        self.seen: list[torch.dtype] = []

    def _reset(self, td: Any) -> TensorDictBase:
        return TensorDict(observation=torch.zeros(1))

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        action = td["action"]
        self.seen.append(action.dtype)
        return TensorDict(
            observation=action.float().sum(-1, keepdim=True), reward=torch.zeros(1), done=_flag()
        )

    def _set_seed(self, seed: int | None) -> None:
        pass


class MethodEnv(CountingEnv):
    """A counting env with custom methods and an attribute (TorchRL's custom-method test)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls = 0

    def custom_fun(self) -> int:
        self.calls += 1
        return 0

    def where(self) -> int:
        return os.getpid()

    @property
    def custom_prop(self) -> int:
        return 2


class DoneOnlyEnv(CountingEnv):
    """``_step`` gives ``"done"`` only: aenv completes ``"terminated"`` from it."""

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        self.count = self.count + 1
        return TensorDict(
            observation=self.count.clone(),
            done=self.count >= self.max_steps,
            reward=torch.zeros_like(self.count),
            batch_size=self.batch_size,
        )


class TerminatedOnlyEnv(CountingEnv):
    """``_step`` gives ``"terminated"`` only: aenv completes ``"done"`` from it."""

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        self.count = self.count + 1
        return TensorDict(
            observation=self.count.clone(),
            terminated=self.count >= self.max_steps,
            reward=torch.zeros_like(self.count),
            batch_size=self.batch_size,
        )


class WidthEnv(EnvBase):
    """An action of width ``width`` (``Bounded``, or ``Categorical`` indices when
    ``discrete``); the observation of the same width adds the actions up."""

    def __init__(self, width: int = 3, discrete: bool = False, max_steps: int = 4) -> None:
        super().__init__()
        self.width, self.max_steps = width, max_steps
        self.observation_spec = Composite(observation=Unbounded((width,)))
        if discrete:
            self.action_spec = Categorical(4, shape=(width,))
        else:
            self.action_spec = Bounded(-1.0, 1.0, shape=(width,))
        self.reward_spec = Unbounded((1,))
        self.total = torch.zeros(width)
        self.t = 0

    def _reset(self, td: Any) -> TensorDictBase:
        self.total, self.t = torch.zeros(self.width), 0
        return TensorDict(observation=self.total.clone())

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        self.total = self.total + td["action"].float()
        self.t += 1
        done = _flag(self.t >= self.max_steps)
        return TensorDict(
            observation=self.total.clone(), reward=torch.ones(1), done=done, terminated=done
        )

    def _set_seed(self, seed: int | None) -> None:
        pass


class DoublingEnv(EnvBase):
    """A stateless, batch-unlocked env (TorchRL's MockBatchedUnLockedEnv): the observation
    is twice the action, for inputs of any leading batch dims."""

    def __init__(self) -> None:
        super().__init__()
        self._batch_locked = False
        self.observation_spec = Composite(observation=Unbounded((2,)))
        self.action_spec = Unbounded((2,))
        self.reward_spec = Unbounded((1,))

    def _reset(self, td: Any) -> TensorDictBase:
        bs = td.batch_size if td is not None else torch.Size()
        return TensorDict(observation=torch.zeros(*bs, 2), batch_size=bs)

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        bs = td.batch_size
        done = torch.zeros(*bs, 1, dtype=torch.bool)
        return TensorDict(
            observation=td["action"] * 2,
            reward=torch.zeros(*bs, 1),
            done=done,
            terminated=done.clone(),
            batch_size=bs,
        )

    def _set_seed(self, seed: int | None) -> None:
        pass


class HeteroAgentsEnv(EnvBase):
    """Two agents whose observations and actions differ in width (3 and 2), lazy-stacked
    under ``"agents"`` (TorchRL's HeterogeneousCountingEnv): each agent's observation adds
    its actions up; done after ``max_steps``."""

    widths = (3, 2)

    def __init__(self, max_steps: int = 3) -> None:
        super().__init__()
        self.max_steps = max_steps

        def agents(**leaves: Any) -> Any:
            return torch.stack(
                [Composite({k: fn(w) for k, fn in leaves.items()}, shape=()) for w in self.widths],
                0,
            )

        self.observation_spec = Composite(
            agents=agents(observation=lambda w: Unbounded((w,))), shape=()
        )
        self.full_action_spec = Composite(
            agents=agents(action=lambda w: Bounded(-1.0, 1.0, shape=(w,))), shape=()
        )
        self.reward_spec = Unbounded((1,))
        self.totals = [torch.zeros(w) for w in self.widths]
        self.t = 0

    def _obs(self) -> TensorDictBase:
        parts = [TensorDict(observation=t.clone()) for t in self.totals]
        return TensorDict(agents=LazyStackedTensorDict(*parts, stack_dim=0))

    def _reset(self, td: Any) -> TensorDictBase:
        self.totals, self.t = [torch.zeros(w) for w in self.widths], 0
        return self._obs()

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        actions = td["agents"].tensordicts
        self.totals = [t + a["action"] for t, a in zip(self.totals, actions)]
        self.t += 1
        out = self._obs()
        out["reward"] = torch.ones(1)
        out["done"] = _flag(self.t >= self.max_steps)
        return out

    def _set_seed(self, seed: int | None) -> None:
        pass


class SelfResettingEnv(CountingEnv):
    """Resets itself on the step that ends an episode (TorchRL's AutoResettingCountingEnv):
    that step returns the done flags with the next episode's first observation."""

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        out = super()._step(td)
        done = out["done"]
        if bool(done.any()):
            self.count = torch.where(done, torch.zeros_like(self.count), self.count)
            out["observation"] = self.count.clone()
        return out
