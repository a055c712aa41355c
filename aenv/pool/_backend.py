"""The interface between :class:`~aenv.pool.AsyncEnvPool` and the places its envs live.

A backend hosts the sub-envs of one pool and runs *operations* on them; the pool never
imports a concrete backend: it looks one up by name in :data:`BACKENDS` (``"module:Class"``
strings, imported on first use), so a backend with an optional dependency costs nothing
until it is asked for, and a new one plugs in by adding one line here.

The contract, in full. Required: :meth:`~Backend.start`, :meth:`~Backend.submit`,
:meth:`~Backend.replace`, :meth:`~Backend.aclose`; with defaults: :meth:`~Backend.cancel`,
:meth:`~Backend.settle`, :meth:`~Backend.abort`, :meth:`~Backend.getattr_sync` (in-process
backends only). A backend
that implements just these (the thread backend) gets every pool feature: whole-batch,
streamed and per-env calls, fault policies, timeouts and cancellation all go through
``submit`` and the pool's tickets. The rest is optional speed: ``run_batch`` (one message per
worker for a whole-batch call) and the stacked family (a whole batch's inputs and results in
preallocated rows), and ``stream_rows`` (streamed steps read their inputs from rows of the
pool's buffers, for backends whose envs read them in the pool's loop); failures on those
paths go through the same fault policy as a ticket's, whatever the policy.

``start(env_fns) -> list[EnvMetaData]``
    Called once, synchronously, by the pool's constructor. Builds env ``i`` by calling
    ``env_fns[i]()`` *where it will live* (inline, in its own thread, in a worker process,
    in a Ray actor) and returns one :class:`~aenv.envs.EnvMetaData` per env (specs, batch
    size, device). It may block while the envs are built. No event loop is needed yet.

``submit(env_index, op, payload) -> None``
    Non-blocking; called from the pool's event loop thread. Starts one operation on one
    env. The pool guarantees at most one operation in flight per env. Operations and their
    payloads / results are those of :func:`aenv.pool._ops.execute`:

    ==========================  ===============================  ============================
    op                          payload                          result
    ==========================  ===============================  ============================
    ``"step"``                  input TensorDict                 the ``"next"`` TensorDict
    ``"reset"``                 ``(TensorDict | None, kwargs)``  the reset TensorDict
    ``"step_and_maybe_reset"``  input TensorDict                 ``(next, reset | None)``
    ``"seed"``                  ``(seed, static_seed)``          the next seed
    ``"call"``                  ``(name, args, kwargs)``         the method's (awaited) return
    ``"getattr"``               attribute name                   the attribute's value
    ==========================  ===============================  ============================

    The outcome is handed back by calling ``deliver(env_index, outcome)`` **on the pool's
    event loop thread**: directly when the backend runs there (it may even do so before
    ``submit`` returns), through ``loop.call_soon_threadsafe`` from a thread, or from a
    reader callback on a pipe fd (``loop.add_reader``) for processes. Never by polling.
    ``outcome`` is the result, or a :class:`Failure` (the exception and its formatted
    traceback) when the operation raised. A backend delivers exactly one outcome per
    submitted operation, except for operations given up by :meth:`Backend.replace`.

``replace(env_index) -> None``
    Non-blocking. Gives up env ``env_index``: any operation in flight on it is cancelled
    where the backend can (coroutine: task cancelled; thread: its thread is abandoned;
    process: the worker is told or killed) and its outcome is never delivered; the env is
    closed in the background and a fresh one is built from the same factory. The next
    ``submit`` for that index goes to the fresh env (which has not been reset). Used for
    step timeouts and the ``on_error="restart"`` policy.

``cancel(env_index) -> bool``
    Best effort, non-blocking: cancel the operation in flight on ``env_index`` because its
    caller was cancelled. Returns True when it was stopped at once (no outcome will come),
    False when an outcome will still be delivered (the pool then drops it).

``async settle(indices)`` (default: nothing to wait for)
    Waits until the operations cancelled on these envs have unwound, so that a cancelled
    call returns after its envs' cleanup ran (the coroutine backend awaits the cancelled
    tasks). The pool shields it and bounds it by ``close_timeout``.

``getattr_sync(env_index, name)`` (backends whose envs live in this process)
    Reads an attribute of a sub-env synchronously, with no I/O (in the env's own thread
    where it has one and is idle); used by the pool's attribute fan-out
    (``pool.some_attr``). Envs elsewhere are read with the ``"getattr"`` operation, awaited
    concurrently for all envs (``await pool.get_attr(name)``): a read never blocks the
    pool's loop on a busy or stuck env.

``abort()``
    Synchronous, non-blocking shutdown for a pool whose constructor failed after ``start``.

``async aclose(grace)``
    Closes every env and leaves no task, thread or process behind (waiting at most
    ``grace`` seconds for work that ignores cancellation).

``async run_batch(op, indices, payloads, step_timeout)`` (optional)
    A fast path for whole-batch calls by backends that can do better than one
    ``submit`` per env (the process backend: one command and one reply per worker).
    Returns one outcome per index, in order. Backends without one leave
    ``has_run_batch = False``.

``async run_stacked(op, tensordict, step_timeout, indices=None)`` (optional, ``has_run_stacked``)
    A faster path still for a whole-batch ``"step"`` or ``"step_and_maybe_reset"`` on
    every env, or on the envs ``indices`` only (a step with a ``"_step"`` mask): the inputs
    are the pool's stacked ``tensordict`` (no per-env split) and the results come back
    stacked (:class:`Stacked`, full-size: the rows of envs not in ``indices`` hold
    whatever they held, and their reset flags are False). Returns None, having started
    nothing, when it cannot take this call (the pool then splits the batch); a list of
    per-env outcomes (as :meth:`run_batch`'s, one per index) when some env failed or its
    result did not come back stacked. It is made of five steps a caller may interleave to
    overlap consecutive steps: ``stage_stacked(tensordict, bank) -> bool`` writes the
    inputs into one of two banks (False: nothing written, split the batch),
    ``launch_stacked(op, bank, step_timeout, indices=None)`` starts the work on that
    bank's inputs (a call handle, or None: nothing started), ``async wait_stacked(call)`` waits for it (None when the results are all in
    the bank, else per-env outcomes), ``read_stacked(call)`` reads them (before the bank is
    launched again), ``abandon_stacked(call)`` gives up a call nobody will wait for.
    ``chain_stacked(after, op, bank, step_timeout)`` is ``launch_stacked`` done by the
    backend itself the moment the call ``after`` has come back whole (``call.sent`` then
    says whether it was), so the next step does not wait for the caller to resume.
    ``overlaps_steps`` says the envs live in other processes (nothing the pool's process
    does can change what they do) and ``stacks_all`` that this pool's envs can be staged.
"""

