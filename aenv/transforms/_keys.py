"""Key transforms: RenameTransform, ExcludeTransform, SelectTransform."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensordict import TensorDictBase

from aenv._mdp import NestedKey, unravel
from aenv.specs import Composite
from aenv.transforms._base import Transform, _norm_keys

__all__ = ["ExcludeTransform", "RenameTransform", "SelectTransform"]

_OUT = ("full_observation_spec", "full_reward_spec", "full_done_spec")
_IN = ("full_action_spec", "full_state_spec")


def _has(spec: Composite, key: NestedKey) -> bool:
    return unravel(key) in {unravel(k) for k in spec.keys(True, True)}


class RenameTransform(Transform):
    """Renames entries: outputs ``in_keys`` -> ``out_keys``; inputs ``out_keys_inv`` ->
    ``in_keys_inv`` (the outer names are ``out_keys*``, the base env's are ``in_keys*``).

    Args:
        in_keys: base env output names.
        out_keys: their names outside.
        in_keys_inv: base env input names (actions, state).
        out_keys_inv: their names outside (default ``in_keys_inv``).
        create_copy: keep the original entries as well.

    Example:
        >>> env = TransformedEnv(CountingEnv(), RenameTransform(
        ...     ["observation"], ["count"], in_keys_inv=["action"], out_keys_inv=["act"]))
        >>> td = await env.reset()
        >>> td["act"] = torch.ones(1, dtype=torch.int64)
        >>> (await env.step(td))["next", "count"]
        tensor([1.])
    """

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | NestedKey,
        out_keys: Sequence[NestedKey] | NestedKey,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        create_copy: bool = False,
    ) -> None:
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        self.create_copy = create_copy

    def _rename(
        self, td: TensorDictBase, pairs: list[tuple[NestedKey, NestedKey]]
    ) -> TensorDictBase:
        for src, dst in pairs:
            value = td.get(src, None)
            if value is None:
                continue
            if not self.create_copy:
                del td[src]
            td.set(dst, value)
        return td

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._rename(next_tensordict, list(zip(self.in_keys, self.out_keys)))

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._rename(tensordict, list(zip(self.out_keys_inv, self.in_keys_inv)))

    def _reset_env_preprocess(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._inv_call(tensordict)

    def _move(
        self, container: Composite, names: Sequence[str], pairs: list[tuple[NestedKey, NestedKey]]
    ) -> Composite:
        for src, dst in pairs:
            for name in names:
                spec = container[name]
                if _has(spec, src):
                    leaf = spec[src]
                    if not self.create_copy:
                        del spec[src]
                    spec[dst] = leaf.clone()
                    break
        return container

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        return self._move(output_spec, _OUT, list(zip(self.in_keys, self.out_keys)))

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        return self._move(input_spec, _IN, list(zip(self.in_keys_inv, self.out_keys_inv)))


class _KeyFilter(Transform):
    """Keeps or drops entries of the env's outputs or, with ``inverse``, of its inputs (on
    steps and resets alike); a subclass says how in :meth:`_filter`."""

    inverse: bool

    @staticmethod
    def _key_args(keys: tuple[Any, ...]) -> list[NestedKey]:
        """Keys given one by one, or as one list."""
        return _norm_keys(
            list(keys[0]) if len(keys) == 1 and isinstance(keys[0], list) else list(keys)
        )

    def _filter(self, td: TensorDictBase, inputs: bool) -> TensorDictBase:
        raise NotImplementedError

    @property
    def _needs_inv(self) -> bool:
        return self.inverse

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return next_tensordict if self.inverse else self._filter(next_tensordict, False)

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        return self._call(tensordict_reset)

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._filter(tensordict, True) if self.inverse else tensordict

    def _reset_env_preprocess(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._inv_call(tensordict)


class ExcludeTransform(_KeyFilter):
    """Drops entries from the env's outputs (or, with ``inverse=True``, from its inputs).

    Args:
        *excluded_keys: keys to drop.
        inverse: drop them from the inputs given to the base env instead (they leave the
            action/state specs).

    Example:
        >>> env = TransformedEnv(PendulumEnv(), ExcludeTransform("params", "thdot"))
        >>> "params" in env.observation_spec.keys()
        False
    """

    def __init__(self, *excluded_keys: NestedKey, inverse: bool = False) -> None:
        super().__init__()
        self.excluded_keys = self._key_args(excluded_keys)
        self.inverse = inverse

    def _filter(self, td: TensorDictBase, inputs: bool) -> TensorDictBase:
        return td.exclude(*self.excluded_keys)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        if self.inverse:
            return output_spec
        for key in self.excluded_keys:
            if _has(output_spec["full_done_spec"], key) or _has(
                output_spec["full_reward_spec"], key
            ):
                raise ValueError(f"ExcludeTransform cannot drop the done/reward entry {key!r}")
            spec = output_spec["full_observation_spec"]
            if _has(spec, key) or unravel(key) in {unravel(k) for k in spec.keys(True)}:
                del spec[key]
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        if not self.inverse:
            return input_spec
        for key in self.excluded_keys:
            for name in _IN:
                spec = input_spec[name]
                if unravel(key) in {unravel(k) for k in spec.keys(True)}:
                    del spec[key]
        return input_spec

    def extra_repr(self) -> str:
        return f"excluded_keys={self.excluded_keys}, inverse={self.inverse}"


class SelectTransform(_KeyFilter):
    """Keeps only some observation entries (rewards and done flags are kept by default).

    Args:
        *selected_keys: observation keys to keep.
        keep_rewards: keep every reward entry.
        keep_dones: keep every done entry.
        inverse: select the inputs given to the base env instead.

    Example:
        >>> env = TransformedEnv(PendulumEnv(), SelectTransform("th", "thdot"))
        >>> sorted(env.observation_spec.keys())
        ['th', 'thdot']
    """

    def __init__(
        self,
        *selected_keys: NestedKey,
        keep_rewards: bool = True,
        keep_dones: bool = True,
        inverse: bool = False,
    ) -> None:
        super().__init__()
        self.selected_keys = self._key_args(selected_keys)
        self.keep_rewards = keep_rewards
        self.keep_dones = keep_dones
        self.inverse = inverse
        self._keep: list[NestedKey] = list(self.selected_keys)
        self._keep_inv: list[NestedKey] = list(self.selected_keys)
        self._reset_keys: list[NestedKey] = ["_reset"]

    def _filter(self, td: TensorDictBase, inputs: bool) -> TensorDictBase:
        if inputs:
            return td.select(*self._keep_inv, "_step", *self._reset_keys, strict=False)
        return td.select(*self._keep, strict=False)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        done_keys = list(output_spec["full_done_spec"].keys(True, True))
        self._reset_keys = [(*unravel(k)[:-1], "_reset") for k in done_keys]
        if self.inverse:
            return output_spec
        keep = list(self.selected_keys)
        if self.keep_rewards:
            keep += list(output_spec["full_reward_spec"].keys(True, True))
        if self.keep_dones:
            keep += done_keys
        self._keep = keep
        obs = output_spec["full_observation_spec"]
        wanted = {unravel(k) for k in self.selected_keys}
        for key in list(obs.keys(True, True)):
            k = unravel(key)
            if not any(k[: len(w)] == w for w in wanted):
                del obs[key]
        _drop_empty(obs)
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        if not self.inverse:
            return input_spec
        self._keep_inv = list(self.selected_keys) + list(
            input_spec["full_action_spec"].keys(True, True)
        )
        state = input_spec["full_state_spec"]
        wanted = {unravel(k) for k in self.selected_keys}
        for key in list(state.keys(True, True)):
            k = unravel(key)
            if not any(k[: len(w)] == w for w in wanted):
                del state[key]
        _drop_empty(state)
        return input_spec

    def extra_repr(self) -> str:
        return f"selected_keys={self.selected_keys}, inverse={self.inverse}"


def _drop_empty(spec: Composite) -> None:
    for key in list(spec.keys()):
        sub = spec[key]
        if isinstance(sub, Composite):
            _drop_empty(sub)
            if not list(sub.keys(True, True)):
                del spec[key]
