"""Spec bookkeeping of EnvBase: the input/output spec tree, its views, locking and key caches."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp import NestedKey, done_groups, exclusion_tree, reset_keys_from_done_keys
from aenv.envs._spec_share import (
    TEMPLATES,
    SharedSpecs,
    add_default_reward,
    complete_done_spec,
    empty_roots,
    settle_specs,
)
from aenv.envs._spec_views import UnbatchedViewsMixin
from aenv.exceptions import BatchSizeError
from aenv.specs import Composite, TensorSpec

__all__ = ["EnvSpecsMixin", "fake_from_specs"]

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


_ROOTS = ("output_spec", "input_spec")
_MISSING = object()


class _SpecDerived:
    """A value derived from the specs (a key list, a plan) as a read-only attribute.

    While the specs are locked, the first read stores the value in the instance dict, where
    later reads find it with no call at all (some are read on every step); the stored values
    are dropped whenever the specs change or get unlocked (``_CACHED`` lists them). Envs of
    one class that hold the same shared spec roots (:class:`SharedSpecs`) compute it once
    between them, so a derived value must depend on the specs (and the class) alone, never
    on other state of the env. Unlocked, each read computes the value afresh.
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
        if not obj._spec_locked:
            return self.fn(obj)
        share = obj._spec_share
        if share is None:
            value = self.fn(obj)
        else:
            # (by class too: a subclass may derive differently from the same specs)
            key = (type(obj), self.name)
            value = share.derived.get(key, _MISSING)
            if value is _MISSING:
                value = share.derived[key] = self.fn(obj)
        obj.__dict__[self.name] = value
        return value


class EnvSpecsMixin(UnbatchedViewsMixin):
    """Holds ``input_spec`` / ``output_spec`` and derives every spec view and key list.

    ``output_spec`` holds ``full_observation_spec``, ``full_reward_spec`` and
    ``full_done_spec``; ``input_spec`` holds ``full_action_spec`` and ``full_state_spec``.
    Shapes include the env's batch size. While specs are locked (the default), derived key
    lists are cached; assigning a spec unlocks, replaces, clears the caches and relocks.

    Envs may hold the same spec objects (:class:`SharedSpecs`): the envs of a pool built
    by one factory (:meth:`_share_specs`), or of a class that builds its specs once per
    configuration (:meth:`_specs_once`). Shared roots are settled and locked; an env that
    changes its specs (an assignment, an unlock, a read while its own specs are unlocked)
    first takes a private copy (copy on write), so no env's change reaches another's.
    """

    batch_size: torch.Size
    _device: torch.device | None
    _spec_locked: bool
    _want_spec_lock: bool
    # True between a spec assignment and the next read of the specs: the roots are unlocked
    # and the done spec not yet completed. An env's constructor assigns four or five specs
    # in a row; settling once, on the first read, instead of after each (unlock, complete,
    # relock every level) is most of what building a big pool costs. Also True while an
    # env still being built holds shared roots: a read there takes a private copy first.
    _specs_open = False
    # the shared roots this env holds (None: its roots are its own): they are copied
    # before any change (:meth:`_own_specs`)
    _spec_share: SharedSpecs | None = None

    def _init_specs(self) -> None:
        # every env starts from shared empty roots (a copy is taken on the first assignment):
        # an env that takes settled roots from a template (_specs_once) never builds them
        self._hold(empty_roots(self.batch_size, self._device))
        self._specs_open = True

    def _hold(self, share: SharedSpecs) -> None:
        d = self.__dict__
        d["output_spec"], d["input_spec"] = share.output_spec, share.input_spec
        self._spec_share = share
        self._clear_spec_caches()

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
        if not mode:
            self._own_specs()  # (shared roots stay locked: unlocked ones are this env's own)
        self._spec_locked = bool(mode)
        self._clear_spec_caches()
        for spec in (self.output_spec, self.input_spec):
            if mode:
                spec.lock_()
            else:
                spec.unlock_()
        return self

    def _clear_spec_caches(self) -> None:
        d = self.__dict__
        for name in _CACHED:
            if name in d:
                del d[name]

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
        share = other._spec_share
        if share is None:
            share = other._spec_share = SharedSpecs(theirs["output_spec"], theirs["input_spec"])
        self._hold(share)
        return True

    def _specs_once(self, build: Callable[..., None], *config: Hashable) -> None:
        """Set this env's specs with ``build(self, *config)`` (which assigns them as a
        constructor does), once per configuration: the first env of a configuration builds
        them and keeps the settled result as the template of the later envs, which hold the
        same objects (locked, copied before any change) with the key lists and plans derived
        from them. Called in ``__init__`` instead of the assignments; ``config`` must hold
        everything the specs depend on besides the batch size and device (part of the key).

        Building thousands of envs of one kind is then mostly the env's own state: a
        :class:`~aenv.testing.LatencyEnv` built this way costs a few microseconds of spec
        work, not a few hundred. An env built with ``spec_locked=False`` builds its own.

        Example:
            >>> def _specs(env, obs_dim):
            ...     env.observation_spec = Composite(obs=Unbounded((obs_dim,)))
            ...     env.action_spec = Unbounded((1,))
            >>> self._specs_once(_specs, obs_dim)   # in __init__, after super().__init__()
        """
        if not self._want_spec_lock:
            build(self, *config)
            return
        key = (build, config, self.batch_size, self._device)
        share = TEMPLATES.get(key)
        if share is None:
            build(self, *config)
            out, inp = self.__dict__["output_spec"].clone(), self.__dict__["input_spec"].clone()
            settle_specs(out, self.batch_size, self._device)
            share = TEMPLATES.put(key, SharedSpecs(out, inp))
        self._hold(share)
        # (still being built: a read or an assignment before _post_init takes a copy)
        self._specs_open = True

    def _finish_specs(self) -> None:
        """Settle the specs at the end of the constructor (``EnvBase._post_init``): the
        default reward when none was declared, done/terminated completed, locked if the env
        is to be. An env holding a template it did not touch (:meth:`_specs_once`) has
        nothing to settle or copy: it only locks."""
        want = self._want_spec_lock
        share = self._spec_share
        if (
            share is not None
            and self._specs_open
            and want
            and share is not empty_roots(self.batch_size, self._device)
        ):
            self._specs_open = False
            self._spec_locked = True
            return
        self._open_specs()
        add_default_reward(self.__dict__["output_spec"], self.batch_size, self._device)
        self._spec_locked = want
        self._specs_changed()

    def _own_specs(self) -> None:
        """Copy shared spec objects before this env changes them in place (copy on write)."""
        share = self._spec_share
        if share is None:
            return
        d = self.__dict__
        for name in _ROOTS:
            if d[name] is getattr(share, name):
                mine = d[name].clone()
                if self._spec_locked:
                    mine.lock_()
                d[name] = mine
        self._spec_share = None
        self._clear_spec_caches()

    def _open_specs(self) -> None:
        """Unlock the roots for an assignment and drop the derived caches; the change is
        settled (:meth:`_specs_changed`) on the next read of either root."""
        self._clear_spec_caches()
        self._own_specs()
        if not self._specs_open:
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
        complete_done_spec(out["full_done_spec"], self.batch_size, self._device)
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


def _leaf_keys(spec: Composite) -> list[NestedKey]:
    return [k for k in spec.keys(include_nested=True, leaves_only=True)]


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