from __future__ import annotations

import abc
import importlib
import traceback
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from tensordict import TensorDictBase

from aenv.envs._common import EnvBase
from aenv.envs._utils import EnvMetaData
from aenv.exceptions import BackendUnavailableError

__all__ = [
    "BACKENDS",
    "RESERVED_BACKENDS",
    "Backend",
    "Deliver",
    "Failure",
    "Stacked",
    "backend_class",
    "normalize_backend_name",
]

#: Backends by name: ``"module:Class"``, imported lazily.
BACKENDS: dict[str, str] = {
    "coroutine": "aenv.pool._coroutine:CoroutineBackend",
    "thread": "aenv.pool._thread:ThreadBackend",
    "process": "aenv.pool._process:ProcessBackend",
    "ray": "aenv.pool._ray:RayBackend",
}

#: Names accepted as synonyms (the seeds' spellings).
ALIASES: dict[str, str] = {
    "threading": "thread",
    "asyncio": "coroutine",
    "multiprocessing": "process",
}

#: Names kept for backends still to come, with what to use meanwhile.
RESERVED_BACKENDS: dict[str, str] = {}

Deliver = Callable[[int, Any], None]


class Failure:
    """An operation's exception, with its traceback formatted where it was raised.

    The traceback is kept as text so that it crosses threads and processes intact; the
    pool turns a failure into an :class:`~aenv.exceptions.EnvStepError` (``from`` the
    original exception where it is at hand).
    """

    __slots__ = ("exc", "traceback")

    def __init__(self, exc: BaseException, tb: str | None = None) -> None:
        self.exc = exc
        self.traceback = tb if tb is not None else "".join(traceback.format_exception(exc))

    def __repr__(self) -> str:
        return f"Failure({type(self.exc).__name__}: {self.exc})"


class Stacked:
    """The result of a whole-batch step on every env, stacked along dim 0 by the backend.

    ``next`` holds every env's ``"next"`` content. For ``"step_and_maybe_reset"``,
    ``reset_mask`` (a bool tensor, one flag per env; None when no env was reset) marks the
    envs that were done and reset, and the rows of ``reset`` it marks hold their reset
    results (the other rows are meaningless).
    """

    __slots__ = ("next", "reset", "reset_mask")

    def __init__(
        self,
        nxt: TensorDictBase,
        reset: TensorDictBase | None = None,
        reset_mask: torch.Tensor | None = None,
    ) -> None:
        self.next = nxt
        self.reset = reset
        self.reset_mask = reset_mask


def normalize_backend_name(name: str) -> str:
    """The canonical name of a backend (``"threading"`` -> ``"thread"``)."""
    key = name.lower()
    return ALIASES.get(key, key)


def backend_class(name: str) -> type[Backend]:
    """Import and return the backend class registered under ``name`` (or an alias).

    Raises:
        BackendUnavailableError: the name is reserved for a backend that does not exist
            yet, or its optional dependency is missing.
        ValueError: the name is unknown.
    """
    key = normalize_backend_name(name)
    if key in RESERVED_BACKENDS and key not in BACKENDS:
        raise BackendUnavailableError(f"backend {name!r}: {RESERVED_BACKENDS[key]}")
    try:
        target = BACKENDS[key]
    except KeyError:
        known = sorted({*BACKENDS, *ALIASES, *RESERVED_BACKENDS})
        raise ValueError(f"unknown pool backend {name!r}; known names: {known}") from None
    module_name, _, cls_name = target.partition(":")
    module = importlib.import_module(module_name)
    cls: type[Backend] = getattr(module, cls_name)
    return cls


