"""Rows in ordinary memory: a whole-batch step of in-process envs, each env writing its
results into its own row of preallocated stacked buffers.

The buffers are planned once from the envs' specs (a step's ``"next"`` content, and a reset's
outputs for ``step_and_maybe_reset``), stacked along the pool's env dim; env ``i``'s rows are
TensorDicts whose leaves view row ``i``. A step goes through the env's one step hook,
:meth:`~aenv.EnvBase._step_into` (then :meth:`~aenv.EnvBase._reset_into` when it ended the
episode): an env that writes directly (a gymnasium env on its plain path) fills its row with
no TensorDict made; any other env's result is copied into the row. The stacked result is one
copy of the buffers, with no per-env stacking. This is the in-process twin of a process
worker's shared-memory slots (:mod:`aenv.pool._shm`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.envs._rowplan import INPUT_GROUPS, RESET_GROUPS, STEP_GROUPS, plan_rows
from aenv.pool._backend import Failure, Stacked
from aenv.pool._ops import drive, lean_inline, runs_inline, step_rows
from aenv.pool._shm import _copy_all

__all__ = ["Rows"]

_STEP_GROUPS, _RESET_GROUPS = STEP_GROUPS, RESET_GROUPS


_plan = plan_rows  # (the one planner, shared with the rollout's time rows)


def _fill(row: TensorDictBase, keys: frozenset[Any], td: TensorDictBase) -> bool:
    """Copy ``td`` into ``row`` when it has exactly the row's keys, shapes and dtypes."""
    if frozenset(td.keys(True, True)) != keys:
        return False
    for key in keys:
        value, dst = td.get(key), row.get(key)
        if type(value) is not torch.Tensor or value.shape != dst.shape or value.dtype != dst.dtype:
            return False
    for key in keys:
        row.get(key).copy_(td.get(key))
    return True


def _copier(td: TensorDictBase) -> Callable[[], TensorDictBase] | None:
    """A function giving a fresh copy of ``td`` (a plain TensorDict of CPU tensors numpy
    can view, nested plain TensorDicts allowed) through numpy views made once: a numpy
    copy and ``torch.from_numpy`` cost about half a tensor ``clone``. None where it does
    not apply."""
    if type(td) is not TensorDict or td._has_names():
        return None
    parts: list[tuple[str, Any]] = []
    for key, value in td._tensordict.items():
        if type(value) is TensorDict:
            sub = _copier(value)
            if sub is None:
                return None
            parts.append((key, sub))
        elif type(value) is torch.Tensor and value.is_cpu and not value.requires_grad:
            try:
                parts.append((key, value.numpy()))
            except TypeError:  # (a dtype numpy lacks)
                return None
        else:
            return None
    batch, device, new, from_numpy = (
        td.batch_size,
        td.device,
        TensorDict._new_unsafe,
        torch.from_numpy,
    )

    def copy() -> TensorDictBase:
        return new(
            {k: from_numpy(v.copy()) if type(v) is np.ndarray else v() for k, v in parts},
            batch_size=batch,
            device=device,
            nested=False,
        )

    return copy


