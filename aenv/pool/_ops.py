"""Operations on one sub-env, shared by every backend that hosts envs as Python objects.

:func:`execute` runs one operation (see :mod:`aenv.pool._backend`) on a local env;
:func:`runs_inline` says whether it is sure to finish without suspending, in which case
:func:`drive` runs it to completion without a task or an event loop, and
:func:`execute_inline` gives the same result with plain calls where it can (steps of envs
that keep EnvBase's ``step``: no coroutine per step).
"""

from __future__ import annotations

import inspect
from collections.abc import Coroutine
from typing import Any

from tensordict import TensorDict, TensorDictBase

from aenv._mdp import getter, with_next
from aenv.envs._common import EnvBase

__all__ = [
    "OPS",
    "drive",
    "execute",
    "execute_inline",
    "lean_inline",
    "lean_step_ok",
    "runs_inline",
    "step_rows",
]

OPS = ("step", "reset", "step_and_maybe_reset", "seed", "call", "getattr")

_STEP = EnvBase.step
_RESET = EnvBase.reset
_SMR = EnvBase.step_and_maybe_reset
_SEED = EnvBase.set_seed


def lean_step_ok(env: EnvBase, td: TensorDictBase) -> bool:
    """Whether a step of ``env`` on ``td`` may go straight to its step hook: the pool
    checked batch size and actions against its stacked specs already, and an env that
    keeps EnvBase.step, runs no type checks and gets no ``"_step"`` mask needs no more."""
    # (read on every step of a streamed env: the mask from the entry dict, without a call)
    return (
        type(env).step is _STEP
        and not env.run_type_checks
        and not env._closed
        and (td._tensordict.get("_step") if type(td) is TensorDict else td.get("_step", None))
        is None
    )


async def _step(env: EnvBase, td: TensorDictBase) -> TensorDictBase:
    if lean_step_ok(env, td):
        out = await env._step_into(td, None)
        assert not isinstance(out, bool)
        return out
    stepped = await env.step(td)
    return stepped.get("next")


async def _step_and_maybe_reset(
    env: EnvBase, td: TensorDictBase
) -> tuple[TensorDictBase, TensorDictBase | None]:
    if type(env).step_and_maybe_reset is not _SMR:
        # A custom composite: honour it, keep its "next".
        stepped, reset = await env.step_and_maybe_reset(td)
        return stepped.get("next"), reset
    if lean_step_ok(env, td):
        lean_next, lean_reset = await step_rows(env, "step_and_maybe_reset", td)
        assert not isinstance(lean_next, bool) and not isinstance(lean_reset, bool)
        return lean_next, lean_reset
    nxt = await _step(env, td)
    if not _any_done(env, nxt):
        return nxt, None
    out = await env._reset_into(td.set("next", nxt), None)
    assert not isinstance(out, bool)
    return nxt, out


async def step_rows(
    env: EnvBase,
    op: str,
    td: TensorDictBase,
    next_row: TensorDictBase | None = None,
    reset_row: TensorDictBase | None = None,
) -> tuple[bool | TensorDictBase, bool | TensorDictBase | None]:
    """A lean step (see :func:`lean_inline`) of one env through its hooks: the step into
    ``next_row``, then, for a step-and-maybe-reset that ended the episode, the reset into
    ``reset_row`` (rows as the specs plan them, or None for TensorDicts). The one "step,
    then reset what is done" of every whole-batch path (a pool's rows, a process worker's
    slots, a lone env's op).

    Returns ``(next, reset)``: ``next`` is the done flag when the row holds the step, else
    its TensorDict; ``reset`` is None when no reset ran (a step, or not done), True when
    the reset row holds it, else its TensorDict. ``td`` gets no entry: the reset sees a
    shallow copy with ``"next"``.
    """
    nxt = await env._step_into(td, next_row)
    if op == "step":
        return nxt, None
    if isinstance(nxt, bool):
        if not nxt:
            return nxt, None
        assert next_row is not None
        stepped = with_next(td, next_row)
    elif _any_done(env, nxt):
        stepped = with_next(td, nxt)
    else:
        return nxt, None
    return nxt, await env._reset_into(stepped, reset_row)


def _any_done(env: EnvBase, nxt: TensorDictBase) -> bool:
    get = getter(nxt)
    for prefix in env._done_groups:
        done = get((*prefix, "done") if prefix else "done")
        if done is not None and (bool(done) if done.numel() == 1 else bool(done.any())):
            return True
    return False


def lean_inline(env: EnvBase, op: str, payload: TensorDictBase) -> bool:
    """Whether ``op`` (a step, or a step-and-maybe-reset the env does not customise) may
    call the env's ``_step`` directly (see :func:`lean_step_ok`)."""
    if op == "step":
        return lean_step_ok(env, payload)
    return (
        op == "step_and_maybe_reset"
        and type(env).step_and_maybe_reset is _SMR
        and lean_step_ok(env, payload)
    )


def execute_inline(env: EnvBase, op: str, payload: Any) -> Any:
    """``drive(execute(env, op, payload))`` for an op that :func:`runs_inline`: the same
    result; a step on the lean path (see :func:`lean_inline`) skips the op's coroutine."""
    if (op == "step" or op == "step_and_maybe_reset") and lean_inline(env, op, payload):
        nxt, reset = drive(step_rows(env, op, payload))
        return nxt if op == "step" else (nxt, reset)
    return drive(execute(env, op, payload))


async def execute(env: EnvBase, op: str, payload: Any) -> Any:
    """Run operation ``op`` with ``payload`` on ``env``; returns its result."""
    if op == "step":
        return await _step(env, payload)
    if op == "reset":
        td, kwargs = payload
        return await env.reset(td, **kwargs)
    if op == "step_and_maybe_reset":
        return await _step_and_maybe_reset(env, payload)
    if op == "seed":
        seed, static = payload
        return await env.set_seed(seed, static_seed=static)
    if op == "call":
        name, args, kwargs = payload
        out = getattr(env, name)(*args, **kwargs)
        if inspect.isawaitable(out):
            out = await out
        return out
    if op == "getattr":
        return getattr(env, payload)
    raise ValueError(f"unknown pool operation {op!r}; expected one of {OPS}")


def runs_inline(env: EnvBase, op: str, payload: Any = None) -> bool:
    """True when ``execute(env, op, payload)`` cannot suspend: EnvBase's own methods over
    sync, non-blocking ``_step`` / ``_reset`` / ``_set_seed``."""
    if env.blocking:
        return False
    cls = type(env)
    if op == "step":
        return cls.step is _STEP and not cls._step_is_async
    if op == "reset":
        return cls.reset is _RESET and not cls._reset_is_async
    if op == "step_and_maybe_reset":
        return (
            cls.step is _STEP
            and cls.reset is _RESET
            and cls.step_and_maybe_reset is _SMR
            and not cls._step_is_async
            and not cls._reset_is_async
        )
    if op == "seed":
        return cls.set_seed is _SEED and not cls._seed_is_async
    if op == "getattr":
        return True
    if op == "call":
        method = getattr(env, payload[0], None)
        return method is not None and not inspect.iscoroutinefunction(method)
    return False


def drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends to completion, without an event loop.

    Raises:
        RuntimeError: the coroutine did suspend (it was wrongly judged inline).
    """
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError(
        "an env operation judged synchronous awaited something; declare the env's methods "
        "`async def` (or set `blocking = True`) so the pool schedules it as a task"
    )
