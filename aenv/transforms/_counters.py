"""Per-episode counters: StepCounter, RewardSum, InitTracker."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from aenv._mdp import NestedKey, done_groups, unravel
from aenv.specs import Bounded, Categorical, Composite, TensorSpec, Unbounded
from aenv.transforms._base import Transform, reset_mask

__all__ = ["InitTracker", "RewardSum", "StepCounter"]


def _levels(done_spec: Composite) -> list[tuple[tuple[str, ...], torch.Size]]:
    """``(prefix, done shape)`` of every level of a done spec."""
    out = []
    for prefix, names in done_groups(done_spec.keys(True, True)).items():
        out.append((prefix, done_spec[(*prefix, names[0])].shape))
    return out


def _extra(td: TensorDictBase, env_ndim: int) -> torch.Size:
    return td.batch_size[: td.batch_dims - env_ndim]


def _level_template(
    td_reset: TensorDictBase, prefix: tuple[str, ...], spec_shape: torch.Size, env_ndim: int
) -> torch.Size:
    done = td_reset.get((*prefix, "done"), None)
    if isinstance(done, torch.Tensor):
        return done.shape
    return torch.Size((*_extra(td_reset, env_ndim), *spec_shape))


class StepCounter(Transform):
    """Counts the steps since the last reset and, with ``max_steps``, truncates episodes.

    Writes ``step_count`` (int64, done-flag shape) at every done level: 0 on reset, +1 per
    step. With ``max_steps`` the step reaching it sets ``truncated`` (added to the done spec
    if missing) and ``done``. Partial resets zero only the reset elements.

    Args:
        max_steps: truncate after this many steps (None: count only).
        truncated_key: name of the truncated flag.
        step_count_key: name of the counter.
        update_done: also set ``done`` when truncating.

    Example:
        >>> env = TransformedEnv(PendulumEnv(), StepCounter(max_steps=5))
        >>> r = await env.rollout(100)
        >>> r["next", "step_count"].squeeze(-1), r["next", "truncated"][-1]
        (tensor([1, 2, 3, 4, 5]), tensor([True]))
    """

    def __init__(
        self,
        max_steps: int | None = None,
        truncated_key: str = "truncated",
        step_count_key: str = "step_count",
        update_done: bool = True,
    ) -> None:
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        super().__init__()
        self.max_steps = max_steps
        self.truncated_key = truncated_key
        self.step_count_key = step_count_key
        self.update_done = update_done
        self._levels: list[tuple[tuple[str, ...], torch.Size]] = []
        self._obs_specs: dict[NestedKey, TensorSpec] = {}
        self._env_ndim = 0

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        done_spec = output_spec["full_done_spec"]
        obs_spec = output_spec["full_observation_spec"]
        self._env_ndim = len(output_spec.shape)
        self._levels = _levels(done_spec)
        high = self.max_steps if self.max_steps is not None else torch.iinfo(torch.int64).max
        self._obs_specs = {}
        for prefix, shape in self._levels:
            spec = Bounded(0, high, shape=shape, dtype=torch.int64, device=done_spec.device)
            obs_spec[(*prefix, self.step_count_key)] = spec
            self._obs_specs[(*prefix, self.step_count_key)] = spec
            if self.max_steps is not None and (*prefix, self.truncated_key) not in done_spec:
                done_spec[(*prefix, self.truncated_key)] = Categorical(
                    2, shape=shape, dtype=torch.bool, device=done_spec.device
                )
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        # the count travels in the input (pools forward state entries to their sub-envs)
        obs = self._obs_specs
        state = input_spec["full_state_spec"]
        for key, spec in obs.items():
            state[key] = spec.clone()
        return input_spec

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        for prefix, shape in self._levels:
            key = (*prefix, self.step_count_key)
            like = _level_template(tensordict_reset, prefix, shape, self._env_ndim)
            count = torch.zeros(like, dtype=torch.int64, device=tensordict_reset.device)
            prev = tensordict.get(key, None)
            mask = reset_mask(tensordict, prefix, count)
            if mask is not None and isinstance(prev, torch.Tensor) and prev.shape == count.shape:
                count = torch.where(mask, count, prev)
            tensordict_reset.set(key, count)
            if self.max_steps is not None:
                tkey = (*prefix, self.truncated_key)
                trunc = tensordict_reset.get(tkey, None)
                if trunc is None:
                    tensordict_reset.set(
                        tkey, torch.zeros(like, dtype=torch.bool, device=count.device)
                    )
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for prefix, shape in self._levels:
            key = (*prefix, self.step_count_key)
            prev = tensordict.get(key, None)
            if prev is None:
                like = _level_template(next_tensordict, prefix, shape, self._env_ndim)
                prev = torch.zeros(like, dtype=torch.int64, device=next_tensordict.device)
            count = prev + 1
            next_tensordict.set(key, count)
            if self.max_steps is not None:
                limit = count >= self.max_steps
                tkey = (*prefix, self.truncated_key)
                trunc = next_tensordict.get(tkey, None)
                next_tensordict.set(tkey, limit if trunc is None else trunc | limit)
                if self.update_done:
                    dkey = (*prefix, "done")
                    done = next_tensordict.get(dkey, None)
                    next_tensordict.set(dkey, limit if done is None else done | limit)
        return next_tensordict

    def extra_repr(self) -> str:
        return f"max_steps={self.max_steps}, step_count_key={self.step_count_key!r}"


class PerRewardState(Transform):
    """Base of transforms keeping one value per reward key as env state (a running sum, a
    return still to go): each out key is declared as an observation shaped like its reward
    and carried in the step input as state (pools forward state entries to sub-envs), and a
    reset sets it, on the reset elements only, to :meth:`_reset_value`."""

    _specs: dict[NestedKey, TensorSpec]
    _env_ndim: int

    def _declare_per_reward(self, output_spec: Composite) -> Composite:
        rewards = output_spec["full_reward_spec"]
        obs = output_spec["full_observation_spec"]
        self._env_ndim = len(output_spec.shape)
        self._specs = {}
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            if in_key not in rewards.keys(True, True):
                raise KeyError(f"{type(self).__name__}: {in_key!r} is not a reward key of the env")
            leaf = rewards[in_key]
            spec = Unbounded(shape=leaf.shape, dtype=leaf.dtype, device=leaf.device)
            obs[out_key] = spec
            self._specs[out_key] = spec
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        state = input_spec["full_state_spec"]
        for key, spec in self._specs.items():
            state[key] = spec.clone()
        return input_spec

    def _reset_value(self, zero: torch.Tensor) -> torch.Tensor:
        """The value an episode starts with, given the spec's zero of the right shape."""
        return zero

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        extra = _extra(tensordict_reset, self._env_ndim)
        for key, spec in self._specs.items():
            value = self._reset_value(spec.zero(extra))
            prev = tensordict.get(key, None)
            mask = reset_mask(tensordict, unravel(key)[:-1], value)
            if mask is not None and isinstance(prev, torch.Tensor) and prev.shape == value.shape:
                value = torch.where(mask, value, prev)
            tensordict_reset.set(key, value)
        return tensordict_reset


