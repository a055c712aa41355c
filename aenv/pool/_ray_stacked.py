"""The Ray backend's whole-batch steps (see :mod:`aenv.pool._ray`): one actor call per
actor, the envs stepping into preallocated rows inside the actor.

:meth:`RayStacked.launch` is the backend's whole-batch operation (the contract's
``launch``, see :mod:`aenv.pool._backend`) for a stacked step: the pool's stacked input goes to each actor as its
slice (one packed TensorDict, numpy arrays through Ray's object store), each actor steps
its envs with :meth:`~aenv.pool._ray_actor.EnvActor.stacked` (through the coroutine
backend's rows: the step semantics are EnvBase's) and answers with its stacked rows, and
the slices are joined along the env dim. An actor whose envs cannot all write rows (async
or blocking envs) answers per-env outcomes, still in the one call.

Faults on this path: an env's exception comes back as its outcome (a
:class:`~aenv.pool._backend.Failure` with the actor's traceback); an actor that dies fails
its stepped envs with :class:`~aenv.exceptions.WorkerCrashedError` as soon as Ray reports
the call failed (the actor is then restarted as on the per-env path); an env still working
at ``step_timeout`` is given up and rebuilt by its actor (a
:class:`~aenv.exceptions.StepTimeoutError`), and an actor that has not answered
``replace_timeout`` seconds after that is killed and started again (its envs' steps time
out). :class:`RayStacked` is a mixin of :class:`~aenv.pool._ray.RayBackend`; its only state is
the rows the answers land in (``_landing``, one set per bank).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from aenv.exceptions import StepTimeoutError, WorkerCrashedError
from aenv.pool._backend import BatchCall, Failure, Stacked
from aenv.pool._channel import ChannelClosed
from aenv.pool._ray_actor import TIMED_OUT
from aenv.pool._ray_codec import FlatRows, pack, unpack
from aenv.pool._ray_faults import _first_line, _Group

__all__ = ["RayStacked"]

_OPS = frozenset(("step", "step_and_maybe_reset"))


class RayStacked:
    """Whole-batch steps of :class:`~aenv.pool._ray.RayBackend` (a mixin)."""

    _ray: Any
    _groups: list[_Group]
    _lost: list[str | None]
    _held: dict[int, tuple[str, Any]]
    _replacing: dict[int, tuple[int, asyncio.TimerHandle | None]]
    _kill_reasons: dict[tuple[int, int], str]
    _closing: bool
    replace_timeout: float
    _bind: Callable[[], asyncio.AbstractEventLoop]
    _actor_died: Callable[[_Group, int, BaseException], None]
    _restart: Callable[[_Group, str], None]
    _seq: Any
    _token: bytes | None
    _wire_send: Callable[[_Group, Any], bool]
    _landing: dict[tuple[int, str], FlatRows]
    _cancel_on: Callable[[_Group, int, int], None]

    def _stacks_now(self, indices: Sequence[int] | None) -> bool:
        """Whether a whole-batch step can go to the actors now: every actor up, and no
        stepped env lost (it needs a reset: the per-env path says so) or being replaced."""
        if self._closing or any(g.state != "ready" or g.outbox for g in self._groups):
            return False
        stepping = range(len(self._lost)) if indices is None else indices
        lost, held, replacing = self._lost, self._held, self._replacing
        return not any(lost[i] is not None or i in held or i in replacing for i in stepping)

    def launch(
        self,
        op: str,
        inputs: Any,
        step_timeout: float | None,
        indices: Sequence[int] | None = None,
        *,
        bank: int = 0,
        after: BatchCall | None = None,
    ) -> BatchCall | None:
        """``op`` on every env (or on ``indices``) with one call per actor; see the module
        docstring and :meth:`~aenv.pool._backend.Backend.launch`."""
        if op not in _OPS or not isinstance(inputs, TensorDictBase):
            return None
        if not self._stacks_now(indices):
            return None
        loop = self._bind()
        inputs = inputs.exclude("next", "_step")
        wanted = None if indices is None else set(indices)
        call = _RayCall(self, op, indices, step_timeout, bank)
        packed = pack(inputs)  # (once: each actor takes its rows of it)
        whole = len(self._groups) > 1
        for g in self._groups:
            lo = g.indices[0]
            local = None if wanted is None else [i - lo for i in g.indices if i in wanted]
            stepping = g.indices if local is None else [lo + p for p in local]
            args = (op, packed, local, step_timeout, whole)
            try:
                if self._token is not None:
                    future = self._stack_on_wire(loop, g, args)
                else:
                    ref = g.actor.stacked.remote(*args)
                    call.refs.append(ref)
                    future = asyncio.wrap_future(ref.future())
            except Exception as exc:  # the input cannot be pickled
                call.calls.append((g, g.gen, stepping, Failure(exc)))
                continue
            call.calls.append((g, g.gen, stepping, future))
        return call

    def _stack_on_wire(
        self, loop: asyncio.AbstractEventLoop, g: _Group, args: tuple[Any, ...]
    ) -> asyncio.Future[Any]:
        """Send a whole-batch step to ``g``'s actor on its channel; the future of its
        answer (failed with ChannelClosed if the actor goes first)."""
        cid = next(self._seq)
        future = loop.create_future()
        if not self._wire_send(g, ("s", cid, *args)):
            future.set_exception(ChannelClosed("the actor's channel is closed"))
        else:
            g.stacks[cid] = future
        return future

    def _give_up_stacked(self, calls: list[tuple[_Group, int, list[int], Any]]) -> None:
        """The caller was cancelled: tell the actors to stop the calls' envs."""
        for g, gen, stepping, call in calls:
            if isinstance(call, Failure) or call.done() or g.gen != gen or g.state != "ready":
                continue
            for i in stepping:
                self._cancel_on(g, i, next(self._seq))

    def _join(
        self,
        op: str,
        calls: list[tuple[_Group, int, list[int], Any]],
        indices: Sequence[int] | None,
        step_timeout: float | None,
        bank: int = 0,
    ) -> Stacked | list[Any]:
        """The actors' answers as one stacked result, or per-env outcomes (one per index)
        when some env failed or some actor answered per env."""
        joined = self._land(calls, bank)
        if joined is not None:
            return joined
        parts: list[Any] = []
        for g, gen, stepping, call in calls:
            if isinstance(call, Failure):
                parts.append([call] * len(stepping))
            elif not call.done():
                call.add_done_callback(_retrieve)  # (it fails once the actor is killed)
                parts.append(self._unanswered(g, gen, op, stepping, step_timeout))
            else:
                try:
                    parts.append(unpack(call.result()))
                except (self._ray.exceptions.RayActorError, ChannelClosed) as exc:
                    parts.append(self._died(g, gen, stepping, exc))
                except Exception as exc:  # Ray could not run the call (an input's unpickling)
                    parts.append([Failure(exc, str(exc))] * len(stepping))
        if all(type(p) is tuple and p[0] == "S" for p in parts):
            return _concat(parts)
        outcomes: list[Any] = []
        for (g, _, stepping, _), part in zip(calls, parts):
            outcomes.extend(_per_env(op, part, stepping, g.indices[0]))
        for pos, o in enumerate(outcomes):
            if type(o) is str and o == TIMED_OUT:
                i = indices[pos] if indices is not None else pos
                outcomes[pos] = _timeout(i, op, step_timeout)
        return outcomes

    def _land(self, calls: list[tuple[_Group, int, list[int], Any]], bank: int) -> Stacked | None:
        """The actors' stacked rows copied straight from their flat packed forms into this
        backend's rows for ``bank`` (one copy per leaf and actor, see
        :class:`~aenv.pool._ray_codec.FlatRows`; the rows are planned at the first such
        answer and handed out as the backend's own, ``Stacked.owned`` False), when every
        call answered so; else None (:func:`_concat` or per-env outcomes take them)."""
        bodies = []
        for _, _, _, call in calls:
            if isinstance(call, Failure) or not call.done() or call.cancelled():
                return None
            if call.exception() is not None:
                return None
            packed = call.result()
            body = packed[1]
            if packed[0] != "f" or type(body) is not tuple or body[0] != "S":
                return None
            bodies.append(body)
        sizes = [len(g.indices) for g, _, _, _ in calls]
        nxt = self._land_rows(bank, "next", [b[1] for b in bodies], sizes)
        if nxt is None:
            return None
        if all(b[3] is None for b in bodies):
            return Stacked(nxt, owned=False)
        reset = self._land_rows(bank, "reset", [b[2] for b in bodies], sizes)
        if reset is None:
            return None
        flags: list[bool] = []
        for b, size in zip(bodies, sizes):
            flags.extend(b[3] if b[3] is not None else [False] * size)
        return Stacked(nxt, reset, torch.tensor(flags, dtype=torch.bool), owned=False)

    def _land_rows(
        self, bank: int, kind: str, parts: list[Any], sizes: list[int]
    ) -> TensorDictBase | None:
        """``parts`` written into the rows of ``bank`` and ``kind`` (``"next"`` or ``"reset"``),
        planned (again) where they have none yet or another structure."""
        key = (bank, kind)
        rows = self._landing.get(key)
        got = None if rows is None else rows.land(parts, sizes)
        if got is None:
            rows = FlatRows.plan(parts, sum(sizes))
            if rows is None:
                return None
            got = rows.land(parts, sizes)
            if got is not None:
                self._landing[key] = rows
        return got

    def _unanswered(
        self, g: _Group, gen: int, op: str, stepping: list[int], step_timeout: float | None
    ) -> list[Any]:
        """An actor that did not answer ``replace_timeout`` seconds after the step timeout:
        its event loop is held (a sync env that blocks). It is killed and started again;
        the call's envs time out."""
        reason = (
            f"was killed after a whole-batch step did not come back within {step_timeout} s "
            f"and the actor did not answer {self.replace_timeout} s later"
        )
        if g.gen == gen and g.state == "ready":
            self._kill_reasons[(g.gid, gen)] = reason
            self._restart(g, reason)
            for i in stepping:  # (timed out, not lost: a reset follows the timeout anyway)
                self._lost[i] = None
        return [_timeout(i, op, step_timeout) for i in stepping]

    def _died(self, g: _Group, gen: int, stepping: list[int], exc: BaseException) -> list[Any]:
        """The actor died during the call: its stepped envs fail (the actor is restarted
        or broken as on the per-env path)."""
        self._actor_died(g, gen, exc)
        out: list[Any] = []
        for i in stepping:
            if g.failure is not None:
                out.append(g.failure)
                continue
            lost = self._lost[i] or f"Ray actor {g.gid} died ({_first_line(exc)})"
            err = WorkerCrashedError(f"env {i}: its {lost}", env_index=i)
            out.append(Failure(err, ""))
        return out


