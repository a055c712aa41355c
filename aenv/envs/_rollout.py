"""The async rollout loop shared by every env (pools and transformed envs included).

One loop runs every rollout: random actions and policies, single and batched envs, pools and
the sync facades' pools. Each step goes through the env's step hook
(:meth:`~aenv.EnvBase._step_into`) or, for a batched env, its whole-batch stepper
(:meth:`~aenv.EnvBase._rollout_stepper`: a pool's takes its backend's stacked rows and
overlaps consecutive steps where it can); a step store keeps it: time rows
(:mod:`aenv.envs._rollout_stores`, :mod:`aenv.envs._rollout_batch`) written by the env
itself or copied from the whole-batch result, TensorDicts stacked along the time dim
(:mod:`aenv.envs._rollout_steps`) otherwise.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio.lowlevel
import torch
from tensordict import TensorDictBase

from aenv._mdp import time_named, unravel
from aenv.envs._policy import make_policy
from aenv.envs._rollout_batch import _BatchRows
from aenv.envs._rollout_steps import _done_mask, _Draws, _StepStore, _TensorDicts
from aenv.envs._rollout_stores import _Fallback, _TimeRows
from aenv.envs._rowplan import writes_rows
from aenv.exceptions import PoolError

if TYPE_CHECKING:
    from aenv.envs._common import EnvBase

__all__ = [
    "YIELD_EVERY",
    "_StepStore",
    "_done_mask",
    "call_policy",
    "rollout_policy",
    "run_rollout",
]

#: A rollout lets the event loop run (other tasks, a cancel) at least once every this many
#: steps, however many of them complete without suspending (cheap sync envs).
YIELD_EVERY = 64


async def call_policy(policy: Callable[..., Any], td: TensorDictBase) -> TensorDictBase:
    """Apply a policy to ``td``: awaits async policies; a None result means "in place", and
    a new TensorDict (an out-of-place policy) is merged into ``td``, as TorchRL does, so the
    step keeps its observations and done flags."""
    out = policy(td)
    if out is td:  # (the common case first: a plain policy writing in place)
        return td
    return await policy_result(td, out)


async def policy_result(td: TensorDictBase, out: Any) -> TensorDictBase:
    """The step's input after a policy's call on ``td`` gave ``out`` (see :func:`call_policy`;
    the rollout loop calls policies itself, a coroutine fewer per step)."""
    if inspect.isawaitable(out):
        out = await out
    if out is None or out is td:
        return td
    if not isinstance(out, TensorDictBase):
        raise TypeError(
            f"a rollout policy must return a TensorDict (or None, writing in place); got "
            f"{type(out).__name__}. Wrap plain modules in tensordict.nn.TensorDictModule."
        )
    return td.update(out)


def _on_device(policy: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    """``policy`` called on a copy of the step's input cast to ``device`` (its parameters'
    device: ``auto_cast_to_device``); the copy it gives is merged back by the rollout."""

    async def on_device(td: TensorDictBase) -> TensorDictBase:
        return await call_policy(policy, td.to(device))

    return on_device


def _policy_device(policy: Any, env: EnvBase) -> torch.device | None:
    """The device of ``policy``'s first parameter where it differs from the env's (an
    ``auto_cast_to_device`` rollout casts the policy's input to it), else None."""
    parameters = getattr(policy, "parameters", None)
    if not callable(parameters):
        return None
    first = next(iter(parameters()), None)
    if first is None or first.device == env.device:
        return None
    return first.device


def rollout_policy(env: EnvBase, policy: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """The callable a rollout runs for ``policy``: a plain callable on observation tensors
    (an ``nn.Module`` on the observation, say) is wrapped to read the observations and write
    the action (:func:`~aenv.envs._policy.make_policy`); one whose call it cannot tell is
    used as it is."""
    if policy is None:
        return None
    try:
        return make_policy(policy, env)
    except TypeError:
        if not callable(policy):
            raise
        return policy


async def run_rollout(
    env: EnvBase,
    max_steps: int,
    policy: Callable[..., Any] | None,
    callback: Callable[..., Any] | None,
    *,
    auto_reset: bool,
    auto_cast_to_device: bool,
    break_when_any_done: bool | None,
    break_when_all_done: bool | None,
    return_contiguous: bool | None,
    tensordict: TensorDictBase | None,
    set_truncated: bool,
    reset_done: bool = True,
    until: Callable[[], bool] | None = None,
    storing_device: torch.device | str | None = None,
) -> TensorDictBase:
    """The rollout of :meth:`~aenv.EnvBase.rollout` (its arguments), and for the lockstep
    collector: with ``reset_done=False`` an env whose episode ended is not reset (not the
    one a given ``tensordict`` says ended either: it steps on), and ``until``, asked before
    each step, makes that step the last (not resetting what it ends) once it says True."""
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if break_when_any_done is None and break_when_all_done is None:
        break_when_any_done = True
    if break_when_any_done and break_when_all_done:
        raise ValueError("break_when_any_done and break_when_all_done cannot both be True")
    if auto_reset:
        if tensordict is not None:
            raise RuntimeError("tensordict cannot be passed when auto_reset=True")
    elif tensordict is None:
        raise RuntimeError("a tensordict is required when auto_reset=False")
    policy_device = _policy_device(policy, env) if auto_cast_to_device else None
    policy = rollout_policy(env, policy)
    if policy is not None and policy_device is not None:
        policy = _on_device(policy, policy_device)
    if reset_done and tensordict is not None and env._any_done_write_reset(tensordict):
        # a rollout going on from a given tensordict (the last step of another, say): what
        # it says is done is reset first, as TorchRL does; nothing else is
        tensordict = await env.reset(tensordict)
    cast = auto_cast_to_device and env.device is not None
    if auto_reset:
        tensordict = await env.reset()
    assert tensordict is not None
    if set_truncated and not any(unravel(k)[-1] == "truncated" for k in env.done_keys):
        raise RuntimeError(
            "set_truncated=True needs 'truncated' entries in the done spec; "
            "call env.add_truncated_keys() first"
        )
    # an env keeping EnvBase's step and step_and_maybe_reset: the loop calls their body
    # directly, and skips the action checks for actions drawn from the action specs
    from aenv.envs._common import EnvBase as Base

    cls = type(env)
    plain = cls.step is Base.step and cls.step_and_maybe_reset is Base.step_and_maybe_reset
    draws = _Draws.make(env, tensordict, max_steps) if policy is None else None
    store: list[_TimeRows | _TensorDicts] = [
        _TensorDicts(env, bool(return_contiguous), plain, policy is None, draws, callback, cast)
    ]
    # time rows (decided on the first step's input): an unbatched env's where its hooks
    # write them, a batched env's where it has a whole-batch stepper (a pool's: its
    # backend's stacked rows)
    rows: Callable[[TensorDictBase], _TimeRows | None] | None = None
    if (
        callback is None
        and not cast
        and not break_when_all_done
        and bool(return_contiguous)
        and max_steps > 1
    ):
        random = policy is None
        if not env.batch_size:
            if plain and writes_rows(env):
                rows = functools.partial(
                    _TimeRows.make, env, max_steps=max_steps, draws=draws, policy=not random
                )
        else:
            stepper = env._rollout_stepper(plain)
            if stepper is not None:
                if until is not None:  # (a step sent ahead could not be taken back)
                    stepper.overlaps = False
                rows = functools.partial(
                    _BatchRows.make,
                    env,
                    max_steps=max_steps,
                    draws=draws,
                    policy=not random,
                    stepper=stepper,
                    plain=plain,
                )
    try:
        await _loop(
            env,
            store,
            tensordict,
            max_steps,
            policy,
            rows,
            bool(break_when_any_done),
            bool(break_when_all_done),
            reset_done,
            until,
        )
    except PoolError as err:
        # a pool's sub-env failed: the steps done before are the caller's, not lost
        if store[0].count:
            err.rollout = _stored(time_named(store[0].finish()), storing_device)
        raise
    finally:
        store[0].close()
    if set_truncated:
        store[0].set_truncated()
    return _stored(time_named(store[0].finish()), storing_device)


def _stored(td: TensorDictBase, device: torch.device | str | None) -> TensorDictBase:
    """A rollout's result on its ``storing_device`` (None: where the steps left it)."""
    return td if device is None or td.device == torch.device(device) else td.to(device)


async def _loop(
    env: EnvBase,
    box: list[_TimeRows | _TensorDicts],
    td: TensorDictBase,
    max_steps: int,
    policy: Callable[..., Any] | None,
    rows: Callable[[TensorDictBase], _TimeRows | None] | None,
    break_when_any_done: bool,
    break_when_all_done: bool,
    reset_done: bool,
    until: Callable[[], bool] | None,
) -> None:
    """The rollout's steps, kept by ``box[0]`` (a store).

    Each step: the action (the policy's, or random ones: ``store.act`` draws those of
    steps ``t`` to ``store.drawn``), the step (``store.step``: True when it ended an
    episode somewhere), then, unless the rollout ends there, the next step's input
    (``store.advance``: ``step_mdp`` of the step, or, after an episode's end in a rollout
    that goes on, ``store.reset``: with what it ended reset). (The last step of a rollout
    resets nothing: the env stays where the step left it, as TorchRL's does.) With
    ``rows``, the first step's input decides whether time rows keep the steps; rows hand
    over to TensorDicts (:meth:`_TimeRows.fallback`) before a step they cannot hold.
    """
    store = box[0]
    stop = break_when_any_done or break_when_all_done
    resets = reset_done and not stop
    last = max_steps - 1
    checkpoint = anyio.lowlevel.checkpoint
    for t in range(max_steps):
        if t % YIELD_EVERY == YIELD_EVERY - 1:
            await checkpoint()
        if break_when_all_done and t:
            td.set("_step", ~_done_mask(env, td))
        if policy is not None:
            out = policy(td)
            if out is not td:  # (not a plain policy writing in place: call_policy's rule)
                td = await policy_result(td, out)
        elif t >= store.drawn:
            td = store.act(td, t)
        if rows is not None and not t:
            made = rows(td)
            if made is not None:
                store = box[0] = made
        final = t == last or (until is not None and until())
        try:
            td, done = await store.step(td, t, resets and not final)
        except _Fallback as handed:
            assert isinstance(store, _TimeRows)
            store = box[0] = store.fallback()
            if handed.stepped is None:  # (before the step: the TensorDicts take it)
                td, done = await store.step(td, t, resets and not final)
            else:  # (a step the rows could not hold: the TensorDicts keep it)
                td, done = store.adopt(handed.stepped, handed.next_input)
        if final or (done and break_when_any_done):
            break
        # (an episode end inside a rollout that goes on: the env resets what it ended)
        td = await store.reset(td, t) if done and resets else store.advance(td, t)
        if break_when_all_done and bool(_done_mask(env, td).all()):
            break
