"""Time rows for batched envs (pools, the sync facades' pools, envs with a batch size).

The rollout loop (:mod:`aenv.envs._rollout`) keeps a batched env's steps in buffers planned
from its specs, time first: step ``t`` reads row ``t`` of ``(T + 1, *batch, ...)`` carried
buffers (observations, done flags) and of the action rows, and its ``"next"`` is written
into row ``t + 1`` (and row ``t`` of the rewards), which is also step ``t + 1``'s input;
the rollout comes back with time last, as the per-step TensorDicts would stack it.

A :class:`BatchStepper` takes the whole-batch steps: the default through the env's step
and "maybe reset" hooks, a pool's (:mod:`aenv.pool._pool_rollout`) through its backend's
stacked rows, overlapping consecutive steps where the backend can.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp import mask_merge
from aenv.envs._rollout_steps import _any_done, _Draws, _TensorDicts
from aenv.envs._rollout_stores import _Fallback, _TimeRows, plan_time_rows
from aenv.envs._rowplan import serial_copy

if TYPE_CHECKING:
    from aenv.envs._common import EnvBase

__all__ = ["BatchStepper", "Stepped", "_BatchRows"]

#: A whole-batch step's results: the stepped input with its ``"next"`` (None when the
#: stepper left the input as it was: results came as rows), the ``"next"`` content, and
#: what the step reset: None (nothing), the whole next input (mask None), or reset rows
#: for the envs a bool mask flags.
Stepped = tuple[TensorDictBase | None, TensorDictBase, TensorDictBase | None, torch.Tensor | None]


class BatchStepper:
    """How a rollout takes a batched env's whole-batch steps (:class:`_BatchRows` drives it).

    The default runs :meth:`~aenv.EnvBase.step`'s body and, where the rollout goes on
    through episode ends, :meth:`~aenv.EnvBase._reset_into` (together the body of
    ``step_and_maybe_reset``): the per-step loop's own calls, so the results are equal.
    """

    #: whether :meth:`step` starts the next step early from ``ahead`` (its random actions)
    overlaps = False

    def __init__(self, env: EnvBase) -> None:
        self.env = env

    def plan(self, actions: dict[str, torch.Tensor], row: Callable[[int], TensorDictBase]) -> None:
        """The rollout's random actions: ``actions`` (key -> ``(T, *batch, ...)`` rows,
        drawn ahead of the steps) and ``row(t)``, step ``t``'s as a TensorDict of views.
        Called once, before the first step, by a rollout of random actions."""

    async def step(
        self,
        inputs: Callable[[], TensorDictBase],
        reset: bool,
        ahead: range | None = None,
        last: int = -1,
    ) -> Stepped:
        """Step the whole batch from the input ``inputs()`` makes (actions checked
        already; made only where read), resetting what the step ended when ``reset``. A
        stepper that overlaps steps may start the next ones (``ahead``: the steps after
        this one whose random actions are drawn already, see :meth:`plan`; ``last``: the
        rollout's last step, which resets nothing and has nothing after it), each as soon
        as the one before it went well."""
        env = self.env
        td = await env._step_checked(inputs(), False)
        nxt = td.get("next")
        if not reset:
            return td, nxt, None, None
        following = await env._reset_into(td, None)
        assert not isinstance(following, bool)  # (no row given: nothing written)
        return td, nxt, following, None

    def close(self) -> None:
        """Give up what is still in flight (nothing, for the default)."""


class _BatchRows(_TimeRows):
    """Steps of a batched env in time rows (see the module docstring).

    Random actions are drawn into the action rows a chunk at a time (:class:`_Draws`, as
    the per-step loop draws them); a policy gets each step's input as a TensorDict of
    views of the carried row, as :class:`_TimeRows` hands them out. After an episode's end
    somewhere in the batch, the ``"next"`` row is kept aside and the reset rows are written
    over it (the next input). A step whose results the rows cannot hold (other keys: a
    sub-env's extra entry) is handed over with the steps before to TensorDicts.
    """

    def __init__(
        self,
        env: EnvBase,
        first: TensorDictBase,
        carried: list[str],
        actions: list[str],
        shared: dict[str, torch.Tensor],
        rewards: dict[str, torch.Tensor],
        draws: _Draws | None,
        stepper: BatchStepper,
        plain: bool,
    ) -> None:
        super().__init__(env, first, carried, actions, shared, rewards, draws)
        self.stepper = stepper
        self.plain = plain
        self.in_keys = [*carried, *actions]
        self.in_leaves = [*(shared[key] for key in carried), *self.action_rows.values()]
        #: per input key, the first row of its block of row views and the views; the
        #: size of its next block
        self.in_cols: list[tuple[int, tuple[torch.Tensor, ...]]] = [(0, ())] * len(self.in_keys)
        self.in_sizes = [1] * len(self.in_keys)
        self.steps = next(iter(rewards.values())).shape[0]
        # per key of a step's "next" (and of a next input): its rows (numpy views), and the
        # shape and dtype of one row
        self.carried_plan = [
            (key, self.shared[key].numpy(), self.shared[key].shape[1:], self.shared[key].dtype)
            for key in carried
        ]
        # (a step's "next" goes to row t of these: the carried ones are seen from row 1)
        after = [(key, self.shared[key][1:]) for key in carried]
        self.next_plan = [
            (key, leaf.numpy(), leaf.shape[1:], leaf.dtype)
            for key, leaf in (*after, *rewards.items())
        ]
        #: id -> (a TensorDict of results, the plan and check it was read with, its keys and
        #: planned tensors, their numpy views): see :meth:`_leaves`
        self.leaf_views: dict[
            int, tuple[Any, Any, bool, tuple[list[str], list[Any]], list[Any]]
        ] = {}
        if draws is not None:
            stepper.plan(self.action_rows, functools.partial(self._row, keys=self._actions))
        #: the masked resets whose rows are kept aside (step, mask, the reset rows):
        #: random steps sent ahead read no row of this rollout, so those are put in at
        #: once at its end (or before a row is read)
        self.defer = draws is not None and stepper.overlaps
        self.pending: list[tuple[int, torch.Tensor, list[Any]]] = []

    @staticmethod
    def make(  # type: ignore[override]
        env: EnvBase,
        td: TensorDictBase,
        max_steps: int,
        draws: _Draws | None,
        policy: bool,
        stepper: BatchStepper,
        plain: bool,
    ) -> _BatchRows | None:
        """Rows for a rollout of the batched ``env`` whose first input (its actions taken)
        is ``td``, or None where they do not apply (:func:`plan_time_rows`)."""
        if (draws is None) != policy or not td.batch_size:
            return None
        planned = plan_time_rows(env, td, max_steps, policy)
        if planned is None:
            return None
        try:
            for leaf in planned[2].values():
                leaf.numpy()  # (a dtype numpy lacks: no rows)
        except TypeError:
            return None
        return _BatchRows(env, td, *planned, draws, stepper, plain)

    def _row(self, t: int, keys: Any) -> TensorDictBase:
        """Row ``t`` of the carried and action buffers (``keys``: which), as a TensorDict of
        views."""
        return TensorDict._new_unsafe(keys(t), self.batch, self.device, nested=False)  # type: ignore[arg-type]

    def _inputs(self, t: int) -> dict[str, torch.Tensor]:
        """Random step ``t``'s input: views of row ``t`` (made a block of rows at a time:
        indexing a tensor costs more than the rest of the step's bookkeeping)."""
        if self.pending:
            self._settle()
        return self._in_row(t, 0)

    def _actions(self, t: int) -> dict[str, torch.Tensor]:
        """Step ``t``'s random actions alone (views of their rows, as :meth:`_inputs`)."""
        return self._in_row(t, len(self.carried))

    def _in_row(self, t: int, first: int) -> dict[str, torch.Tensor]:
        """Row ``t``'s views of the input keys from ``first`` on. Each key's views are made
        a block of rows at a time, when first asked for, the blocks doubling up to
        :attr:`BLOCK` rows (a rollout that overlaps its steps asks for the actions at
        every step, for the rest only where a step is not sent ahead: its first)."""
        cols, sizes, keys = self.in_cols, self.in_sizes, self.in_keys
        out = {}
        for k in range(first, len(cols)):
            start, views = cols[k]
            at = t - start
            if not 0 <= at < len(views):
                size = sizes[k]
                sizes[k] = min(2 * size, self.BLOCK)
                views = self.in_leaves[k][t : t + size].unbind(0)
                cols[k] = (t, views)
                at = 0
            out[keys[k]] = views[at]
        return out

    async def step(self, td: TensorDictBase, t: int, reset: bool) -> tuple[TensorDictBase, bool]:
        env = self.env
        if env._closed:
            env._check_open()
        if self.draws is not None:
            inputs = functools.partial(self._row, t, self._inputs)
            ahead = None
            if self.stepper.overlaps and reset and t + 1 < self.drawn:
                # the next steps' random actions are drawn already: each may start as soon
                # as the one before is back
                ahead = range(t + 1, self.drawn)
            stepped, nxt, following, mask = await self.stepper.step(
                inputs, reset, ahead, self.steps - 1
            )
        else:
            self._check_policy_input(td)
            inputs = functools.partial(_same, td)
            stepped, nxt, following, mask = await self.stepper.step(inputs, reset)
            src = td._tensordict
            for key, values in self.given.items():
                values.append(src[key])
        if not self._write(t, nxt, following, mask, reset):
            self._hand_over(inputs, stepped, nxt, following, mask, reset)
        self.count = t + 1
        if reset:
            return td, False  # (what the step ended is reset already)
        return td, _any_done(env, nxt)

    def _fits(self, td: TensorDictBase | None, plan: list[tuple[str, Any, Any, Any]]) -> bool:
        """Whether ``td`` holds exactly ``plan``'s keys, each a tensor of its row's shape and
        dtype (with no gradient to keep: TensorDicts keep those)."""
        if type(td) is not TensorDict:
            return False
        entries = td._tensordict
        if len(entries) != len(plan):
            return False
        for key, _, shape, dtype in plan:
            value = entries.get(key)
            if (
                type(value) is not torch.Tensor
                or value.shape != shape
                or value.dtype != dtype
                or value.requires_grad
            ):
                return False
        return True

    def _write(
        self,
        t: int,
        nxt: TensorDictBase,
        following: TensorDictBase | None,
        mask: torch.Tensor | None,
        reset: bool,
    ) -> bool:
        """Step ``t``'s results into the rows: its ``"next"`` into row ``t + 1`` (rewards:
        row ``t``); where it reset something, that row kept aside and the next input
        written over it. False, with nothing written, when they do not fit."""
        leaves = self._leaves(nxt, self.next_plan)
        if leaves is None:
            return False
        given = None
        if following is not None and (mask is not None or _any_done(self.env, nxt)):
            if mask is None:
                given = self._leaves(following, self.carried_plan)
            elif mask.dtype == torch.bool:
                given = self._leaves(following, self.carried_plan, exact=False)
            if given is None:
                return False
        # (numpy views: a row write costs half a tensor's)
        for (_, rows, _, _), leaf in zip(self.next_plan, leaves):
            rows[t] = leaf
        if given is not None:
            if mask is not None and self.defer:
                # (the reset rows copied aside, put in at once when row t + 1 is read:
                # at the end of a rollout whose steps are sent ahead)
                self.pending.append((t, mask, [leaf.copy() for leaf in given]))
            else:
                self._put_resets(t, mask, given)
        return True

    def _put_resets(self, t: int, mask: torch.Tensor | None, given: list[Any]) -> None:
        """Write the reset rows ``given`` (of the envs ``mask`` flags; None: all) over row
        ``t + 1``, the step's ``"next"`` row kept aside first."""
        row = t + 1
        self.saved[t] = [(key, rows[row, ...].copy()) for key, rows in self.shared_np]
        flags = None if mask is None else mask.numpy()
        for (_, rows, shape, _), leaf in zip(self.carried_plan, given):
            if flags is None:
                rows[row] = leaf
            else:
                # (the flagged envs' rows: a masked copy costs a third of indexing
                # both sides with the flags)
                where = flags.reshape(flags.shape + (1,) * (len(shape) - flags.ndim))
                np.copyto(rows[row], leaf, where=where)

    def _settle(self) -> None:
        """Put in the reset rows kept aside (before a row is read as a step's input), as
        at the end of the rollout: one masked copy per carried key for all of them."""
        self._put_pending(None)

    def _leaves(
        self,
        td: TensorDictBase,
        plan: list[tuple[str, Any, Any, Any]],
        exact: bool = True,
    ) -> list[Any] | None:
        """``td``'s leaves of ``plan`` (in its order) as numpy views, or None where they do
        not fit the rows (``exact``: :meth:`_fits`, else :meth:`_has_carried`). A pool's
        backend hands out the same rows every other step (its banks' ``"next"`` and
        ``"reset"``, see :class:`~aenv.pool._backend.Stacked`): their checks and views are
        made once, and kept while the TensorDict holds the same tensors (and, ``exact``,
        no other key)."""
        cached = self.leaf_views.get(id(td))
        if cached is not None and cached[0] is td and cached[1] is plan and cached[2] is exact:
            entries = td._tensordict  # type: ignore[attr-defined]
            keys, tensors = cached[3]
            # (the same tensor under each key, compared in C: identity, never values)
            if (not exact or len(entries) == len(tensors)) and all(
                map(operator.is_, map(entries.get, keys), tensors)
            ):
                return cached[4]  # type: ignore[no-any-return]
        if not (self._fits(td, plan) if exact else self._has_carried(td, plan)):
            return None
        entries = td._tensordict  # type: ignore[attr-defined]
        keys = [key for key, _, _, _ in plan]
        tensors = [entries[key] for key in keys]
        leaves = [tensor.numpy() for tensor in tensors]
        # (a process pool's banks give 8: each bank's results and resets, aenv.pool._shm's
        # BANKS = 4; an env's new TensorDicts come and go)
        if len(self.leaf_views) >= 16:
            self.leaf_views.clear()
        self.leaf_views[id(td)] = (td, plan, exact, (keys, tensors), leaves)
        return leaves

    def _has_carried(self, td: TensorDictBase, plan: list[tuple[str, Any, Any, Any]]) -> bool:
        """Whether reset rows ``td`` hold at least ``plan``'s keys (a pool's reset rows,
        under a mask), each a tensor of its row's shape and dtype."""
        if type(td) is not TensorDict:
            return False
        entries = td._tensordict
        for key, _, shape, dtype in plan:
            value = entries.get(key)
            if type(value) is not torch.Tensor or value.shape != shape or value.dtype != dtype:
                return False
        return True

    def _hand_over(
        self,
        inputs: Callable[[], TensorDictBase],
        stepped: TensorDictBase | None,
        nxt: TensorDictBase,
        following: TensorDictBase | None,
        mask: torch.Tensor | None,
        reset: bool,
    ) -> None:
        """Raise :class:`_Fallback` with a step the rows cannot hold, as the per-step loop
        would have kept it (its input with ``"next"``, and the next input)."""
        if stepped is None:
            # (a pool's results may be its backend's rows: kept, so copied)
            stepped = inputs().clone()
            stepped.set("next", nxt.clone())
        next_input = None
        if reset:
            next_input = following
            if following is None or mask is not None:
                next_input = self.env._step_mdp(stepped)
                if following is not None:
                    assert mask is not None
                    next_input = mask_merge(following.clone(), next_input, mask)
        raise _Fallback(stepped, next_input)

    async def reset(self, td: TensorDictBase, t: int) -> TensorDictBase:
        return self.advance(td, t)  # (the step reset what it ended)

    def advance(self, td: TensorDictBase, t: int) -> TensorDictBase:
        if self.draws is not None:
            return td  # (random steps read their input from the rows)
        return super().advance(td, t)

    def finish(self) -> TensorDictBase:
        td = super().finish()  # ("next" copied, the inputs still views of the rows)
        if self.pending:
            self._put_pending(td.get("next"))
        return _time_last(td, len(self.batch), self.batch)

    def _put_pending(self, nxt: TensorDictBase | None) -> None:
        """The reset rows kept aside, put in with one masked copy per carried key. The
        steps' ``"next"`` rows they are written over are kept aside from ``nxt`` where they
        were copied into it already (the rollout's end), else gathered from the rows first
        (one copy per key for all of them)."""
        pending, self.pending = self.pending, []
        at = np.array([t + 1 for t, _, _ in pending])
        flags = np.stack([mask.numpy() for _, mask, _ in pending])
        if nxt is None:
            # (a fancy index copies: row k of a key's block is step k's "next" row)
            blocks = [(key, rows[at]) for key, rows in self.shared_np]
            for k, (t, _, _) in enumerate(pending):
                self.saved[t] = [(key, block[k]) for key, block in blocks]
        for k, (_, rows, shape, _) in enumerate(self.carried_plan):
            values = np.stack([given[k] for _, _, given in pending])
            block = rows[at]
            where = flags.reshape(flags.shape + (1,) * (len(shape) - flags.ndim + 1))
            np.copyto(block, values, where=where)
            rows[at] = block
        if nxt is None:
            return
        entries = nxt._tensordict  # type: ignore[attr-defined]
        kept = {key: entries[key].numpy() for key, _, _, _ in self.carried_plan}
        for t, _, _ in pending:
            self.saved[t] = [(key, rows[t]) for key, rows in kept.items()]

    def close(self) -> None:
        self.stepper.close()

    def fallback(self) -> _TensorDicts:
        """TensorDicts holding the steps so far, to go on with."""
        self.close()
        draws = self.draws
        if draws is not None:
            # (the chunk drawn into the action rows, for the TensorDicts to go on from)
            draws.rows = [(key, value.unbind(0)) for key, value in draws.current.items()]
        store = _TensorDicts(self.env, True, self.plain, draws is not None, draws, None, False)
        if self.count:
            for step in self.finish().unbind(len(self.batch)):
                store.steps.append(step)
        return store


def _same(td: TensorDictBase) -> TensorDictBase:
    return td


def _time_last(td: TensorDictBase, dims: int, batch: torch.Size) -> TensorDictBase:
    """``td`` (time first) with its time dim moved after the ``dims`` batch dims."""
    entries: dict[str, Any] = {}
    for key, value in td._tensordict.items():  # type: ignore[attr-defined]
        if isinstance(value, TensorDictBase):
            entries[key] = _time_last(value, dims, batch)
        else:
            entries[key] = serial_copy(value.movedim(0, dims))  # (see serial_copy)
    size = torch.Size((*batch, td.batch_size[0]))
    return TensorDict._new_unsafe(entries, size, td.device, nested=False)  # type: ignore[arg-type]
