"""The interface between :class:`~aenv.pool.AsyncEnvPool` and the places its envs live.

A backend hosts the sub-envs of one pool and runs *operations* on them; the pool never
imports a concrete backend: it looks one up by name in :data:`BACKENDS` (``"module:Class"``
strings, imported on first use), so a backend with an optional dependency costs nothing
until it is asked for, and a new one plugs in by adding one line here.

The contract, in full: eight methods and one whole-batch operation. Required:
:meth:`~Backend.start`, :meth:`~Backend.submit`, :meth:`~Backend.replace`,
:meth:`~Backend.aclose`; with defaults: :meth:`~Backend.cancel`, :meth:`~Backend.settle`,
:meth:`~Backend.abort`, :meth:`~Backend.getattr_sync` (in-process backends only) and
:meth:`~Backend.launch` (the whole-batch operation; by default it takes nothing). A backend
that implements just the required ones (the thread backend) gets every pool feature:
whole-batch, streamed and per-env calls, fault policies, timeouts and cancellation all go
through ``submit`` and the pool's tickets. ``launch`` runs a whole batch as one operation
(its results in preallocated rows where they fit); the pool applies ``on_error``,
``step_timeout``, ``max_concurrency`` (in waves of at most that many envs) and cancellation
to it as to tickets, on every backend. Two flags: ``overlaps_steps`` and ``stream_rows``,
and one hook for backends whose envs read rows shared with the pool's process:
:meth:`~Backend.shared_stream_rows`.

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

``launch(op, inputs, step_timeout, indices=None, *, bank=0, after=None) -> BatchCall | None``
    Non-blocking; the one whole-batch operation: ``op`` on every env, or on the envs
    ``indices`` (in that order), started at once and awaited with :meth:`BatchCall.wait`.
    ``inputs`` is the pool's stacked input (a ``"step"`` or ``"step_and_maybe_reset"``:
    the backend copies it into its input rows, each env steps from its row into its output
    rows and, when asked, resets into its reset rows if the step ended its episode) or a
    list of per-env payloads, one per env, as :meth:`submit` takes them (any op: what
    cannot be planned into rows travels this way, pickled across processes). Returns None,
    having started nothing, when it cannot take the call (the pool then uses tickets).
    ``wait()`` gives a :class:`Stacked` result (full-size: the rows of envs not stepped
    hold whatever they held, their reset flags False) when every env's result is in the
    rows, else one outcome per stepped env (a result, or a :class:`Failure`: an env's
    exception, :class:`~aenv.exceptions.StepTimeoutError` once ``step_timeout`` passed and
    the env was given up and rebuilt, :class:`~aenv.exceptions.WorkerCrashedError`); a
    cancelled ``wait()`` stops the call's work. ``abandon()`` gives up a call nobody
    will wait for. With ``overlaps_steps``, a caller may overlap consecutive steps: inputs
    go to one of the banks of rows (``bank``, :data:`~aenv.pool._shm.BANKS` of them, a
    call chained in the bank after its call's), and ``after=call`` chains the new call to
    ``call`` (itself maybe a chained call not sent yet): the backend sends it the moment
    ``call`` came back whole (before its caller resumes), else never (``sent`` says which,
    once ``call`` was waited for); ``abandon()`` gives up the calls chained after a call
    with it.

``overlaps_steps``
    True when ``launch`` chains (``after=``): the envs live in other processes, so nothing
    the pool's process does in between (drawing random actions) changes what they do.

``stager(rows) -> Callable[[int, int], None] | None``
    For a chaining backend: a function ``stage(bank, t)`` writing row ``t`` of ``rows``
    (key -> ``(T, *batch, ...)``: a rollout's random actions, every input leaf a step does
    not carry over from the step before) into ``bank``'s input rows, planned once per
    rollout; a chained ``launch(op, None, ..., bank=bank, after=call)`` then sends what
    was staged, the carried leaves taken from ``call``'s results. None where the rows do
    not fit (the caller stages a TensorDict per step).

``stream_rows``
    True when a streamed step's envs may be handed their rows of the pool's input buffers
    (:mod:`aenv.pool._stream_rows`): the envs read them in the pool's loop.
"""

from __future__ import annotations

import abc
import importlib
import traceback
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from tensordict import TensorDictBase

