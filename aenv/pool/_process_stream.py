"""Streamed steps through the process backend's shared rows.

The process backend's envs read their step inputs from the shared ``"in"`` rows and write
their results into the shared ``"next"`` and ``"reset"`` rows (:mod:`aenv.pool._shm`), the
rows a whole-batch step uses. A streamed send goes through the same rows: the sent batch
is copied into the ``"in"`` rows of the envs sent, one indexed copy per entry
(:class:`~aenv.pool._stream_rows.StreamRows`), and each env's command says "your input is
in your row". Its result stays in its rows (:class:`Held`, the outcome delivered) until it
is received: a receive gathers the inputs and results of the envs it takes with one index
per entry, and makes the next inputs as a whole-batch step does
(``AsyncEnvPool._stacked_next_input``), with no per-env TensorDict on either side.

Rows are written again by the env's next operation (a streamed send, a per-env call, a
whole-batch call): before that, a result still held there is copied out (:meth:`SharedRows.evict`,
the receiver then reads the copy). An env whose input row is still read (a result that did
not come back in the rows and is not received yet: ``pending``) or whose cancelled
operation the worker may still be reading (the backend's fences) has its input pickled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDictBase

from aenv.pool._backend import Stacked
from aenv.pool._stream_rows import StreamRows, host_views, take_rows

if TYPE_CHECKING:
    from aenv.pool._dispatch import _Ticket

__all__ = ["Held", "SharedRows"]


class Held:
    """A streamed step's outcome left in its env's shared rows until it is received (or
    copied out, :meth:`own`, before the rows are written again)."""

    __slots__ = ("env", "op", "owned", "reset")

    def __init__(self, env: int, op: str, reset: bool) -> None:
        self.env = env
        self.op = op
        self.reset = reset  # (a step_and_maybe_reset that reset the env)
        #: once copied out: (input, next, reset or None)
        self.owned: tuple[TensorDictBase, TensorDictBase, TensorDictBase | None] | None = None

    def outcome(self) -> Any:
        """The outcome as the backend delivers it per env (owned copies)."""
        assert self.owned is not None
        _, nxt, rst = self.owned
        return nxt if self.op == "step" else (nxt, rst)


def _flat(rows: TensorDictBase) -> dict[str, torch.Tensor] | None:
    """``rows``' entries when all are tensors (flat), else None."""
    out = dict(rows.items())
    return out if all(type(v) is torch.Tensor for v in out.values()) else None  # type: ignore[return-value]