class RewardSum(PerRewardState):
    """Tracks the cumulative reward of the current episode.

    For each reward key (default: all of the env's), writes ``episode_<name>`` next to it (an
    observation): 0 on reset, the running sum after each step. Partial resets zero only the
    reset elements (using the ``"_reset"`` of the reward's level, or the root one).

    Args:
        in_keys: reward keys to sum (default: every reward key of the env).
        out_keys: where to write the sums (default: ``episode_reward`` beside each reward).
        reset_keys: accepted for TorchRL compatibility; the levels come from the keys.

    Example:
        >>> env = TransformedEnv(CountingEnv(max_steps=3), RewardSum())
        >>> (await env.rollout(3))["next", "episode_reward"].squeeze(-1)
        tensor([1., 2., 3.])
    """

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        reset_keys: Sequence[NestedKey] | None = None,
    ) -> None:
        super().__init__(in_keys=in_keys, out_keys=out_keys)
        self._auto_in = in_keys is None
        self._auto_out = out_keys is None
        self._specs: dict[NestedKey, TensorSpec] = {}
        self._env_ndim = 0

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        reward_spec = output_spec["full_reward_spec"]
        if self._auto_in:
            self.in_keys = list(reward_spec.keys(True, True))
        if self._auto_out:
            self.out_keys = [
                (*unravel(k)[:-1], f"episode_{unravel(k)[-1]}")
                if isinstance(k, tuple)
                else f"episode_{k}"
                for k in self.in_keys
            ]
        if len(self.out_keys) != len(self.in_keys):
            raise ValueError("RewardSum: in_keys and out_keys must have the same length")
        return self._declare_per_reward(output_spec)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            reward = next_tensordict.get(in_key)
            prev = tensordict.get(out_key, None)
            next_tensordict.set(out_key, reward.clone() if prev is None else prev + reward)
        return next_tensordict


class InitTracker(Transform):
    """Flags the first step of each episode: ``is_init`` is True on reset outputs, else False.

    Written at every done level with the done flag's shape; partial resets set it only for
    the reset elements. Recurrent policies read it to reset their hidden state.

    Args:
        init_key: name of the flag.

    Example:
        >>> env = TransformedEnv(CountingEnv(), InitTracker())
        >>> r = await env.rollout(3)
        >>> r["is_init"].squeeze(-1)
        tensor([ True, False, False])
    """

    def __init__(self, init_key: str = "is_init") -> None:
        super().__init__()
        self.init_key = init_key
        self._levels: list[tuple[tuple[str, ...], torch.Size]] = []
        self._env_ndim = 0

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        done_spec = output_spec["full_done_spec"]
        obs_spec = output_spec["full_observation_spec"]
        self._env_ndim = len(output_spec.shape)
        self._levels = _levels(done_spec)
        for prefix, shape in self._levels:
            obs_spec[(*prefix, self.init_key)] = Categorical(
                2, shape=shape, dtype=torch.bool, device=done_spec.device
            )
        return output_spec

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        for prefix, shape in self._levels:
            like = _level_template(tensordict_reset, prefix, shape, self._env_ndim)
            flag = torch.ones(like, dtype=torch.bool, device=tensordict_reset.device)
            mask = reset_mask(tensordict, prefix, flag)
            if mask is not None:
                prev = tensordict.get((*prefix, self.init_key), None)
                old = prev if isinstance(prev, torch.Tensor) and prev.shape == flag.shape else ~flag
                flag = torch.where(mask, flag, old)
            tensordict_reset.set((*prefix, self.init_key), flag)
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for prefix, shape in self._levels:
            like = _level_template(next_tensordict, prefix, shape, self._env_ndim)
            next_tensordict.set(
                (*prefix, self.init_key),
                torch.zeros(like, dtype=torch.bool, device=next_tensordict.device),
            )
        return next_tensordict