from aenv._mdp_tree import fast_clone
from aenv.envs._common import EnvBase
from aenv.envs._utils import EnvMetaData
from aenv.exceptions import BackendUnavailableError

__all__ = [
    "BACKENDS",
    "RESERVED_BACKENDS",
    "Backend",
    "BatchCall",
    "Deliver",
    "Done",
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

    ``owned`` False: ``next`` and ``reset`` are the backend's own rows, valid until its next
    call writes them; a consumer that keeps them, hands them out or writes to them takes
    copies (:meth:`own`), one that copies them somewhere (a rollout's time rows, a merge)
    reads them as they are. A result is copied once, by whoever needs the copy.
    """

    __slots__ = ("copy", "next", "owned", "reset", "reset_mask")

    def __init__(
        self,
        nxt: TensorDictBase,
        reset: TensorDictBase | None = None,
        reset_mask: torch.Tensor | None = None,
        owned: bool = True,
        copy: Callable[[], TensorDictBase] | None = None,
    ) -> None:
        self.next = nxt
        self.reset = reset
        self.reset_mask = reset_mask
        self.owned = owned
        self.copy = copy  # (the rows' own cheaper copy of ``next``, where they have one)

    def own(self) -> Stacked:
        """This result, its TensorDicts made its own (copied once if they were rows)."""
        if not self.owned:
            self.next = self.owned_next()
            if self.reset is not None:
                self.reset = fast_clone(self.reset)
            self.owned = True
        return self

    def owned_next(self) -> TensorDictBase:
        """``next`` as a TensorDict of its own (a copy of the rows when they were rows)."""
        if self.owned:
            return self.next
        return fast_clone(self.next) if self.copy is None else self.copy()

    def outcomes(self, op: str, indices: Sequence[int]) -> list[Any]:
        """The rows of envs ``indices`` as per-env outcomes (a ``"step"``'s ``next``, a
        ``"step_and_maybe_reset"``'s ``(next, reset | None)``)."""
        nxt = self.own().next
        if op != "step_and_maybe_reset":
            return [nxt[i] for i in indices]
        reset, flags = self.reset, self.reset_mask
        if reset is None or flags is None:
            return [(nxt[i], None) for i in indices]
        marked = flags.tolist()
        return [(nxt[i], reset[i] if marked[i] else None) for i in indices]


class BatchCall:
    """A whole-batch operation in flight (:meth:`Backend.launch`; see the module docstring)."""

    #: False for a chained call that was not sent (the call before did not come back whole)
    sent: bool = True

    async def wait(self) -> Stacked | list[Any]:
        """Wait for every env's result: stacked, or one outcome per stepped env."""
        raise NotImplementedError

    def abandon(self) -> None:
        """Give up a call nobody will wait for (its envs' work stopped where it can be)."""


class Done(BatchCall):
    """A call whose work ran inline in :meth:`Backend.launch`: ``wait()`` gives its result."""

    __slots__ = ("result",)

    def __init__(self, result: Stacked | list[Any]) -> None:
        self.result = result

    async def wait(self) -> Stacked | list[Any]:
        return self.result


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
    #: True when a streamed step's envs may be handed their rows of the pool's input
    #: buffers (:mod:`aenv.pool._stream_rows`).
    stream_rows: ClassVar[bool] = False

    @property
    def overlaps_steps(self) -> bool:
        """Whether :meth:`launch` chains calls (``after=``); see the module docstring."""
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

    def stager(self, rows: dict[str, torch.Tensor]) -> Callable[[int, int], None] | None:
        """Plan the staging of a rollout's random actions (see the module docstring);
        None: not planned."""
        return None

    def shared_stream_rows(self, sub_batch: torch.Size) -> Any:
        """The rows streamed steps go through where the envs live elsewhere and read
        rows shared with this process (the process backend's, see
        :mod:`aenv.pool._process_stream`): a streamed send's inputs are staged there and
        its results held there until received; None by default."""
        return None

    def launch(
        self,
        op: str,
        inputs: TensorDictBase | Sequence[Any],
        step_timeout: float | None,
        indices: Sequence[int] | None = None,
        *,
        bank: int = 0,
        after: BatchCall | None = None,
    ) -> BatchCall | None:
        """Start ``op`` on a whole batch (every env, or ``indices``); None: not taken,
        nothing started. See the module docstring."""
        return None