class SharedRows(StreamRows):
    """:class:`StreamRows` over a process pool's shared ``"in"`` rows, with the results
    held in its ``"next"`` / ``"reset"`` rows (see the module docstring).

    Args:
        rows: the whole pool's shared rows by kind (``"in"``, ``"next"``, ``"reset"``).
        sub_batch: an env's batch size.
        fences: the backend's envs whose rows must not be written (a cancelled operation
            may still read them).
    """

    shared = True

    def __init__(
        self,
        rows: dict[str, TensorDictBase],
        sub_batch: torch.Size,
        fences: dict[int, int],
    ) -> None:
        n = rows["in"].batch_size[0]
        super().__init__(None, n, sub_batch, planned=rows["in"])
        self.next_rows, self.reset_rows = rows["next"], rows["reset"]
        next_bufs, reset_bufs = _flat(self.next_rows), _flat(self.reset_rows)
        if next_bufs is None or reset_bufs is None:
            self.bufs = {}  # (not ok: a nested result entry, gathered per env as before)
            next_bufs = reset_bufs = {}
        self._next_bufs, self._reset_bufs = next_bufs, reset_bufs
        self._np_next, self._np_reset = host_views(self._next_bufs), host_views(self._reset_bufs)
        self.fences = fences
        #: env -> its result held in the rows, not received yet; how many are
        self.held: list[Held | None] = [None] * n
        self.count = 0

    # ------------------------------------------------------------------ the backend's
    def row_of(self, i: int, payload: Any) -> bool:
        """Whether ``payload`` is env ``i``'s row (its input is in the shared rows)."""
        return payload is not None and payload is self._rows[i]

    def hold(self, i: int, op: str, reset: bool) -> Held:
        if self.held[i] is not None:  # (evicted when its op was sent: never in use)
            self.evict(i)
        held = self.held[i] = Held(i, op, reset)
        self.count += 1
        return held

    def evict(self, i: int) -> None:
        """Copy env ``i``'s held result out of the rows (they are about to be written)."""
        held = self.held[i]
        if held is None:
            return
        self.held[i] = None
        self.count -= 1
        row = self._row(i)
        nxt = self.next_rows[i].clone()
        rst = self.reset_rows[i].clone() if held.reset else None
        held.owned = (row.clone(), nxt, rst)
        self.pending[i] = 0

    def evict_all(self) -> None:
        if not self.count:
            return
        for i, held in enumerate(self.held):
            if held is not None:
                self.evict(i)

    # ------------------------------------------------------------------ StreamRows'
    def _free(self, indices: Sequence[int]) -> list[int]:
        # the rows of an env are free once its held result is copied out, unless a
        # result not held there still reads its input row, or a cancelled operation may
        # still read them
        held, fences, pending = self.held, self.fences, self.pending
        out = []
        for pos, i in enumerate(indices):
            if held[i] is not None:
                self.evict(i)
            if not pending[i] and (not fences or i not in fences):
                out.append(pos)
        return out

    def release(self, indices: Sequence[int], payloads: Sequence[Any]) -> bool:
        # (a failure received: its input row is free; results are given up per env, see
        # stack, evict and owned_items)
        for i, payload in zip(indices, payloads):
            if self.row_of(i, payload):
                self.pending[i] = 0
        return False

    def forget(self, i: int) -> None:
        """Env ``i``'s streamed op was given up (no result will read its input row)."""
        self.pending[i] = 0

    # ------------------------------------------------------------------ the receiver's
    def stack(
        self, pool: Any, op: str, arr: np.ndarray, idx: torch.Tensor, outcomes: Sequence[Any]
    ) -> Any:
        """A receive's results straight from the rows (inputs and results gathered with
        one index per entry, the next inputs made as a whole-batch step makes them), or
        None when some outcome is not held there (see :meth:`owned_items`)."""
        held = self.held
        for outcome in outcomes:
            if type(outcome) is not Held or held[outcome.env] is not outcome:
                return None
        pending = self.pending
        for outcome in outcomes:
            held[outcome.env] = None
            pending[outcome.env] = 0
        self.count -= len(outcomes)
        stepped = self.gather(arr, {})
        nxt = take_rows(self._np_next, self._next_bufs, arr, self.sub_batch, self.device)
        if op == "step":
            stepped.set("next", nxt)
            stepped.set("env_index", idx)
            return stepped
        flags = [o.reset for o in outcomes]
        if True in flags:
            result = Stacked(
                nxt,
                take_rows(self._np_reset, self._reset_bufs, arr, self.sub_batch, self.device),
                torch.from_numpy(np.array(flags, dtype=np.bool_)),
            )
        else:
            result = Stacked(nxt)
        next_input = pool._stacked_next_input(stepped, result)
        stepped.set("env_index", idx)
        next_input.set("env_index", idx.clone())
        return stepped, next_input

    def owned_items(self, items: list[tuple[int, Any, _Ticket]]) -> list[tuple[int, Any, _Ticket]]:
        """``items`` with their held outcomes copied out of the rows and their tickets'
        inputs their copies (for the per-env path)."""
        out = []
        for i, outcome, t in items:
            if type(outcome) is Held:
                if outcome.owned is None:  # (still in the rows: held[i] is outcome)
                    self.evict(i)
                assert outcome.owned is not None
                t.payload = outcome.owned[0]
                outcome = outcome.outcome()
            elif self.row_of(i, t.payload):
                # (an input the per-env path writes "next" into: the row stays as made)
                t.payload = t.payload.clone()
                self.pending[i] = 0
            out.append((i, outcome, t))
        return out