class Backend(abc.ABC):
    """Hosts a pool's sub-envs and runs operations on them; see the module docstring.

    Args:
        deliver: the pool's completion callback, ``deliver(env_index, outcome)``, to be
            called on the pool's event loop thread.
        **options: backend-specific options (``backend_options=`` of the pool).
    """

    name: ClassVar[str] = ""
    #: True when :meth:`run_batch` is implemented.
    has_run_batch: ClassVar[bool] = False
    #: True when :meth:`run_stacked` is implemented.
    has_run_stacked: ClassVar[bool] = False
    #: True when the envs live in other processes (nothing the pool's process does, such as
    #: drawing random actions, can change what they do).
    overlaps_steps: ClassVar[bool] = False
    #: True when a streamed step's envs may be handed their rows of the pool's input
    #: buffers (:mod:`aenv.pool._stream_rows`): the envs read them in the pool's loop,
    #: before the next send can write them.
    stream_rows: ClassVar[bool] = False

    @property
    def stacks_all(self) -> bool:
        """Whether :meth:`stage_stacked` can take a whole batch of this pool's envs."""
        return False

    def __init__(self, deliver: Deliver, **options: Any) -> None:
        if options:
            raise TypeError(f"{type(self).__name__} takes no options, got {sorted(options)}")
        self._deliver = deliver
        self.env_fns: list[Callable[[], EnvBase]] = []

    @abc.abstractmethod
    def start(self, env_fns: Sequence[Callable[[], EnvBase]]) -> list[EnvMetaData]:
        """Build the envs where they will live; return their metadata."""

    @abc.abstractmethod
    def submit(self, env_index: int, op: str, payload: Any) -> None:
        """Start one operation on one env; its outcome goes to ``deliver``."""

    @abc.abstractmethod
    def replace(self, env_index: int) -> None:
        """Give up env ``env_index`` and build a fresh one from its factory."""

    def cancel(self, env_index: int) -> bool:
        """Best-effort cancel of the operation in flight; True if no outcome will come."""
        return False

    async def settle(self, indices: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """Wait until operations cancelled on these envs have unwound (their cleanup run);
        the pool calls it, shielded and bounded, before a cancelled call returns."""

    def getattr_sync(self, env_index: int, name: str) -> Any:
        """Read attribute ``name`` of env ``env_index`` synchronously, with no I/O (only
        backends whose envs live in this process)."""
        raise NotImplementedError(f"the {self.name!r} backend's envs are read with 'getattr'")

    def abort(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Synchronous, best-effort shutdown after :meth:`start` succeeded but the pool's
        construction failed (no loop may be running); must not block."""

    @abc.abstractmethod
    async def aclose(self, grace: float = 5.0) -> None:
        """Close every env; leave no task, thread or process behind."""

    async def run_batch(
        self, op: str, indices: Sequence[int], payloads: Sequence[Any], step_timeout: float | None
    ) -> list[Any]:
        """Optional whole-batch fast path; see the module docstring."""
        raise NotImplementedError

    async def run_stacked(
        self,
        op: str,
        tensordict: TensorDictBase,
        step_timeout: float | None,
        indices: Sequence[int] | None = None,
    ) -> Stacked | list[Any] | None:
        """A stacked whole-batch ``op`` on every env or on ``indices`` (see the module
        docstring): stage the inputs in bank 0, launch, wait, read."""
        if not self.has_run_stacked or not self.stage_stacked(tensordict, 0):
            return None
        call = self.launch_stacked(op, 0, step_timeout, indices)
        if call is None:
            return None
        outcomes = await self.wait_stacked(call)
        if outcomes is not None:
            return outcomes if indices is None else [outcomes[i] for i in indices]
        try:
            return self.read_stacked(call)
        except Exception as exc:
            return [Failure(exc)] * (len(self.env_fns) if indices is None else len(indices))

    def stage_stacked(self, tensordict: TensorDictBase, bank: int = 0) -> bool:
        """Write a whole batch's stacked inputs into ``bank``; see the module docstring."""
        return False

    def launch_stacked(
        self,
        op: str,
        bank: int,
        step_timeout: float | None,
        indices: Sequence[int] | None = None,
    ) -> Any:
        """Start ``op`` on every env (or on ``indices``) from ``bank``'s inputs; see the
        module docstring."""
        return None

    def chain_stacked(self, after: Any, op: str, bank: int, step_timeout: float | None) -> Any:
        """``launch_stacked`` once the call ``after`` came back whole; see the module
        docstring."""
        raise NotImplementedError

    async def wait_stacked(self, call: Any) -> list[Any] | None:
        """Wait for a launched call; see the module docstring."""
        raise NotImplementedError

    def read_stacked(self, call: Any) -> Stacked:
        """The stacked results of a call that came back whole; see the module docstring."""
        raise NotImplementedError

    def abandon_stacked(self, call: Any) -> None:
        """Give up a launched call; see the module docstring."""
        raise NotImplementedError
