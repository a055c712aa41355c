"""Spec bookkeeping of EnvBase: the input/output spec tree, its views, locking and key caches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp import NestedKey, done_groups, exclusion_tree, reset_keys_from_done_keys
from aenv.exceptions import BatchSizeError
from aenv.specs import Categorical, Composite, TensorSpec, Unbounded

__all__ = ["EnvSpecsMixin"]

_CACHED = (
    "action_keys",
    "reward_keys",
    "done_keys",
    "observation_keys",
    "state_keys",
    "reset_keys",
    "_done_groups",
    "_done_zeros",
    "_reward_zero",
    "_action_checks",
    "_mdp_tree",
    "_done_flag_keys",
    "_fast_mdp",
)


class _SpecDerived:
    """A value derived from the specs (a key list, a plan) as a read-only attribute.

    While the specs are locked, the first read stores the value in the instance dict, where
    later reads find it with no call at all (some are read on every step); the stored values
    are dropped whenever the specs change or get unlocked (``_CACHED`` lists them). Unlocked,
    each read computes the value afresh.
    """

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        value = self.fn(obj)
        if obj._spec_locked:
            obj.__dict__[self.name] = value
        return value


class EnvSpecsMixin:
    """Holds ``input_spec`` / ``output_spec`` and derives every spec view and key list.

    ``output_spec`` holds ``full_observation_spec``, ``full_reward_spec`` and
    ``full_done_spec``; ``input_spec`` holds ``full_action_spec`` and ``full_state_spec``.
    Shapes include the env's batch size. While specs are locked (the default), derived key
    lists are cached; assigning a spec unlocks, replaces, clears the caches and relocks.
    """

    batch_size: torch.Size
    _device: torch.device | None
    _spec_locked: bool
    # True between a spec assignment and the next read of the specs: the roots are unlocked
    # and the done spec not yet completed. An env's constructor assigns four or five specs
    # in a row; settling once, on the first read, instead of after each (unlock, complete,
    # relock every level) is most of what building a big pool costs.
    _specs_open = False
    # True once this env's spec objects may be held by other envs too (:meth:`_share_specs`):
    # the first change in place (an assignment, an unlock) copies them first
    _specs_shared = False

    def _init_specs(self) -> None:
        bs = self.batch_size
        dev = self._device
        self.__dict__["output_spec"] = Composite(
            full_observation_spec=Composite(shape=bs, device=dev),
            full_reward_spec=Composite(shape=bs, device=dev),
            full_done_spec=Composite(shape=bs, device=dev),
            shape=bs,
            device=dev,
        )
        self.__dict__["input_spec"] = Composite(
            full_action_spec=Composite(shape=bs, device=dev),
            full_state_spec=Composite(shape=bs, device=dev),
            shape=bs,
            device=dev,
        )

    # ------------------------------------------------------------------ locking and caches
    @property
    def output_spec(self) -> Composite:
        """The locked composite of everything the env outputs."""
        if self._specs_open:
            self._specs_changed()
        return self.__dict__["output_spec"]

    @output_spec.setter
    def output_spec(self, spec: Composite) -> None:
        self._check_spec_shape("output_spec", spec)
        self._open_specs()
        self.__dict__["output_spec"] = spec.clone()

    @property
    def input_spec(self) -> Composite:
        """The locked composite of everything the env reads (actions and state)."""
        if self._specs_open:
            self._specs_changed()
        return self.__dict__["input_spec"]

    @input_spec.setter
    def input_spec(self, spec: Composite) -> None:
        self._check_spec_shape("input_spec", spec)
        self._open_specs()
        self.__dict__["input_spec"] = spec.clone()

    @property
    def is_spec_locked(self) -> bool:
        """Whether the specs are locked (no in-place modification; caches in use)."""
        return self._spec_locked

    def set_spec_lock_(self, mode: bool = True) -> EnvSpecsMixin:
        """Lock (``True``) or unlock (``False``) the specs in place; returns the env."""
        if self._specs_open:
            self._specs_changed()
        self._own_specs()
        self._spec_locked = bool(mode)
        self._clear_spec_caches()
        for spec in (self.output_spec, self.input_spec):
            if mode:
                spec.lock_()
            else:
                spec.unlock_()
        return self

    def _clear_spec_caches(self) -> None:
        for name in _CACHED:
            self.__dict__.pop(name, None)

    def _share_specs(self, other: EnvSpecsMixin) -> bool:
        """Hold ``other``'s spec objects instead of this env's own when they are equal and
        both are locked (so neither is ever changed in place, only replaced): a pool's envs
        built by one factory then keep one copy of their specs, not one each, which is most
        of an env's objects (memory, and the garbage collector's walks over thousands of
        envs). Returns whether the specs are shared."""
        mine, theirs = self.__dict__, other.__dict__
        if (
            mine["output_spec"] is theirs["output_spec"]
            and mine["input_spec"] is theirs["input_spec"]
        ):
            return True
        if not (self._spec_locked and other._spec_locked) or self._specs_open or other._specs_open:
            return False
        if not (
            mine["output_spec"] == theirs["output_spec"]
            and mine["input_spec"] == theirs["input_spec"]
        ):
            return False
        mine["output_spec"], mine["input_spec"] = theirs["output_spec"], theirs["input_spec"]
        self._specs_shared = other._specs_shared = True
        self._clear_spec_caches()
        return True

    def _own_specs(self) -> None:
        """Copy shared spec objects before this env changes them in place (copy on write)."""
        if self._specs_shared:
            for name in ("output_spec", "input_spec"):
                mine = self.__dict__[name].clone()
                if self._spec_locked:
                    mine.lock_()
                self.__dict__[name] = mine
            self._specs_shared = False

    def _open_specs(self) -> None:
        """Unlock the roots for an assignment and drop the derived caches; the change is
        settled (:meth:`_specs_changed`) on the next read of either root."""
        self._clear_spec_caches()
        if not self._specs_open:
            self._own_specs()
            self.__dict__["output_spec"].unlock_()
            self.__dict__["input_spec"].unlock_()
            self._specs_open = True

    def _specs_changed(self) -> None:
        """Complete the done spec, drop caches, relock if locking is on."""
        self._own_specs()
        out, inp = self.__dict__["output_spec"], self.__dict__["input_spec"]
        self._specs_open = False
        out.unlock_()
        inp.unlock_()
        self._complete_done_spec()
        self._clear_spec_caches()
        if self._spec_locked:
            out.lock_()
            inp.lock_()

    def _set_sub_spec(self, parent: str, name: str, spec: Composite) -> None:
        self._check_spec_shape(name, spec)
        self._open_specs()
        self.__dict__[parent][name] = spec.clone()

    def _check_spec_shape(self, name: str, spec: TensorSpec) -> None:
        bs = self.batch_size
        if not isinstance(spec, TensorSpec):
            raise TypeError(f"{name} must be a TensorSpec, got {type(spec).__name__}")
        if tuple(spec.shape[: len(bs)]) != tuple(bs):
            raise BatchSizeError(
                f"{name} has shape {tuple(spec.shape)}, which does not start with the env's "
                f"batch size {tuple(bs)}; spec shapes include the batch dims"
            )

    def _wrap_leaf(self, name: str, key: str, spec: TensorSpec) -> Composite:
        if isinstance(spec, Composite):
            return spec
        self._check_spec_shape(name, spec)
        return Composite({key: spec}, shape=self.batch_size, device=self._device)

    def _complete_done_spec(self) -> None:
        """Give every level a done and a terminated entry (a default pair when none exists)."""
        full = self.output_spec["full_done_spec"]
        leaves = list(full.keys(include_nested=True, leaves_only=True))
        if not leaves:
            spec = Categorical(
                2, shape=(*self.batch_size, 1), dtype=torch.bool, device=self._device
            )
            full["done"] = spec
            full["terminated"] = spec.clone()
            return
        for prefix, names in done_groups(leaves).items():
            present = (
                next(n for n in ("done", "terminated", "truncated") if n in names)
                if any(n in names for n in ("done", "terminated", "truncated"))
                else None
            )
            if present is None:
                continue
            template = full[(*prefix, present)]
            for needed in ("done", "terminated"):
                if needed not in names:
                    full[(*prefix, needed)] = template.clone()

    # ------------------------------------------------------------------ full specs
    @property
    def full_observation_spec(self) -> Composite:
        return self.output_spec["full_observation_spec"]

    @full_observation_spec.setter
    def full_observation_spec(self, spec: Composite) -> None:
        self._set_sub_spec("output_spec", "full_observation_spec", spec)

    @property
    def full_reward_spec(self) -> Composite:
        return self.output_spec["full_reward_spec"]

    @full_reward_spec.setter
    def full_reward_spec(self, spec: Composite) -> None:
        self._set_sub_spec("output_spec", "full_reward_spec", spec)

    @property
    def full_done_spec(self) -> Composite:
        return self.output_spec["full_done_spec"]

    @full_done_spec.setter
    def full_done_spec(self, spec: Composite) -> None:
        self._set_sub_spec("output_spec", "full_done_spec", spec)

    @property
    def full_action_spec(self) -> Composite:
        return self.input_spec["full_action_spec"]

    @full_action_spec.setter
    def full_action_spec(self, spec: Composite) -> None:
        self._set_sub_spec("input_spec", "full_action_spec", spec)

    @property
    def full_state_spec(self) -> Composite:
        return self.input_spec["full_state_spec"]

    @full_state_spec.setter
    def full_state_spec(self, spec: Composite) -> None:
        self._set_sub_spec("input_spec", "full_state_spec", spec)

    # ------------------------------------------------------------------ short views
    @property
    def observation_spec(self) -> Composite:
        """The observation composite (same object as ``full_observation_spec``)."""
        return self.full_observation_spec

    @observation_spec.setter
    def observation_spec(self, spec: Composite) -> None:
        if not isinstance(spec, Composite):
            raise TypeError(
                f"observation_spec must be a Composite, got {type(spec).__name__}; "
                "wrap the leaf, e.g. Composite(observation=spec, shape=env.batch_size)"
            )
        self.full_observation_spec = spec

    @property
    def state_spec(self) -> Composite:
        return self.full_state_spec

    @state_spec.setter
    def state_spec(self, spec: Composite) -> None:
        self.full_state_spec = self._wrap_leaf("state_spec", "state", spec)

    @staticmethod
    def _leaf_or_full(full: Composite, keys: list[NestedKey]) -> TensorSpec:
        return full[keys[0]] if len(keys) == 1 else full

    @property
    def action_spec(self) -> TensorSpec:
        """The action leaf when there is one action key, else the full composite."""
        return self._leaf_or_full(self.full_action_spec, self.action_keys)

    @action_spec.setter
    def action_spec(self, spec: TensorSpec) -> None:
        self.full_action_spec = self._wrap_leaf("action_spec", "action", spec)

    @property
    def reward_spec(self) -> TensorSpec:
        """The reward leaf when there is one reward key, else the full composite."""
        return self._leaf_or_full(self.full_reward_spec, self.reward_keys)

    @reward_spec.setter
    def reward_spec(self, spec: TensorSpec) -> None:
        self.full_reward_spec = self._wrap_leaf("reward_spec", "reward", spec)

    @property
    def done_spec(self) -> TensorSpec:
        """The done leaf when there is one done key, else the full done composite."""
        return self._leaf_or_full(self.full_done_spec, self.done_keys)

    @done_spec.setter
    def done_spec(self, spec: TensorSpec) -> None:
        self.full_done_spec = self._wrap_leaf("done_spec", "done", spec)

    # ------------------------------------------------------------------ keys
    @_SpecDerived
    def action_keys(self) -> list[NestedKey]:
        return _leaf_keys(self.full_action_spec)

    @_SpecDerived
    def reward_keys(self) -> list[NestedKey]:
        return _leaf_keys(self.full_reward_spec)

    @_SpecDerived
    def done_keys(self) -> list[NestedKey]:
        return _leaf_keys(self.full_done_spec)

    @_SpecDerived
    def observation_keys(self) -> list[NestedKey]:
        return _leaf_keys(self.full_observation_spec)

    @_SpecDerived
    def state_keys(self) -> list[NestedKey]:
        return _leaf_keys(self.full_state_spec)

    @_SpecDerived
    def reset_keys(self) -> list[NestedKey]:
        """One ``"_reset"`` key per level holding done entries."""
        return reset_keys_from_done_keys(self.done_keys)

    @_SpecDerived
    def _done_groups(self) -> dict[tuple[str, ...], list[str]]:
        return done_groups(self.done_keys)

    @_SpecDerived
    def _done_zeros(self) -> dict[tuple[str, ...], torch.Tensor]:
        out = {}
        for prefix, names in self._done_groups.items():
            spec = self.full_done_spec[(*prefix, names[0])]
            out[prefix] = torch.zeros(spec.shape, dtype=torch.bool, device=spec.device)
        return out

    @_SpecDerived
    def _reward_zero(self) -> dict[NestedKey, torch.Tensor]:
        return {k: self.full_reward_spec[k].zero() for k in self.reward_keys}

    @_SpecDerived
    def _action_checks(self) -> list[tuple[NestedKey, TensorSpec, bool]]:
        checks = []
        for key in self.action_keys:
            spec = self.full_action_spec[key]
            tensorlike = spec.dtype is not None and not type(spec).__name__.startswith("NonTensor")
            checks.append((key, spec, tensorlike))
        return checks

    @_SpecDerived
    def _mdp_tree(self) -> dict[str, Any]:
        return exclusion_tree(["next", *self.reward_keys, *self.done_keys, *self.action_keys])

    @_SpecDerived
    def _done_flag_keys(self) -> list[NestedKey]:
        """The ``"done"`` leaves (one per level): enough to tell whether anything is done."""
        return [k for k in self.done_keys if (k if isinstance(k, str) else k[-1]) == "done"]

    @_SpecDerived
    def _fast_mdp(self) -> tuple[frozenset[str], frozenset[str]] | None:
        """``(dropped from "next", dropped from the root)`` for :func:`~aenv._mdp.fast_step_mdp`,
        or None when a reward, done or action key is nested (the general path then runs)."""
        keys = [*self.reward_keys, *self.done_keys, *self.action_keys]
        if not all(isinstance(k, str) or len(k) == 1 for k in keys):
            return None
        flat = [k if isinstance(k, str) else k[0] for k in keys]
        rewards = frozenset(k if isinstance(k, str) else k[0] for k in self.reward_keys)
        return rewards, frozenset(("next", "_reset", "_step", *flat))

    def _single_key(self, kind: str, keys: list[NestedKey]) -> NestedKey:
        if len(keys) != 1:
            raise KeyError(
                f"the env has {len(keys)} {kind} keys ({keys}); `{kind}_key` needs exactly one, "
                f"use `{kind}_keys`"
            )
        return keys[0]

    @property
    def action_key(self) -> NestedKey:
        return self._single_key("action", self.action_keys)

    @property
    def reward_key(self) -> NestedKey:
        return self._single_key("reward", self.reward_keys)

    @property
    def done_key(self) -> NestedKey:
        return self._single_key("done", self.done_keys)

    # ------------------------------------------------------------------ shape views
    @property
    def shape(self) -> torch.Size:
        """The env's batch size (the seeds' ``env.shape``)."""
        return self.batch_size

    def _unbatched(self, spec: TensorSpec) -> TensorSpec:
        """``spec`` for one batch element: its first element along every batch dim."""
        n = len(self.batch_size)
        return spec[(0,) * n] if n else spec.clone()

    @property
    def input_spec_unbatched(self) -> Composite:
        """``input_spec`` without the batch dims."""
        return self._unbatched(self.input_spec)  # type: ignore[return-value]

    @property
    def output_spec_unbatched(self) -> Composite:
        """``output_spec`` without the batch dims."""
        return self._unbatched(self.output_spec)  # type: ignore[return-value]

    @property
    def full_action_spec_unbatched(self) -> Composite:
        """``full_action_spec`` without the batch dims."""
        return self._unbatched(self.full_action_spec)  # type: ignore[return-value]

    @property
    def action_spec_unbatched(self) -> TensorSpec:
        """``action_spec`` without the batch dims."""
        return self._unbatched(self.action_spec)

    @property
    def full_observation_spec_unbatched(self) -> Composite:
        """``full_observation_spec`` without the batch dims."""
        return self._unbatched(self.full_observation_spec)  # type: ignore[return-value]

    @property
    def observation_spec_unbatched(self) -> Composite:
        """``observation_spec`` without the batch dims."""
        return self._unbatched(self.observation_spec)  # type: ignore[return-value]

    @property
    def full_reward_spec_unbatched(self) -> Composite:
        """``full_reward_spec`` without the batch dims."""
        return self._unbatched(self.full_reward_spec)  # type: ignore[return-value]

    @property
    def reward_spec_unbatched(self) -> TensorSpec:
        """``reward_spec`` without the batch dims."""
        return self._unbatched(self.reward_spec)

    @property
    def full_done_spec_unbatched(self) -> Composite:
        """``full_done_spec`` without the batch dims."""
        return self._unbatched(self.full_done_spec)  # type: ignore[return-value]

    @property
    def done_spec_unbatched(self) -> TensorSpec:
        """``done_spec`` without the batch dims."""
        return self._unbatched(self.done_spec)

    @property
    def full_state_spec_unbatched(self) -> Composite:
        """``full_state_spec`` without the batch dims."""
        return self._unbatched(self.full_state_spec)  # type: ignore[return-value]


def _leaf_keys(spec: Composite) -> list[NestedKey]:
    return [k for k in spec.keys(include_nested=True, leaves_only=True)]


def default_reward_spec(batch_size: torch.Size, device: torch.device | None) -> Unbounded:
    return Unbounded(shape=(*batch_size, 1), device=device)


def fake_from_specs(
    output_spec: Composite,
    input_spec: Composite,
    batch_size: torch.Size,
    device: torch.device | None,
) -> TensorDictBase:
    """A zero-filled tensordict with every key a step of an env with these specs produces,
    ``"next"`` included (:meth:`~aenv.EnvBase.fake_tensordict`)."""
    root = TensorDict({}, batch_size=batch_size, device=device)
    for container, name in (
        (output_spec, "full_observation_spec"),
        (output_spec, "full_done_spec"),
        (input_spec, "full_state_spec"),
        (input_spec, "full_action_spec"),
    ):
        root.update(container[name].zero())
    nxt = TensorDict({}, batch_size=batch_size, device=device)
    for name in ("full_observation_spec", "full_reward_spec", "full_done_spec"):
        nxt.update(output_spec[name].zero())
    root.set("next", nxt)
    return root
