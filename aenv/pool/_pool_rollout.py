"""A pool's whole-batch rollout steps: the rollout loop's stepper for pools.

The one rollout loop (:mod:`aenv.envs._rollout`) keeps a pool's steps in time rows and takes
each whole-batch step through :class:`PoolStepper`: the backend's stacked rows (the
:class:`~aenv.pool._backend.Stacked` result copied into the time rows, no per-step
``step_mdp`` or reset merge), else the pool's own ``step`` / ``step_and_maybe_reset``.

On a backend whose whole-batch calls chain (``overlaps_steps``: the envs live in other
processes and take whole batches stacked), consecutive steps of a random-action rollout that
goes on through episode ends overlap: the actions of steps ``t + 1`` to ``t + BANKS - 1``
(drawn already, a chunk of steps at a time, as every rollout draws them) are staged in the
other banks (:data:`~aenv.pool._shm.BANKS`, taken in turn) while step ``t`` runs, each step
chained to the one before it, and the backend sends each the moment the one before came back
whole, before this task resumes to record that one (the process backend's workers ring them
themselves, one after the other, see :mod:`aenv.pool._process_bell`); a step's bank is
staged again once its results were copied into the time rows. Nothing in this process draws
random numbers or changes what the envs do in between, so the rollout equals the plain
loop's: the same keys, values and resets, the same random draws, the same error at the same
step (a failed step chains nothing: the steps chained after it are taken back, and the
steps before it stay on the error), and the envs left where the plain loop leaves them (the
last step is never chained past; a rollout given up takes back every step chained ahead).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from aenv.envs._rollout_batch import BatchStepper, Stepped
from aenv.pool._backend import Stacked
from aenv.pool._shm import BANKS

if TYPE_CHECKING:
    from aenv.pool._pool import AsyncEnvPool

__all__ = ["PoolStepper"]

_SMR = "step_and_maybe_reset"


class PoolStepper(BatchStepper):
    """A pool's whole-batch rollout steps (see the module docstring)."""

    def __init__(self, pool: AsyncEnvPool) -> None:
        super().__init__(pool)
        self.pool = pool
        backend = pool._backend
        # (not under "observe": its error strings do not fit the time rows, so its steps
        # are kept as TensorDicts, one at a time)
        self.overlaps = bool(
            backend.overlaps_steps and pool.on_error != "observe" and pool.max_concurrency is None
        )
        #: the steps sent ahead, in order: the next one (sent, chained to the one
        #: before), then those chained to it (each to the one before it), one per bank
        self.calls: deque[Any] = deque()
        self.bank = 0  # the bank of the next step started afresh
        self.held = False  # every env marked busy with a call in flight (pool._hold_all)
        #: the random actions' rows and a step's as a TensorDict (see plan); how step
        #: ``t``'s go into a bank (the backend's stager: None until planned, False where
        #: it has none)
        self.actions: dict[str, torch.Tensor] = {}
        self.row: Callable[[int], TensorDictBase] | None = None
        self.stage: Callable[[int, int], None] | bool | None = None

    def plan(self, actions: dict[str, torch.Tensor], row: Callable[[int], TensorDictBase]) -> None:
        self.actions, self.row, self.stage = actions, row, None

    async def step(
        self,
        inputs: Callable[[], TensorDictBase],
        reset: bool,
        ahead: range | None = None,
        last: int = -1,
    ) -> Stepped:
        pool = self.pool
        op = _SMR if reset else "step"
        calls = self.calls
        # (the input is only made where it is read: a step sent ahead has its inputs in
        # the backend's rows already)
        td = None
        if not calls:
            td = inputs()
            pool._check_open()
            pool._check_batch(td)
        if self.overlaps:
            # (the wait inline, not in a coroutine of its own: this runs on every step)
            if not calls:
                assert td is not None
                started = await self._start(op, td)
                if started is not None:
                    calls.append(started)
            out = None
            if calls:
                call = calls[0]
                try:
                    if ahead is not None:
                        self._chain(ahead, last)
                    out = await pool._wait_call(call, op)
                except BaseException:
                    self._give_up()
                    raise
                calls.popleft()
                if calls and calls[0].sent:  # (this step came back whole)
                    self.bank = (calls[-1].bank + 1) % BANKS
                else:
                    self._give_up()
                if isinstance(out, list):  # some env failed, or answered pickled
                    out = await pool._batch_faults(op, out, pool._all)  # (nothing chained)
                else:
                    out = pool._stacked_went_well(out)
        else:
            assert td is not None
            out = await pool._run_batch(op, td)
        if isinstance(out, Stacked):
            # (the rollout copies the results into its time rows: the backend's rows are
            # read as they are, see Stacked)
            nxt = out.next
            if not pool._stack_complete(nxt):
                nxt = pool._stacked_proc_data(nxt, inputs() if td is None else td, out.owned)
            if not reset:
                return None, nxt, None, None
            return None, nxt, out.reset, out.reset_mask
        if td is None:
            td = inputs()
        if out is None:  # (nothing started: the pool's per-env path)
            if not reset:
                td = await pool.step(td)
                return td, td.get("next"), None, None
            td, following = await pool.step_and_maybe_reset(td)
            return td, td.get("next"), following, None
        # per-env outcomes (some env answered pickled), the failed ones raised
        pool._raise_failures(op, pool._all, out)
        following = pool._outcomes_next_input(td, out)
        return td, td.get("next"), following if reset else None, None

    async def _start(self, op: str, td: TensorDictBase) -> Any:
        """Send step ``td`` on the current bank, every env held for the rollout's
        overlapped steps (the steps after it are chained to it); None: nothing started."""
        pool = self.pool
        await pool._hold_all()
        self.held = True
        call = pool._backend.launch(op, td, pool.step_timeout, bank=self.bank)
        if call is None:
            self._release()
        return call

    def _chain(self, ahead: range, last: int) -> None:
        """Send the steps of ``ahead`` (their random actions drawn) not sent yet, each
        chained to the one before, up to :data:`~aenv.pool._shm.BANKS` steps in flight
        (each in the bank after the one before's), none past the rollout's ``last`` step
        (it resets nothing: nothing is chained to it). Each has its actions staged through
        the backend's stager (planned at the first step sent ahead), else is sent as a
        TensorDict of their rows."""
        calls = self.calls
        t = ahead.start - 2 + len(calls)  # (the step of the last call in flight)
        end = min(ahead.start - 1 + BANKS, ahead.stop)
        if t >= end or t >= last:
            return
        backend, timeout = self.pool._backend, self.pool.step_timeout
        stage = self.stage
        if stage is None:
            stage = self.stage = backend.stager(self.actions) or False
        while t + 1 < end and t < last:
            t += 1
            before = calls[-1]
            op, bank = _SMR if t < last else "step", (before.bank + 1) % BANKS
            if stage is False:
                assert self.row is not None
                call = backend.launch(op, self.row(t), timeout, bank=bank, after=before)
            else:
                stage(bank, t)  # type: ignore[operator]
                call = backend.launch(op, None, timeout, bank=bank, after=before)  # type: ignore[arg-type]
            if call is None:
                return
            calls.append(call)

    def _give_up(self) -> None:
        """Give up the steps in flight (the first with the ones chained to it) and free
        the envs."""
        calls = self.calls
        if calls:
            first = calls[0]
            calls.clear()
            first.abandon()  # (the calls chained to it with it: see ProcessBackend)
        self._release()

    def _release(self) -> None:
        if self.held:
            self.held = False
            self.pool._release_all()

    def close(self) -> None:
        """Give up the steps sent ahead that nobody will wait for (the rollout ended
        early: an error, a cancel) and free the envs."""
        self._give_up()
