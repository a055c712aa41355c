"""Spec objects that several envs hold at once, and the settling every env's specs get.

Envs built alike hold the same spec roots (:class:`SharedSpecs`): settled, locked for good
(``Composite._share_``) and copied by an env before it changes them (copy on write, in
:class:`~aenv.envs._specs.EnvSpecsMixin`). What is derived from them (key lists, plans) is
computed once per env class for all of them. Roots come to be shared three ways: every env
starts from the empty roots of its batch size and device (:func:`empty_roots`); a class
builds its specs once per configuration (:data:`TEMPLATES`, through
``EnvBase._specs_once``); a pool's envs with equal locked specs (``EnvBase._share_specs``).
"""

from __future__ import annotations

from typing import Any

import torch

from aenv._mdp import done_groups
from aenv.specs import Categorical, Composite, Unbounded

__all__ = [
    "TEMPLATES",
    "SharedSpecs",
    "add_default_reward",
    "complete_done_spec",
    "default_reward_spec",
    "empty_roots",
    "settle_specs",
]


class SharedSpecs:
    """Spec roots that several envs hold (settled and locked for good, so never changed in
    place, only replaced), and what has been derived from them for each env class: the key
    lists and plans of ``_SpecDerived``, computed once for all the envs, not once each."""

    __slots__ = ("derived", "input_spec", "output_spec")

    def __init__(self, output_spec: Composite, input_spec: Composite) -> None:
        # locked for good: unlocking one (rather than through the env's set_spec_lock_) raises
        self.output_spec = output_spec._share_()
        self.input_spec = input_spec._share_()
        self.derived: dict[tuple[type, str], Any] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        # the roots only: the derived values are remade on first read (and may be keyed by
        # classes that cannot be pickled)
        return (SharedSpecs, (self.output_spec, self.input_spec))


class _Templates:
    """Settled spec roots made once per env configuration, by (builder, configuration,
    batch size, device); beyond ``limit`` configurations the oldest is dropped (its envs
    keep their roots)."""

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self._by_key: dict[tuple[Any, ...], SharedSpecs] = {}

    def get(self, key: tuple[Any, ...]) -> SharedSpecs | None:
        return self._by_key.get(key)

    def put(self, key: tuple[Any, ...], share: SharedSpecs) -> SharedSpecs:
        while self._by_key and len(self._by_key) >= self.limit:
            del self._by_key[next(iter(self._by_key))]
        self._by_key[key] = share
        return share

    def clear(self) -> None:
        self._by_key.clear()


TEMPLATES = _Templates()

# the empty roots every env starts from, by (batch size, device)
_EMPTY: dict[tuple[torch.Size, torch.device | None], SharedSpecs] = {}


def empty_roots(batch_size: torch.Size, device: torch.device | None) -> SharedSpecs:
    """The shared empty roots (no entries, every group present) of envs of this batch size
    and device: what an env holds until its constructor assigns specs."""
    key = (batch_size, device)
    share = _EMPTY.get(key)
    if share is None:
        bs, dev = batch_size, device
        out = Composite(
            full_observation_spec=Composite(shape=bs, device=dev),
            full_reward_spec=Composite(shape=bs, device=dev),
            full_done_spec=Composite(shape=bs, device=dev),
            shape=bs,
            device=dev,
        )
        inp = Composite(
            full_action_spec=Composite(shape=bs, device=dev),
            full_state_spec=Composite(shape=bs, device=dev),
            shape=bs,
            device=dev,
        )
        share = _EMPTY[key] = SharedSpecs(out, inp)
    return share


def default_reward_spec(batch_size: torch.Size, device: torch.device | None) -> Unbounded:
    return Unbounded(shape=(*batch_size, 1), device=device)


def add_default_reward(
    output_spec: Composite, batch_size: torch.Size, device: torch.device | None
) -> None:
    """Give an (unlocked) output spec without any reward entry the default ``"reward"``."""
    full = output_spec["full_reward_spec"]
    if full.is_empty() and not full.keys():
        full["reward"] = default_reward_spec(batch_size, device)


def complete_done_spec(
    full: Composite, batch_size: torch.Size, device: torch.device | None
) -> None:
    """Give every level of an (unlocked) done spec a done and a terminated entry (a default
    pair when none exists)."""
    leaves = list(full.keys(include_nested=True, leaves_only=True))
    if not leaves:
        spec = Categorical(2, shape=(*batch_size, 1), dtype=torch.bool, device=device)
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


def settle_specs(
    output_spec: Composite, batch_size: torch.Size, device: torch.device | None
) -> None:
    """What an env's specs get at the end of its constructor, in place on an unlocked
    output spec: the default reward when none was declared, and done/terminated completed."""
    add_default_reward(output_spec, batch_size, device)
    complete_done_spec(output_spec["full_done_spec"], batch_size, device)