class Rows:
    """The stacked buffers of one pool's in-process envs and each env's rows in them.

    Args:
        envs: the pool's envs (dense: their specs stack).
    """

    def __init__(self, envs: Sequence[EnvBase]) -> None:
        n = len(envs)
        self.next = _plan(envs[0], _STEP_GROUPS, n) if n else None
        self.reset = _plan(envs[0], _RESET_GROUPS, n) if n else None
        self.ok = self.next is not None and self.reset is not None
        if not self.ok:
            return
        assert self.next is not None and self.reset is not None
        self.next_rows = self.next.unbind(0)
        self.reset_rows = self.reset.unbind(0)
        self.next_keys = frozenset(self.next.keys(True, True))
        self.reset_keys = frozenset(self.reset.keys(True, True))
        # the inputs' rows: a whole batch's input is copied in, one copy per entry, and each
        # env reads its row (no per-env TensorDict made per step)
        inputs = _plan(envs[0], INPUT_GROUPS, n)
        self.inputs: dict[Any, torch.Tensor] = (
            {} if inputs is None else dict(inputs.items())  # type: ignore[arg-type]
        )
        self.input_rows = inputs.unbind(0) if inputs is not None else ()
        self._flags = np.zeros(n, dtype=np.bool_)  # a step's reset flags, one per env
        self.copy_next = _copier(self.next)
        self._bufs = list(self.inputs.values())
        # whether every env wrote its last step into its row itself: rows pay off only
        # then (copying a built TensorDict in costs more than the per-env path's stack)
        self.direct = True
        # the envs (by identity) and op last found to run inline, on the lean path
        self._inline: tuple[str, tuple[int, ...]] | None = None

    def stage(self, td: TensorDictBase) -> Sequence[TensorDictBase] | None:
        """Copy a whole batch's input into the input rows and return them (env ``i``'s
        input is row ``i``), when ``td`` holds exactly the planned entries, shapes and
        dtypes (an input a bare env would get); None, with nothing written, otherwise."""
        bufs = self.inputs
        if not bufs or type(td) is not TensorDict:
            return None
        entries = td._tensordict
        if entries.keys() != bufs.keys():
            # (a masked step's ``"_step"`` is the pool's, not an env input)
            if "_step" not in entries or entries.keys() - {"_step"} != bufs.keys():
                return None
            entries = {k: v for k, v in entries.items() if k != "_step"}
        srcs = []
        for key, dst in bufs.items():
            value = entries[key]
            if (
                type(value) is not torch.Tensor
                or value.shape != dst.shape
                or value.dtype != dst.dtype
            ):
                return None
            srcs.append(value)
        _copy_all(self._bufs, srcs)  # (one call for every entry)
        return self.input_rows

    def restore_inputs(self) -> None:
        """Rebuild the input rows an env wrote entries into (its input is its own to
        change, as a bare env's is; the next step's row must hold the planned entries)."""
        size = len(self.inputs)
        for row in self.input_rows:  # (a plain loop: this runs on every whole-batch step)
            if len(row._tensordict) != size:  # type: ignore[attr-defined]
                assert self.next is not None
                batch = self.next.batch_size
                stacked = TensorDict._new_unsafe(dict(self.inputs), batch_size=batch, nested=False)
                self.input_rows = stacked.unbind(0)
                return

    def takes(
        self,
        envs: Sequence[EnvBase],
        op: str,
        inputs: Sequence[TensorDictBase],
        staged: bool = False,
        indices: Sequence[int] | None = None,
    ) -> bool:
        """Whether every env's ``op`` runs inline on the lean path (EnvBase's step, no
        ``"_step"`` mask, no type checks: see :func:`~aenv.pool._ops.lean_inline`), and no
        env has handed back a TensorDict instead of writing its row (then the per-env path
        is cheaper, and is taken from then on). ``staged``: the inputs are this object's
        input rows (planned entries only, so no ``"_step"`` mask to look for). With
        ``indices``, only those envs step (``inputs`` are theirs, in that order)."""
        if not (self.ok and self.direct):
            return False
        ids = tuple(map(id, envs))
        if self._inline != (op, ids):
            # (by class: settled once for these envs, until one is replaced)
            if not all(runs_inline(env, op) for env in envs):
                return False
            self._inline = (op, ids)
        if staged:
            # what lean_inline checks per env and step, less the mask no input row holds
            # (the class-level part is runs_inline's, settled above)
            # (a plain loop over the attributes: this runs on every whole-batch step)
            for env in envs:
                if env.run_type_checks or env._closed:
                    return False
            return True
        stepping = envs if indices is None else [envs[i] for i in indices]
        return all(lean_inline(env, op, td) for env, td in zip(stepping, inputs, strict=True))

    def run(
        self,
        envs: Sequence[EnvBase],
        op: str,
        inputs: Sequence[TensorDictBase],
        indices: Sequence[int] | None = None,
    ) -> Stacked | list[Any]:
        """``op`` on every env, or on the envs ``indices`` (``inputs`` are theirs, in that
        order), each into its rows: the stacked result (the rows of envs that did not step
        left as they were, their reset flags False), or per-env outcomes (as a backend's
        ``launch`` gives them, one per stepped env) when some env failed or gave a
        result its row cannot hold."""
        smr = op == "step_and_maybe_reset"
        if indices is None:
            indices = range(len(envs))
        # (numpy: one write to a tensor costs more than a step's whole bookkeeping)
        reset_flags = self._flags
        reset_flags.fill(False)
        any_reset = False
        next_rows, reset_rows = self.next_rows, self.reset_rows
        # per stepped env: None where its rows hold its results (its outcome is made from
        # them only if the batch does not come back whole), else its outcome
        outcomes: list[Any] = []
        whole = True
        for i, td in zip(indices, inputs, strict=True):
            row = next_rows[i]
            try:
                res, rst = drive(step_rows(envs[i], op, td, row, reset_rows[i]))
                if type(res) is bool and (rst is None or rst is True):
                    # (the common case: every result in the rows)
                    if rst:
                        reset_flags[i] = any_reset = True
                    outcomes.append(None)
                    continue
                stepped_next = row
                if not isinstance(res, bool):
                    self.direct = False
                    stepped_next = res
                    whole = _fill(row, self.next_keys, res) and whole
                if not smr:
                    outcomes.append(stepped_next)
                    continue
                if rst is None:
                    outcomes.append((stepped_next, None))
                    continue
                reset_row = reset_rows[i]
                if rst is not True and not _fill(reset_row, self.reset_keys, rst):
                    whole = False
                    outcomes.append((stepped_next, rst))
                    continue
                reset_flags[i] = any_reset = True
                outcomes.append((stepped_next, reset_row))
            except Exception as exc:
                whole = False
                outcomes.append(Failure(exc))
        if whole:
            # the rows themselves: a consumer copies what it keeps (see Stacked)
            assert self.next is not None and self.reset is not None
            if not any_reset:
                return Stacked(self.next, owned=False, copy=self.copy_next)
            mask = torch.from_numpy(reset_flags.copy())
            return Stacked(self.next, self.reset, mask, owned=False, copy=self.copy_next)
        for pos, i in enumerate(indices):
            if outcomes[pos] is None:
                row = next_rows[i]
                if not smr:
                    outcomes[pos] = row
                else:
                    outcomes[pos] = (row, reset_rows[i] if reset_flags[i] else None)
        return [_private(o) for o in outcomes]


def _private(outcome: Any) -> Any:
    """An outcome owning its tensors (rows are overwritten by the next step)."""
    if isinstance(outcome, TensorDict | TensorDictBase):
        return outcome.clone()
    if isinstance(outcome, tuple):
        return tuple(_private(part) if part is not None else None for part in outcome)
    return outcome
