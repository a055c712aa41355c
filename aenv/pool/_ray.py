"""The Ray backend: sub-envs live in Ray actors, several per actor, on any Ray cluster.

Each actor (an async actor of :class:`~aenv.pool._ray_actor.RayActor`, which holds an
:class:`~aenv.pool._ray_actor.EnvActor`) builds its envs from
their pickled factories and runs the pool's operations on them with the same
:func:`~aenv.pool._ops.execute` as every other backend, concurrently on its event loop.

The steps travel on a socket from the driver to each actor (``transport="socket"``, the
default; :mod:`aenv.pool._ray_wire`: a Unix socket to an actor on the driver's host, TCP to
others): a Ray actor call costs ~10x a framed message on a socket here, so Ray places,
starts, watches and kills the actors and carries no step.
``transport="ray"`` sends the same messages as Ray actor calls instead, for a driver that
cannot reach the actors' nodes.

Whole-batch steps (``step``, ``step_and_maybe_reset`` and the rollout over the pool, masked
ones too) take the contract's stacked path (:mod:`aenv.pool._ray_stacked`): one message per
actor carrying the stacked input (packed once for all actors), the actor's envs stepping
into its own preallocated rows (:class:`~aenv.pool._rows.Rows`, through the coroutine
backend, as an in-process pool steps them), the stacked rows back as numpy arrays' bytes,
copied into the driver's own preallocated rows (one set per bank, handed out as a process
pool hands out its shared rows: the consumer copies what it keeps).

Everything else (streaming, per-env calls, resets, the envs of a whole batch that are not
free for the stacked path) goes per operation: the operations submitted in one turn of the
pool's loop go to each actor as one message (``exchange``); on the socket the actor pushes
the results that finish in one turn of its own loop as one message, as they finish; with
Ray calls it answers each call with the results finished by then, at least one, and an
empty ``exchange`` is held open on an actor with results to come and no call in flight.
Either way the pool's loop is woken by the socket's fd or a Ray future's callback
(``call_soon_threadsafe``): nothing polls. Tensors travel as numpy arrays in one pickle
(with Ray calls, big ones out of band, through Ray's shared-memory object store).

Faults. Every actor has a call held open for its life (``watch``): when the actor's
process dies, that call (and its socket, or the ``exchange`` calls in flight) fail at once,
the pending operations as :class:`~aenv.exceptions.WorkerCrashedError`, and a new actor is
started with fresh envs; until an env of the dead actor is reset, its steps fail with the same error (it
was lost, as the process backend's envs of a dead worker are). A replaced env (step
timeout, ``on_error="restart"``) is rebuilt inside its actor; an actor that does not answer
within ``replace_timeout`` (an env blocking its event loop) is killed and started again.
An exception in an env comes back as the exception and its formatted traceback.

Closing kills every actor the pool made, after letting each close its envs, and waits until
Ray reports them dead; see :mod:`aenv.pool._ray_cluster` for the cluster itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import secrets
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aenv.envs._common import EnvBase
from aenv.envs._utils import EnvMetaData
from aenv.exceptions import WorkerCrashedError
from aenv.pool._backend import Backend, Failure
from aenv.pool._ray_actor import Item, RayActor
from aenv.pool._ray_cluster import connect, import_ray, kill_actors, release
from aenv.pool._ray_codec import FlatRows, pack, unpack
from aenv.pool._ray_faults import RayFaults, _first_line, _Group, _ignore
from aenv.pool._ray_stacked import RayStacked
from aenv.pool._ray_wire import DriverWire

__all__ = ["RayBackend"]

#: operations a lost env (fresh, in a restarted actor) may take before its reset
_DIRECT_OPS = frozenset(("reset", "seed", "getattr", "call"))

#: the default CPU reservation of an actor: a fraction, so that a small cluster hosts several
#: (an actor without one needs a whole free CPU to be scheduled, then holds none)
DEFAULT_NUM_CPUS = 0.25


class RayBackend(RayStacked, RayFaults, DriverWire, Backend):
    """Runs sub-envs in Ray actors (see the module docstring).

    Options (``backend_options=`` of the pool):
        address: the cluster: None (default) uses the one this process is connected to,
            else attaches to ``RAY_ADDRESS`` when set, else starts a local one; ``"auto"``,
            ``"host:port"`` or ``"ray://..."`` attach to a running cluster; ``"local"``
            starts a new local one. A log line (logger ``aenv.pool.ray``) says which.
        init_options: keyword arguments for ``ray.init`` when the pool connects (e.g.
            ``{"num_cpus": 4}`` for a local cluster).
        num_actors: number of actors (default ``min(num_envs, cluster CPUs)``).
        envs_per_actor: envs per actor, instead of ``num_actors``.
        num_cpus: CPUs each actor reserves (default 0.25: envs that wait on I/O or timers
            need little; give 1 for envs that compute).
        num_gpus, resources, runtime_env: passed to the actors' ``.options``.
        actor_options: any other actor option (``scheduling_strategy``, ``name``...).
        forward_sys_path: append this process's ``sys.path`` to the actors' (default True),
            so that factories from modules of the driver's project (not installed) import
            there as they do in the process backend's workers.
        restart_actors: start a new actor when one dies (default True).
        replace_timeout: seconds an actor has to answer when one of its envs is given up
            (step timeout, restart) before it is killed and started again (default 2).
        start_timeout: seconds to wait for the actors to start (default 300): actors the
            cluster cannot place (not enough CPUs, GPUs or resources) fail the pool then.
        nice: the actors' nice value (default: this process's; None keeps Ray's, 15,
            at which a busy machine's other processes take nearly all the CPU from them);
            lowering it needs privileges, else Ray's stays.
        transport: how the steps travel: ``"socket"`` (default), a connection from this
            process to each actor (:mod:`aenv.pool._ray_wire`: Unix on the driver's host,
            else TCP; the driver must reach the actors' nodes); ``"ray"``, Ray actor calls (~10x the per-call cost,
            for a driver outside the cluster's network, e.g. a ``ray://`` client).
    """

    name = "ray"

    def __init__(
        self,
        deliver: Any,
        *,
        address: str | None = None,
        init_options: Mapping[str, Any] | None = None,
        num_actors: int | None = None,
        envs_per_actor: int | None = None,
        num_cpus: float = DEFAULT_NUM_CPUS,
        num_gpus: float | None = None,
        resources: Mapping[str, float] | None = None,
        runtime_env: Mapping[str, Any] | None = None,
        actor_options: Mapping[str, Any] | None = None,
        forward_sys_path: bool = True,
        restart_actors: bool = True,
        replace_timeout: float = 2.0,
        start_timeout: float = 300.0,
        transport: str = "socket",
        nice: int | str | None = "driver",
    ) -> None:
        super().__init__(deliver)
        if transport not in ("socket", "ray"):
            raise ValueError(f"transport must be 'socket' or 'ray', got {transport!r}")
        self._ray = import_ray()
        if num_actors is not None and envs_per_actor is not None:
            raise ValueError("pass num_actors or envs_per_actor, not both")
        for name, value in (("num_actors", num_actors), ("envs_per_actor", envs_per_actor)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.address = address
        self.init_options = dict(init_options or {})
        self.num_actors = num_actors
        self.envs_per_actor = envs_per_actor
        options: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": 0}
        passed: dict[str, Any] = {
            "num_gpus": num_gpus,
            "resources": dict(resources) if resources else None,
            "runtime_env": dict(runtime_env) if runtime_env else None,
        }
        options.update({k: v for k, v in passed.items() if v is not None})
        options.update(actor_options or {})
        self.actor_options = options
        self.forward_sys_path = forward_sys_path
        self.restart_actors = restart_actors
        self.replace_timeout = replace_timeout
        self.start_timeout = start_timeout
        self.transport = transport
        self.nice = os.getpriority(os.PRIO_PROCESS, 0) if nice == "driver" else nice
        self._token = secrets.token_bytes(16) if transport == "socket" else None
        self._groups: list[_Group] = []
        self._group_of: list[_Group] = []
        self._pending: list[int | None] = []
        self._lost: list[str | None] = []
        self._held: dict[int, tuple[str, Any]] = {}
        self._replacing: dict[int, tuple[int, asyncio.TimerHandle | None]] = {}
        self._kill_reasons: dict[tuple[int, int], str] = {}
        # whole-batch answers' rows, by (bank, "next" | "reset"): see RayStacked._land
        self._landing: dict[tuple[int, str], FlatRows] = {}
        self._seq = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._flushing = False
        self._connected = False
        self._actor_cls: Any = None
        self._sys_path: list[str] = []
        # actors still alive (killed at garbage collection if the pool was never closed)
        self._handles: list[Any] = []
        self._finalizer = weakref.finalize(self, kill_actors, self._ray, self._handles)

    # ------------------------------------------------------------------ start
    def start(self, env_fns: Sequence[Callable[[], EnvBase]]) -> list[EnvMetaData]:
        import cloudpickle

        self.env_fns = list(env_fns)
        n = len(self.env_fns)
        self._connected = connect(self.address, self.init_options)
        try:
            ray = self._ray
            self._actor_cls = ray.remote(RayActor)
            if self.forward_sys_path:
                self._sys_path = [os.path.abspath(p or os.curdir) for p in sys.path]
            if self.envs_per_actor is not None:
                per = self.envs_per_actor
            else:
                cpus = int(ray.cluster_resources().get("CPU", 1))
                actors = self.num_actors or min(n, max(1, cpus))
                per = -(-n // min(actors, n))
            for gid, k in enumerate(range(0, n, per)):
                indices = list(range(k, min(k + per, n)))
                blob = cloudpickle.dumps([self.env_fns[i] for i in indices])
                self._groups.append(_Group(gid, indices, blob))
            self._group_of = [g for g in self._groups for _ in g.indices]
            self._pending = [None] * n
            self._lost = [None] * n
            for g in self._groups:
                self._spawn(g, want_meta=True)
            return self._await_start(ray)
        except BaseException:
            self.abort()
            raise

    def _await_start(self, ray: Any) -> list[EnvMetaData]:
        refs = [g.actor.ready.remote() for g in self._groups]
        _, waiting = ray.wait(refs, num_returns=len(refs), timeout=self.start_timeout)
        if waiting:
            raise TimeoutError(
                f"{len(waiting)} of {len(refs)} Ray actor(s) did not start within "
                f"{self.start_timeout} s (each asks for {self._resources_asked()}; the "
                f"cluster has {ray.available_resources()} free): give the cluster more "
                "resources, or ask less (num_cpus=, num_gpus=, resources=)"
            )
        metas: dict[int, EnvMetaData] = {}
        for g, ref in zip(self._groups, refs):
            try:
                pid, group_metas, broken, address = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                raise WorkerCrashedError(
                    f"the Ray actor for envs {g.indices} died while starting: {_first_line(exc)}"
                ) from exc
            if broken:
                failure = next(iter(broken.values()))
                raise failure.exc
            self._dial(g, address)
            g.pid, g.state = pid, "ready"
            metas.update(group_metas)
        return [metas[i] for i in range(len(self.env_fns))]

    def _resources_asked(self) -> str:
        keys = ("num_cpus", "num_gpus", "resources")
        return ", ".join(f"{k}={self.actor_options[k]}" for k in keys if k in self.actor_options)

    def _spawn(self, g: _Group, *, want_meta: bool) -> None:
        g.gen += 1
        g.state, g.pid = "starting", None
        g.calls, g.quiet = 0, False
        g.actor = self._actor_cls.options(**self.actor_options).remote(
            g.blob, g.indices, self._sys_path, want_meta, self._token, self.nice
        )
        self._handles.append(g.actor)
        g.watch = g.actor.watch.remote().future()
        if self._loop is not None:
            self._watch(g)

    def _watch(self, g: _Group) -> None:
        assert g.watch is not None
        g.watch.add_done_callback(self._hop(self._on_watch, g, g.gen))

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            for g in self._groups:
                if g.watch is not None:
                    self._watch(g)
                self._watch_wire(g)
        return loop

    def _hop(self, fn: Callable[..., None], *args: Any) -> Callable[[Any], None]:
        """A done-callback for a Ray future (run in a Ray thread) that calls
        ``fn(*args, future)`` on the pool's loop."""
        loop = self._loop
        assert loop is not None
        return functools.partial(_call_on, loop, fn, *args)

    @property
    def actor_pids(self) -> list[int | None]:
        """Process ids of the actors (None for one still starting)."""
        return [g.pid for g in self._groups]

    # ------------------------------------------------------------------ operations
    def submit(self, env_index: int, op: str, payload: Any) -> None:
        self._bind()
        g = self._group_of[env_index]
        if g.failure is not None:
            self._deliver(env_index, g.failure)
            return
        lost = self._lost[env_index]
        if lost is not None:
            if op not in _DIRECT_OPS:
                err = WorkerCrashedError(
                    f"env {env_index} was lost: {lost}; it was rebuilt and needs a reset",
                    env_index=env_index,
                )
                self._deliver(env_index, Failure(err, ""))
                return
            if op == "reset":
                self._lost[env_index] = None
        if env_index in self._replacing:
            self._held[env_index] = (op, payload)  # sent once the actor has replaced it
            return
        self._send(env_index, op, payload)

    def _send(self, i: int, op: str, payload: Any) -> None:
        g = self._group_of[i]
        seq = next(self._seq)
        self._pending[i] = seq
        g.outbox.append((i, seq, op, pack(payload)))
        self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._flushing:
            self._flushing = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Send each actor the operations submitted to it in this loop turn, in one
        ``exchange`` call; hold an empty one open on an actor with results to come and no
        call in flight (see :mod:`aenv.pool._ray_actor`)."""
        self._flushing = False
        if self._closing:
            return
        socket = self._token is not None
        for g in self._groups:
            if g.outbox:
                if socket and g.chan is None:
                    continue  # the actor is starting: sent once its channel is up
                items, g.outbox = g.outbox, []
                try:
                    self._exchange(g, items)
                except Exception:  # Ray could not take an input (not serialisable)
                    for item in items:  # one at a time: only that env's operation fails
                        self._exchange_one(g, item)
            elif socket:
                continue  # (the actor pushes its results as they finish)
            elif not g.calls and not g.quiet and g.state in ("starting", "ready"):
                pending = self._pending
                if any(pending[i] is not None for i in g.indices):
                    self._exchange(g, [])

    def _exchange(self, g: _Group, items: list[Item]) -> None:
        if self._token is not None:
            # (a closed channel: the actor died; its death fails these operations)
            self._wire_send(g, ("x", items))
            return
        ref = g.actor.exchange.remote(items)
        g.calls += 1
        g.quiet = False
        ref.future().add_done_callback(self._hop(self._on_exchange, g, g.gen, items))

    def _exchange_one(self, g: _Group, item: Item) -> None:
        try:
            self._exchange(g, [item])
        except Exception as exc:
            i, seq = item[0], item[1]
            if self._pending[i] == seq:
                self._pending[i] = None
                self._deliver(i, Failure(exc))

    def _on_exchange(self, g: _Group, gen: int, items: list[Item], future: Any) -> None:
        if g.gen != gen:
            return  # an earlier actor's call: its operations were failed when it went
        g.calls -= 1
        try:
            answer = future.result()
        except self._ray.exceptions.RayActorError as exc:
            self._actor_died(g, gen, exc)
            return
        except Exception as exc:  # Ray could not run the call (e.g. an input's unpickling)
            for i, seq, *_ in items:
                if self._pending[i] == seq:
                    self._pending[i] = None
                    self._deliver(i, Failure(exc, str(exc)))
            answer = []
        if not answer and not items:
            g.quiet = True
        self._on_answer(g, answer)
        if not self._flushing and not self._closing:
            # after the receivers woken by these results ran: their next submissions, or
            # else an empty call to hold open for the results still to come
            self._flush_soon()

    def _on_answer(self, g: _Group, answer: list[tuple[int, int, Any]]) -> None:
        """Deliver the results an actor answered (those not given up meanwhile)."""
        pending = self._pending
        for i, seq, packed in answer:
            if pending[i] != seq:
                continue  # given up
            pending[i] = None
            if type(packed) is str:  # (STALE: never for the current operation)
                outcome = Failure(RuntimeError(f"env {i}: the Ray actor dropped op {seq}"))
            else:
                try:
                    outcome = unpack(packed)
                except Exception as exc:
                    outcome = Failure(exc)
            self._deliver(i, outcome)

    def cancel(self, env_index: int) -> bool:
        seq = self._pending[env_index]
        self._held.pop(env_index, None)
        if seq is None:
            return True
        self._pending[env_index] = None
        g = self._group_of[env_index]
        for pos, item in enumerate(g.outbox):
            if item[0] == env_index:  # not sent yet: it never will be
                del g.outbox[pos]
                return True
        if g.failure is None and g.state != "closed":
            self._cancel_on(g, env_index, seq)
        return True

    def _cancel_on(self, g: _Group, i: int, seq: int) -> None:
        """Tell ``g``'s actor to give up operation ``seq`` on env ``i``."""
        if self._token is None:
            _ignore(g.actor.cancel.remote(i, seq))
        else:
            self._wire_send(g, ("c", i, seq))

    # ------------------------------------------------------------------ attributes
    def getattr_sync(self, env_index: int, name: str) -> Any:
        """Blocks on a round trip to the actor (the pool reads its attributes with the
        awaited ``get_attr`` instead)."""
        g = self._group_of[env_index]
        if g.failure is not None:
            raise g.failure.exc
        outcome = self._ray.get(g.actor.attr.remote(env_index, name))
        if isinstance(outcome, Failure):
            raise outcome.exc
        return outcome

    # ------------------------------------------------------------------ closing
    def abort(self) -> None:
        self._closing = True
        kill_actors(self._ray, self._handles)
        for g in self._groups:
            self._drop_wire(g, ConnectionError("the pool was closed"))
        self._finalizer.detach()
        if self._connected:
            self._connected = False
            release()

    async def aclose(self, grace: float = 5.0) -> None:
        self._closing = True
        for _, timer in self._replacing.values():
            if timer is not None:
                timer.cancel()
        self._replacing.clear()
        live = [g for g in self._groups if g.state in ("starting", "ready")]
        if not self._ray.is_initialized():
            live = []  # disconnected (ray.shutdown()): the actors are gone with it
        closes = [asyncio.wrap_future(g.actor.close.remote().future()) for g in live]
        if closes:
            await asyncio.wait(closes, timeout=grace)
        # dead once their held ``watch`` call fails: what Ray's state shows from then on
        watches = [asyncio.wrap_future(g.watch) for g in live if g.watch is not None]
        kill_actors(self._ray, self._handles)
        self._finalizer.detach()
        if watches:
            await asyncio.wait(watches, timeout=grace)
            for watch in watches:  # each failed (the actor is dead): that is all it says
                if watch.done():
                    watch.exception()
        for g in self._groups:
            g.state = "closed"
            self._drop_wire(g, ConnectionError("the pool was closed"))
        if self._connected:
            self._connected = False
            release()
        for close in closes:
            if close.done() and not close.cancelled() and close.exception() is None:
                failures = close.result()
                if failures:
                    raise failures[0].exc


def _call_on(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
        loop.call_soon_threadsafe(fn, *args)
