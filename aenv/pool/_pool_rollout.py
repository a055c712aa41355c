"""A pool's whole-batch rollout steps: the rollout loop's stepper for pools.

The one rollout loop (:mod:`aenv.envs._rollout`) keeps a pool's steps in time rows and takes
each whole-batch step through :class:`PoolStepper`: the backend's stacked rows (the
:class:`~aenv.pool._backend.Stacked` result copied into the time rows, no per-step
``step_mdp`` or reset merge), else the pool's own ``step`` / ``step_and_maybe_reset``.

On a backend whose whole-batch calls chain (``overlaps_steps``: the envs live in other
processes and take whole batches stacked), consecutive steps of a random-action rollout that
goes on through episode ends overlap: step ``t + 1``'s actions (drawn already, a chunk of
steps at a time, as every rollout draws them) are staged in the other bank while step ``t``
runs, and the backend sends step ``t + 1`` the moment step ``t`` came back whole, before this
task resumes to record step ``t`` (the process backend's workers ring it themselves, see
:mod:`aenv.pool._process_bell`). Nothing in this process draws random numbers or changes
what the envs do in between, so the rollout equals the plain loop's: the same keys, values
and resets, the same random draws, the same error at the same step (a failed step chains
nothing, and the steps before it stay on the error), and the envs left where the plain loop
leaves them (the last step is never chained past).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from aenv.envs._rollout_batch import BatchStepper, Stepped
from aenv.pool._backend import Stacked

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
        self.bank = 0
        self.call: Any = None  # the next step, sent ahead (chained to the one before)
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
        ahead: int | None = None,
        ahead_reset: bool = False,
    ) -> Stepped:
        pool = self.pool
        op = _SMR if reset else "step"
        # (the input is only made where it is read: a step sent ahead has its inputs in
        # the backend's rows already)
        td = None
        if self.call is None:
            td = inputs()
            pool._check_open()
            pool._check_batch(td)
        if self.overlaps:
            # (the wait inline, not in a coroutine of its own: this runs on every step)
            call, self.call = self.call, None
            if call is None:
                assert td is not None
                call = await self._start(op, td)
            out = None
            if call is not None:
                chained = None
                try:
                    if ahead is not None:
                        chained = self._chain(_SMR if ahead_reset else "step", ahead, call)
                    out = await pool._wait_call(call, op)
                except BaseException:
                    call.abandon()
                    if chained is not None:
                        chained.abandon()
                    self._release()
                    raise
                if chained is not None and chained.sent:  # (this step came back whole)
                    self.call, self.bank = chained, 1 - self.bank
                else:
                    self._release()
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

    def _chain(self, op: str, t: int, call: Any) -> Any:
        """Step ``t`` (its random actions drawn) chained to ``call``, in the other bank:
        its actions staged through the backend's stager (planned at the first step sent
        ahead), else as a TensorDict of their rows."""
        backend, bank, timeout = self.pool._backend, 1 - self.bank, self.pool.step_timeout
        stage = self.stage
        if stage is None:
            stage = self.stage = backend.stager(self.actions) or False
        if stage is False:
            assert self.row is not None
            return backend.launch(op, self.row(t), timeout, bank=bank, after=call)
        stage(bank, t)  # type: ignore[operator]
        return backend.launch(op, None, timeout, bank=bank, after=call)  # type: ignore[arg-type]

    def _release(self) -> None:
        if self.held:
            self.held = False
            self.pool._release_all()

    def close(self) -> None:
        """Give up the step sent ahead that nobody will wait for (the rollout ended early:
        an error, a cancel) and free the envs."""
        if self.call is not None:
            call, self.call = self.call, None
            call.abandon()
        self._release()