class _RayCall(BatchCall):
    """A whole-batch step in flight on the actors (:meth:`RayStacked.launch`)."""

    def __init__(
        self,
        backend: RayStacked,
        op: str,
        indices: Sequence[int] | None,
        timeout: float | None,
        bank: int,
    ) -> None:
        self.backend, self.op, self.indices, self.timeout = backend, op, indices, timeout
        self.bank = bank
        self.calls: list[tuple[_Group, int, list[int], Any]] = []
        self.refs: list[Any] = []  # (held until the answers are in: they own the results)

    async def wait(self) -> Stacked | list[Any]:
        backend, timeout = self.backend, self.timeout
        futures = [c[3] for c in self.calls if not isinstance(c[3], Failure)]
        try:
            if futures:
                deadline = None if timeout is None else timeout + backend.replace_timeout
                await asyncio.wait(futures, timeout=deadline)
        except BaseException:
            self.abandon()
            raise
        out = backend._join(self.op, self.calls, self.indices, timeout, self.bank)
        self.refs = []
        return out

    def abandon(self) -> None:
        for call in self.calls:
            if not isinstance(call[3], Failure):
                call[3].add_done_callback(_retrieve)
        self.backend._give_up_stacked(self.calls)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Take the outcome of a call nobody waits for any more (so asyncio does not report an
    exception as never retrieved)."""
    if not future.cancelled():
        future.exception()


def _timeout(i: int, op: str, step_timeout: float | None) -> Failure:
    err = StepTimeoutError(
        f"env {i}: {op} did not finish within {step_timeout} s; it was abandoned and the env "
        "rebuilt from its factory",
        env_index=i,
    )
    return Failure(err, "")


def _concat(parts: list[tuple[Any, ...]]) -> Stacked:
    """The actors' stacked rows, joined along the env dim."""
    nexts = [p[1] for p in parts]
    nxt: Any = nexts[0] if len(nexts) == 1 else torch.cat(nexts, 0)
    if all(p[3] is None for p in parts):
        return Stacked(nxt)
    present = next(p[2] for p in parts if p[2] is not None)
    resets: list[Any] = []
    flags: list[bool] = []
    for _, part_next, reset, part_flags in parts:
        k = part_next.batch_size[0]
        resets.append(reset if reset is not None else torch.zeros_like(present[:k]))
        flags.extend(part_flags if part_flags is not None else [False] * k)
    reset_all: Any = resets[0] if len(resets) == 1 else torch.cat(resets, 0)
    return Stacked(nxt, reset_all, torch.tensor(flags, dtype=torch.bool))


def _per_env(op: str, part: Any, stepping: list[int], lo: int) -> list[Any]:
    """One actor's answer (its first env ``lo``) as per-env outcomes of its stepped envs."""
    if type(part) is list:
        return part
    if part[0] == "L":
        return part[1]
    _, nxt, reset, flags = part
    mask = None if flags is None else torch.tensor(flags, dtype=torch.bool)
    return Stacked(nxt, reset, mask).outcomes(op, [i - lo for i in stepping])
