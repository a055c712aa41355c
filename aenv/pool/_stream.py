"""The streaming half of the pool: send work to some envs, receive results as each finishes."""

from __future__ import annotations

import asyncio
import contextlib
import numbers
from collections.abc import AsyncIterator, Callable, Sequence
from itertools import repeat
from operator import attrgetter, is_not, itemgetter
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from aenv._mdp import set_next
from aenv.exceptions import BatchSizeError, EnvClosedError
from aenv.pool._backend import Failure
from aenv.pool._dispatch import ERROR_KEYS, STREAM_OPS, _Dispatcher, _Ticket, write_error
from aenv.pool._stacking import stack_results, unbind0
from aenv.pool._stream_rows import StreamRows
from aenv.pool._sub_checks import check_sub_inputs

__all__ = ["StreamMixin"]

IndexLike = int | Sequence[int] | torch.Tensor
#: the ops whose streamed inputs may go through rows (step_and_maybe_reset: shared rows only)
_ROW_OPS = frozenset(("step", "step_and_maybe_reset"))

_payload = attrgetter("payload")


class StreamMixin(_Dispatcher):
    """``async_*_send`` / ``async_*_recv`` and :meth:`stream` of :class:`AsyncEnvPool`."""

    _sub_batch: torch.Size
    _lazy: bool
    run_type_checks: bool  # EnvBase's
    _check_open: Callable[[], None]  # EnvBase's

    # ------------------------------------------------------------------ send
    def async_step_send(
        self, tensordict: TensorDictBase, env_index: IndexLike | None = None
    ) -> None:
        """Start a step on some envs without waiting; collect it with :meth:`async_step_recv`.

        ``tensordict`` holds one env's input (its batch size is the sub-env's) or a batch of
        them along dim 0; the target envs come from ``env_index`` or from the tensordict's
        ``"env_index"`` entry. Raises :class:`~aenv.exceptions.EnvBusyError` (and sends
        nothing) if one of them is still working.
        """
        self._send("step", tensordict, env_index)

    def async_reset_send(
        self, tensordict: TensorDictBase | None = None, env_index: IndexLike | None = None
    ) -> None:
        """Start a reset on some envs (``env_index`` or the ``"env_index"`` entry)."""
        self._send("reset", tensordict, env_index)

    def async_step_and_maybe_reset_send(
        self, tensordict: TensorDictBase, env_index: IndexLike | None = None
    ) -> None:
        """Start a step-and-reset-if-done on some envs; see :meth:`async_step_send`."""
        self._send("step_and_maybe_reset", tensordict, env_index)

    def _send(self, op: str, td: TensorDictBase | None, env_index: IndexLike | None) -> None:
        self._check_open()
        indices, single = self._send_indices(td, env_index)
        if len(set(indices)) != len(indices):
            raise ValueError(f"an env index appears twice in one send: {indices}")
        self._check_free(indices)
        rows = self._rows_for(op)
        subs, staged = self._split_send(td, indices, single, rows)
        # the inputs are checked as pool.step checks them, before anything is sent; a row
        # was filled only from entries of the specs' shapes and dtypes (StreamRows.stage),
        # so the type checks are all that is left to run on it (nothing, without them)
        if self.run_type_checks:
            check_sub_inputs(self, op, indices, subs)
        elif not all(staged):
            check_sub_inputs(self, op, indices, [None if s else x for s, x in zip(staged, subs)])
        streaming, enqueue = self._streaming, self._enqueue
        pending = rows.pending if rows is not None else None
        for i, sub, row in zip(indices, subs, staged):
            t = _Ticket(i, op, (sub, {}) if op == "reset" else sub, None, 0)
            streaming[op] += 1
            if row:
                pending[i] = 1  # type: ignore[index]
            try:
                enqueue(t)
            except BaseException:
                streaming[op] -= 1
                if row:
                    pending[i] = 0  # type: ignore[index]
                raise

    def _rows_for(self, op: str) -> StreamRows | None:
        """The input rows of streamed steps (:mod:`aenv.pool._stream_rows`), where the
        backend's envs live in this process and read them there, and the pool is dense."""
        if op not in _ROW_OPS or self._lazy:
            return None
        if "_stream_rows" not in self.__dict__:
            rows: StreamRows | None = None
            if self._backend.stream_rows:
                envs = self._backend.envs  # type: ignore[attr-defined]
                rows = StreamRows(envs[0], len(envs), self._sub_batch)
            elif self.max_concurrency is None:
                # the process backend's shared rows (aenv.pool._process_stream)
                rows = self._backend.shared_stream_rows(self._sub_batch)
            # (None when the inputs cannot be planned: every send splits its batch)
            self.__dict__["_stream_rows"] = rows if rows is not None and rows.ok else None
        rows = self.__dict__["_stream_rows"]
        return rows if op == "step" or (rows is not None and rows.shared) else None

    def _send_indices(
        self, td: TensorDictBase | None, env_index: IndexLike | None
    ) -> tuple[list[int], bool]:
        """The envs a send goes to, and whether ``td`` is one env's input."""
        sub_bs = self._sub_batch
        n = self.num_envs
        if env_index is None:
            if td is None or td.get("env_index", None) is None:
                raise ValueError("pass env_index= or an 'env_index' entry in the tensordict")
            raw = td.get("env_index")
            single = td.batch_size == sub_bs
            if isinstance(raw, torch.Tensor):
                if single:
                    flat = raw.reshape(-1)
                else:
                    flat = raw if raw.ndim == 1 else raw.reshape(raw.shape[0], -1)[:, 0]
                idx = [_as_index(flat[0].item())] if single else _as_indices(flat)
            else:
                idx = [_as_index(raw)] if single else _as_indices(raw)
        elif isinstance(env_index, int) and not isinstance(env_index, bool):
            idx, single = [env_index], True
        else:
            idx = _as_indices(env_index)
            single = False
        if idx and (min(idx) < 0 or max(idx) >= n):  # (the bounds in C; the culprit named)
            bad = next(i for i in idx if not 0 <= i < n)
            raise IndexError(f"env index {bad} out of range for a pool of {n} envs")
        if td is None:
            return idx, single
        if single:
            if td.batch_size != sub_bs:
                raise BatchSizeError(
                    f"a single env's input must have the sub-env batch size {tuple(sub_bs)}, got "
                    f"{tuple(td.batch_size)}"
                )
        elif td.batch_size != (len(idx), *sub_bs):
            raise BatchSizeError(
                f"expected an input of batch size {(len(idx), *sub_bs)} for {len(idx)} envs, got "
                f"{tuple(td.batch_size)}"
            )
        return idx, single

    def _split_send(
        self,
        td: TensorDictBase | None,
        indices: list[int],
        single: bool,
        rows: StreamRows | None,
    ) -> tuple[list[TensorDictBase | None], list[bool]]:
        """Each env's input: its row where ``rows`` takes the send, else its own
        TensorDict (a slice of ``td``); and for each, whether it is its row."""
        if td is None:
            return [None] * len(indices), [False] * len(indices)
        staged = rows.stage(td, indices, single) if rows is not None else None
        if staged is not None and all(map(is_not, staged, repeat(None))):
            return staged, [True] * len(staged)
        if single:
            return [td], [False]
        subs: list[TensorDictBase | None]
        if isinstance(td, LazyStackedTensorDict) and td.stack_dim == 0:
            subs = list(td.tensordicts)
        else:
            subs = list(unbind0(td))
        if staged is None:
            return subs, [False] * len(subs)
        # the envs whose rows are still pending get their own
        return (
            [own if row is None else row for row, own in zip(staged, subs)],
            [row is not None for row in staged],
        )

    # ------------------------------------------------------------------ receive
    async def async_step_recv(
        self,
        min_get: int = 1,
        max_get: int | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the pool's edge takes timeouts
        *,
        env_index: int | None = None,
    ) -> TensorDictBase:
        """Wait for at least ``min_get`` step results; return those ready (up to ``max_get``).

        The result is the stack of the sent tensordicts with their ``"next"`` filled in and
        an ``"env_index"`` entry. ``timeout`` bounds the whole call: fewer than ``min_get``
        results by then raises :class:`TimeoutError` and nothing is lost. ``env_index``
        waits for that env's result alone. A failed env's error is raised by the call that
        would have returned it; results received with it stay queued for the next call.
        """
        return await self._recv("step", min_get, max_get, timeout, env_index)

    async def async_reset_recv(
        self,
        min_get: int = 1,
        max_get: int | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the pool's edge takes timeouts
        *,
        env_index: int | None = None,
    ) -> TensorDictBase:
        """Reset results, as :meth:`async_step_recv`."""
        return await self._recv("reset", min_get, max_get, timeout, env_index)

    async def async_step_and_maybe_reset_recv(
        self,
        min_get: int = 1,
        max_get: int | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the pool's edge takes timeouts
        *,
        env_index: int | None = None,
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """``(stepped, next_input)`` stacks, both with ``"env_index"``; see :meth:`async_step_recv`."""
        return await self._recv("step_and_maybe_reset", min_get, max_get, timeout, env_index)  # type: ignore[no-any-return]

    async def stream(self, op: str = "step", *, max_get: int | None = None) -> AsyncIterator[Any]:
        """Yield results of ``op`` as envs finish, while any sent work is still out.

        Each item is what the matching ``async_*_recv`` returns (at least one env). Work sent
        while iterating is waited for too, so a loop can re-send each env as it comes back.

        Example:
            >>> pool.async_step_send(td)
            >>> async for out in pool.stream():
            ...     if not done:
            ...         pool.async_step_send(policy(pool.step_mdp(out)))
        """
        if op not in STREAM_OPS:
            raise ValueError(f"op must be one of {STREAM_OPS}, got {op!r}")
        while self._streaming[op] or self._ready[op]:
            yield await self._recv(op, 1, max_get, None, None)

    async def _wait_ready(
        self, op: str, key: int | None, enough: Callable[[], bool], lost: Callable[[], str | None]
    ) -> None:
        """Wait until ``enough()``; raise when ``lost()`` says it can no longer come. Each
        receiver has a future of its own, filed under the env it waits for (``key``), so
        any number of them can wait at once."""
        loop = asyncio.get_running_loop()
        waiters = self._recv_waiters[op]
        while not enough():
            if self.is_closed:  # type: ignore[attr-defined]
                raise EnvClosedError("the pool was closed while waiting for results")
            why = lost()
            if why is not None:
                raise RuntimeError(why)
            fut: asyncio.Future[None] = loop.create_future()
            waiters.setdefault(key, []).append(fut)
            try:
                await fut
            finally:
                mine = waiters.get(key)
                if mine is not None and fut in mine:
                    mine.remove(fut)
                    if not mine:
                        del waiters[key]

    async def _recv(
        self,
        op: str,
        min_get: int,
        max_get: int | None,
        deadline_s: float | None,
        env_index: int | None,
    ) -> Any:
        ready = self._ready[op]
        if env_index is not None:

            def enough() -> bool:
                return ready.has(env_index)

            def lost() -> str | None:
                t = self._tickets[env_index]
                if t is not None and t.batch is None and t.future is None and t.op == op:
                    return None
                return f"no {op} was sent to env {env_index} (or it was cancelled)"

        else:

            def enough() -> bool:
                return len(ready) >= min_get

            def lost() -> str | None:
                available = len(ready) + self._streaming[op]
                if min_get <= available:
                    return None
                return (
                    f"cannot wait for {min_get} {op} result(s): only {available} sent and not "
                    "yet received"
                )

        if not enough():
            why = lost()
            if why is not None:
                raise RuntimeError(why)
            scope = (
                anyio.fail_after(deadline_s) if deadline_s is not None else contextlib.nullcontext()
            )
            with scope:
                await self._wait_ready(op, env_index, enough, lost)
        else:
            # results were ready (cheap sync envs finish inline): let the loop run once
            # anyway, so a streaming loop never starves other tasks (heartbeats, the
            # background closes of replaced envs) and a cancel lands
            await anyio.lowlevel.checkpoint()
        if env_index is not None:
            items = [ready.take(env_index)]
        else:
            take = len(ready) if max_get is None else min(max_get, len(ready))
            items = ready.pop_oldest(take)
        # (the outcomes' types checked in C: a failure is rare, thousands go through here)
        if any(map(isinstance, map(itemgetter(1), items), repeat(Failure))):
            for k, item in enumerate(items):
                if isinstance(item[1], Failure):
                    ready.put_back(items[:k] + items[k + 1 :])
                    rows = self.__dict__.get("_stream_rows")
                    if rows is not None:
                        rows.release((item[0],), (item[2].payload,))
                    raise item[1].exc
        return self._stack_stream(op, items)

    def _next_input(self, stepped: TensorDictBase, reset: TensorDictBase | None) -> TensorDictBase:
        """One env's next input after a step-and-maybe-reset: its reset where it had one."""
        nxt_input: TensorDictBase = self._step_mdp(stepped)  # type: ignore[attr-defined]
        if reset is not None:
            nxt_input.update(reset)
        return nxt_input

    def _stack_stream(self, op: str, items: list[tuple[int, Any, _Ticket]]) -> Any:
        out = self._stack_received(op, items)
        if self.on_error == "observe" and op != "reset":
            # (the results that went well came without error entries: written once for
            # the receive's batch)
            nxt = (out if op == "step" else out[0]).get("next")
            if ERROR_KEYS[0] not in nxt.keys():
                write_error(nxt, None)
        return out

    def _stack_received(self, op: str, items: list[tuple[int, Any, _Ticket]]) -> Any:
        # the columns of the items, transposed in C
        envs, outcomes, tickets = zip(*items)
        arr = np.array(envs, dtype=np.int64)
        idx = torch.from_numpy(arr)
        if self._sub_batch:
            idx = idx.reshape(-1, *([1] * len(self._sub_batch))).expand(-1, *self._sub_batch)
        if op == "reset":
            out = stack_results(outcomes, self._lazy)
            out.set("env_index", idx)
            return out
        rows: StreamRows | None = self.__dict__.get("_stream_rows")
        if rows is not None and rows.shared:
            # the process backend's shared rows (aenv.pool._process_stream)
            stacked = rows.stack(self, op, arr, idx, outcomes)  # type: ignore[attr-defined]
            if stacked is not None:
                return stacked
            items = rows.owned_items(items)  # type: ignore[attr-defined]
            outcomes = tuple(item[1] for item in items)
        if self.on_error == "observe":
            # some came back restarted, with their error's entries: the others get their
            # empty ones first, one by one (a stack takes the same keys from each)
            nexts = [o if op == "step" else o[0] for o in outcomes]
            lacking = [n for n in nexts if ERROR_KEYS[0] not in n.keys()]
            if len(lacking) < len(nexts):
                for n in lacking:
                    write_error(n, None)
        if op == "step" and not self._lazy:
            sents = list(map(_payload, tickets))
            if rows is not None and rows.release(envs, sents):
                # the inputs straight from their rows: one index per entry
                nxt = stack_results(outcomes, False)
                return rows.gather(arr, {"next": nxt, "env_index": idx})
            if sents[0].get("next", None) is None:
                # the inputs and their "next" stacked apart, then joined once: no
                # per-result write into each input (thousands per call at a big pool)
                out = stack_results(sents, False)
                out.set("next", stack_results(outcomes, False))
                out.set("env_index", idx)
                return out
        stepped = []
        for _, result, t in items:
            sent = t.payload
            nxt = result if op == "step" else result[0]
            stepped.append(set_next(sent, nxt))
        out = stack_results(stepped, self._lazy)
        out.set("env_index", idx)
        if op == "step":
            return out
        nexts = [self._next_input(sent, result[1]) for (_, result, _), sent in zip(items, stepped)]
        nxt_out = stack_results(nexts, self._lazy)
        nxt_out.set("env_index", idx.clone())
        return out, nxt_out


def _as_index(value: Any) -> int:
    """An env index: an int (a numpy or 0-d torch integer too); anything else is refused,
    never rounded."""
    if type(value) is int:  # (the usual index: every step_one / reset_one reads one)
        return value
    if isinstance(value, torch.Tensor) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, numbers.Integral)):
        raise TypeError(
            f"env_index must be an int, a sequence of ints or an integer tensor; got "
            f"{value!r} ({type(value).__name__})"
        )
    return int(value)


def _as_indices(values: Any) -> list[int]:
    if isinstance(values, torch.Tensor):
        if values.dtype.is_floating_point or values.dtype == torch.bool:
            raise TypeError(
                f"env_index must be an integer tensor (or ints); got a {values.dtype} tensor"
            )
        # (ints already; a flat index, as a receive's env_index is, needs no reshape)
        flat = values if values.ndim == 1 else values.reshape(-1)
        return flat.tolist()  # type: ignore[no-any-return]
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(
            f"env_index must be an int, a sequence of ints or an integer tensor; got "
            f"{values!r} ({type(values).__name__})"
        )
    return [_as_index(v) for v in values]
