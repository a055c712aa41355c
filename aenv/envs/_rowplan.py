"""Rows: preallocated TensorDicts, planned from an env's specs, that its step hooks write into.

A pool stacks one row per env (:mod:`aenv.pool._rows`); a rollout one row per time step
(:mod:`aenv.envs._rollout`). Whether an env writes rows itself is decided here, once.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDictBase

from aenv.specs import Composite, NonTensor

if TYPE_CHECKING:
    from aenv.envs._common import EnvBase

__all__ = [
    "INPUT_GROUPS",
    "RESET_GROUPS",
    "STEP_GROUPS",
    "plan_rows",
    "serial_copy",
    "writes_rows",
]

#: the output spec groups a step's ``"next"`` holds, and those a reset gives
STEP_GROUPS = ("full_observation_spec", "full_reward_spec", "full_done_spec")
RESET_GROUPS = ("full_observation_spec", "full_done_spec")
#: and what a step's input holds: the last observation and done flags, the action, the state
INPUT_GROUPS = (*RESET_GROUPS, "full_action_spec", "full_state_spec")
_INPUT_SPEC_GROUPS = frozenset(("full_action_spec", "full_state_spec"))


def plan_rows(env: EnvBase, groups: tuple[str, ...], n: int) -> TensorDictBase | None:
    """Zeroed buffers for ``n`` rows shaped as ``env``'s specs in ``groups``, stacked along
    a new first dim (None when a spec cannot be planned: non-tensor data, dynamic shapes)."""
    parts = []
    for name in groups:
        spec = (env.input_spec if name in _INPUT_SPEC_GROUPS else env.output_spec)[name]
        if not isinstance(spec, Composite):
            return None
        for key in spec.keys(True, True):
            leaf = spec[key]
            if type(key) is not str or isinstance(leaf, Composite | NonTensor) or -1 in leaf.shape:
                # (flat tensor specs only: a nested level's own batch dims would stack
                # differently from the per-env path's results; text is no tensor)
                return None
        parts.append(spec.zero())
    if not parts:
        return None
    row = parts[0].empty()
    for part in parts:
        row.update(part)
    if any(not isinstance(v, torch.Tensor) for v in row.values(True, True)):
        return None
    # (one zeroed tensor per leaf: stacking n rows costs a TensorDict per row)
    return row.unsqueeze(0).expand(n, *row.batch_size).apply(serial_copy)


def serial_copy(value: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``value`` (any strides: an expanded row, a moved dim), made by
    numpy where it can (a CPU tensor of a dtype numpy has, no gradient), else by torch.

    torch copies a tensor over 32k elements on its intra-op threads: the parent of a process
    pool wakes an OpenMP thread, which then spins for milliseconds after the copy, taking a
    core from the workers, and the parent waits at its barrier for that thread to be
    scheduled. A rollout's few buffer copies (its rows planned, its results put time last)
    cost 20-50 us per step of a 2,000-step rollout of 8 CartPoles on 2 worker processes
    (2 cores; parent CPU time). numpy copies in the calling thread.
    """
    src = None
    if value.device.type == "cpu" and not value.requires_grad:
        with contextlib.suppress(TypeError, RuntimeError):  # (a dtype numpy lacks: bfloat16)
            src = value.numpy()
    if src is None:
        return value.clone(memory_format=torch.contiguous_format)
    out = torch.empty(value.shape, dtype=value.dtype, device=value.device)
    out.numpy()[...] = src
    return out


def writes_rows(env: EnvBase) -> bool:
    """Whether ``env``'s step hook may write rows itself: its ``_step_into`` (as looked up on
    the instance, so an assignment there counts) is not :class:`~aenv.EnvBase`'s default,
    which never writes. (A subclass replacing ``_step`` below a writer gets the default
    back: see ``EnvBase.__init_subclass__``.)"""
    from aenv.envs._common import EnvBase

    hook = env._step_into
    return getattr(hook, "__func__", hook) is not EnvBase._step_into
