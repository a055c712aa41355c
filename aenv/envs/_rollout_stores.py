"""The time-row stores of the rollout loop (:mod:`aenv.envs._rollout`): where a rollout keeps
its steps when it can plan buffers for them.

- :class:`_TimeRows`, for an env whose hooks write straight into rows (a gymnasium env on its
  plain path): buffers planned from the specs (:func:`~aenv.envs._rowplan.plan_rows`), one
  row per time step. Step ``t`` reads row ``t`` of the inputs and writes row ``t`` of
  ``"next"``; the reset after an episode's end writes the next input row
  (:meth:`~aenv.EnvBase._reset_into`). No TensorDict is made per random step.
- :class:`~aenv.envs._rollout_batch._BatchRows`, its twin for batched envs (pools included).
- Everything else is kept as TensorDicts (:mod:`aenv.envs._rollout_steps`), and rows hand over
  to them a step they cannot hold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp import unravel
from aenv.envs._rollout_steps import _any_done, _done_mask, _Draws, _StepStore, _TensorDicts
from aenv.envs._rowplan import STEP_GROUPS, plan_rows, serial_copy
from aenv.exceptions import SpecViolationError

if TYPE_CHECKING:
    from aenv.envs._common import EnvBase

__all__ = [
    "_Draws",
    "_Fallback",
    "_StepStore",
    "_TensorDicts",
    "_TimeRows",
    "_any_done",
    "_done_mask",
    "plan_time_rows",
]


def plan_time_rows(
    env: EnvBase, td: TensorDictBase, max_steps: int, policy: bool
) -> tuple[list[str], list[str], dict[str, torch.Tensor], dict[str, torch.Tensor]] | None:
    """Time rows for a rollout of ``env`` whose first input (its actions taken) is ``td``:
    the carried keys (a step's ``"next"`` entries but the rewards), the action keys, the
    carried entries' ``(T + 1, *batch, ...)`` buffers (row 0 holding ``td``'s) and the
    rewards' ``(T, *batch, ...)`` ones. None where rows do not apply: state kept at the
    root, nested or non-tensor data, an input holding less than a step's outputs carry and
    the actions, or more (but a ``policy``'s extra tensors: its logits, say), or of other
    shapes than the specs'."""
    if type(td) is not TensorDict or td.batch_size != env.batch_size:
        return None
    if env.state_keys or any(type(k) is not str for k in env.action_keys):
        return None
    planned = plan_rows(env, STEP_GROUPS, max_steps + 1)
    if planned is None:
        return None
    reward_keys = {unravel(k)[-1] for k in env.reward_keys}
    actions: list[str] = list(env.action_keys)  # type: ignore[arg-type]
    entries = planned._tensordict
    carried = [key for key in entries if key not in reward_keys]
    given = td._tensordict
    planned_keys = {*carried, *actions}
    if not planned_keys.issubset(given):
        return None  # the input holds less than a step's outputs carry and the actions
    extras = given.keys() - planned_keys
    if extras:
        if not policy:
            return None  # more: only a policy's extras are kept
        lead = td.batch_size
        for key in extras:
            # (a policy's extras: tensors of the batch, kept per step as its actions)
            value = given[key]
            if type(value) is not torch.Tensor or value.shape[: len(lead)] != lead:
                return None
    for key in carried:
        first, dst = given[key], entries[key]
        if (
            type(first) is not torch.Tensor
            or first.shape != dst.shape[1:]
            or first.dtype != dst.dtype
            or first.device != dst.device
        ):
            return None
    for key in actions:
        # (a policy's action of another dtype is cast, or refused, by the step's checks)
        first = given[key]
        if type(first) is not torch.Tensor or first.shape != env.full_action_spec[key].shape:
            return None
    shared = {key: entries[key] for key in carried}
    for key in carried:
        shared[key][0] = given[key]
    rewards = {key: entries[key][:-1] for key in entries if key in reward_keys}
    if not rewards:
        return None
    return carried, actions, shared, rewards


class _Fallback(Exception):
    """A step the time rows cannot hold (its input holds other keys, or its results):
    TensorDicts take over. ``stepped`` / ``next_input``: a step already taken (its input
    with ``"next"``, and the next input where it reset), for them to keep."""

    def __init__(
        self, stepped: TensorDictBase | None = None, next_input: TensorDictBase | None = None
    ) -> None:
        super().__init__()
        self.stepped = stepped
        self.next_input = next_input


class _TimeRows:
    """Steps written into buffers planned from the specs, one row per time step.

    For an unbatched env whose step hooks write rows (:func:`~aenv.envs._rowplan.writes_rows`)
    and whose step inputs hold just what ``step_mdp`` carries from a step's outputs (no
    state kept at the root) and the actions (and a policy's extra tensors). What ``step_mdp`` carries
    (observations, done flags) lives in one ``(T + 1,)`` buffer: row ``t`` is step ``t``'s
    input, row ``t + 1`` its ``"next"``, which is also step ``t + 1``'s input: carrying costs
    nothing. Rewards and actions get ``(T,)`` buffers of their own.

    Step ``t`` runs ``env._step_into(inputs, out, t)``: the env reads row ``t`` of the
    inputs and writes row ``t`` of ``out`` (an env handing a TensorDict back has it copied
    in). Random actions are drawn into the action rows a chunk at a time, so a random step
    makes no TensorDict and no tensor. A policy gets each step's input as a TensorDict of
    views of the shared row (made a block at a time) and the env reads the action it wrote
    there; the actions are kept as the policy gave them (stacked at the end, so gradients
    survive). After an episode's end, the ``"next"`` row is kept aside and
    ``env._reset_into(buffer, out, t)`` writes the reset into the shared row.
    """

    BLOCK = 256  # a policy's inputs: row views made a block at a time

    def __init__(
        self,
        env: EnvBase,
        first: TensorDictBase,
        carried: list[str],
        actions: list[str],
        shared: dict[str, torch.Tensor],
        rewards: dict[str, torch.Tensor],
        draws: _Draws | None,
    ) -> None:
        steps = next(iter(rewards.values())).shape[0]
        self.env = env
        self.step_into = env._step_into  # (the env's hook, looked up once per rollout)
        self.carried = carried
        self.actions = actions
        self.shared = shared
        self.rewards = rewards
        self.draws = draws
        self.count = 0
        self.truncate = False
        self.saved: dict[int, list[tuple[str, np.ndarray]]] = {}
        self.shared_np = [(key, leaf.numpy()) for key, leaf in shared.items()]
        self.batch, self.device = first.batch_size, first.device  # (a step input's)
        size, dev = torch.Size((steps,)), first.device

        def td(entries: dict[str, Any]) -> TensorDictBase:
            return TensorDict._new_unsafe(entries, size, dev, nested=False)  # type: ignore[arg-type]

        after = {key: shared[key][1:] for key in carried}
        self.out = td({**after, **rewards})  # a step's "next" rows
        self.reset_out = td(after)  # a reset's rows (row t: step t + 1's input)
        self.order = list(first.keys())
        specs = {key: spec for key, spec, _ in env._action_checks}
        # (zeroed rows copied by numpy: see serial_copy)
        self.action_rows = {
            key: serial_copy(specs[key].zero().unsqueeze(0).expand(steps, *specs[key].shape))
            for key in actions
        }
        given = first._tensordict
        for key in actions:
            self.action_rows[key][0] = given[key]
        before = {key: shared[key][:-1] for key in carried}
        self.inputs = td({**before, **self.action_rows})
        self.buffer = td({**before, **self.action_rows, "next": self.out})
        # how far the action rows hold the actions: the random ones drawn so far; a
        # policy's, none (they come in its TensorDicts)
        self.drawn = 0
        if draws is not None:
            for key in actions:
                rest = draws.current[key][1:]
                self.action_rows[key][1 : 1 + rest.shape[0]] = rest
            self.drawn = draws.end
        else:
            # a policy's step: its input's keys (its extras too: written at every step),
            # the views it must leave in place, the action checks that pass without a
            # cast (anything else: env._check_actions)
            extras = [key for key in self.order if key not in shared and key not in actions]
            self.extras = extras
            self.root_keys = frozenset((*carried, *actions, *extras))
            self.lean = [(key, specs[key].shape, specs[key].dtype) for key in actions]
            self.given: dict[str, list[torch.Tensor]] = {k: [] for k in (*actions, *extras)}
            self.views: list[dict[str, torch.Tensor]] = []  # per row: its carried views
            self.view_start = self.view_end = 0
            self.current: dict[str, torch.Tensor] | None = None  # the views handed out last

    @staticmethod
    def make(
        env: EnvBase, td: TensorDictBase, max_steps: int, draws: _Draws | None, policy: bool
    ) -> _TimeRows | None:
        """Rows for a rollout of ``env`` whose first input (its actions taken) is ``td``, or
        None where they do not apply (see the class)."""
        if (draws is None) != policy or td.batch_size:
            return None
        planned = plan_time_rows(env, td, max_steps, policy)
        if planned is None:
            return None
        try:
            for leaf in planned[2].values():
                leaf.numpy()  # (a dtype numpy lacks: no rows)
        except TypeError:
            return None
        return _TimeRows(env, td, *planned, draws)

    def act(self, td: TensorDictBase, t: int) -> TensorDictBase:
        """The random actions of steps ``t`` on, drawn into the action rows a chunk at a time."""
        draws = self.draws
        assert draws is not None
        drawn = draws.chunk(t)
        for key, leaf in self.action_rows.items():
            leaf[t : draws.end] = drawn[key]
        self.drawn = draws.end
        return td

    async def step(self, td: TensorDictBase, t: int, reset: bool) -> tuple[TensorDictBase, bool]:
        env = self.env
        if env._closed:
            env._check_open()
        if self.draws is not None:
            out = await self.step_into(self.inputs, self.out, t)
        else:
            self._check_policy_input(td)
            src = td._tensordict
            out = await env._step_into(td, self.out, t)
            for key, values in self.given.items():
                values.append(src[key])
        self.count = t + 1
        if type(out) is not bool:
            out = _fill(self.out, t, out, "step")  # type: ignore[arg-type]
        return td, out

    def _check_policy_input(self, td: TensorDictBase) -> None:
        """A policy's step: rows only while its input holds the planned keys and the row
        views as they were made (a policy writing other keys, or replacing an observation,
        hands over to TensorDicts, before the step); actions of another shape or dtype go
        through the env's action checks (cast in place, or refused)."""
        if type(td) is not TensorDict:
            raise _Fallback
        src = td._tensordict
        made = self.current
        if made is None:  # (the first step's input: from the reset)
            if src.keys() != self.root_keys:
                raise _Fallback
        else:
            # (as many keys as planned, the views handed out and the actions: the planned)
            if len(src) != len(self.root_keys):
                raise _Fallback
            for key, view in made.items():
                if src.get(key) is not view:
                    raise _Fallback
        env = self.env
        for key, shape, dtype in self.lean:
            value = src.get(key)
            if type(value) is not torch.Tensor or value.shape != shape or value.dtype != dtype:
                if value is None:
                    raise _Fallback  # (the TensorDicts' step says what is missing)
                env._check_actions(td)
                break
        if env.run_type_checks:
            env._check_actions(td)

    async def reset(self, td: TensorDictBase, t: int) -> TensorDictBase:
        """After step ``t`` ended an episode: the reset written into the shared row (the
        step's ``"next"`` row kept aside first), then the next input."""
        # (a row of a 1-d buffer is a numpy scalar already: a copy; a row of more dims, a view)
        row = t + 1
        self.saved[t] = [
            (key, rows[row] if rows.ndim == 1 else rows[row].copy()) for key, rows in self.shared_np
        ]
        if self.draws is None:
            # (the buffer's row t is the step: a policy's actions are not in it yet)
            src = td._tensordict
            for key, leaf in self.action_rows.items():
                leaf[t] = src[key].detach()
        out = await self.env._reset_into(self.buffer, self.reset_out, t)
        if out is not True:
            assert not isinstance(out, bool)
            _fill(self.reset_out, t, out, "reset")
        return self.advance(td, t)

    def advance(self, td: TensorDictBase, t: int) -> TensorDictBase:
        """The next step's input: the shared row (a policy's: a TensorDict of its views)."""
        if self.draws is not None:
            return td
        # a policy's next input: views of the shared row (made a block of rows at a time)
        row = t + 1
        if row >= self.view_end:
            self.view_start, self.view_end = row, row + self.BLOCK
            carried = self.carried
            columns = [self.shared[key][row : self.view_end].unbind(0) for key in carried]
            self.views = [dict(zip(carried, views)) for views in zip(*columns)]
        views = self.current = self.views[row - self.view_start]
        if self.extras:  # (carried on as step_mdp carries them: the policy's last ones)
            given = self.given
            views = {**views, **{key: given[key][-1] for key in self.extras}}
        # (the dict is copied in: the policy's writes leave it as made)
        return TensorDict._new_unsafe(views, self.batch, self.device, nested=False)  # type: ignore[arg-type]

    def set_truncated(self) -> None:
        """Mark the last step truncated (and done)."""
        self.truncate = True

    def _next(self) -> TensorDictBase:
        n = self.count
        entries = {}
        for key in self.out.keys():
            if key in self.rewards:
                entries[key] = self.rewards[key][:n]
            else:
                entries[key] = serial_copy(self.shared[key][1 : n + 1])
        # (the rows kept aside at episode ends, put back through numpy: a row written
        # into a tensor costs several times a numpy array's)
        arrays: dict[str, np.ndarray] = {}
        for t, saved in self.saved.items():
            if t < n:
                for key, value in saved:
                    rows = arrays.get(key)
                    if rows is None:
                        rows = arrays[key] = entries[key].numpy()
                    rows[t] = value
        if self.truncate:
            for key in self.env.done_keys:
                if unravel(key)[-1] in ("truncated", "done"):
                    entries[key][n - 1] = True  # type: ignore[index]
        return TensorDict._new_unsafe(entries, torch.Size((n,)), self.out.device, nested=False)  # type: ignore[arg-type]

    def finish(self) -> TensorDictBase:
        nxt = self._next()
        n = self.count
        if self.draws is not None:
            actions = {key: leaf[:n] for key, leaf in self.action_rows.items()}
        else:
            actions = {key: torch.stack(values[:n]) for key, values in self.given.items()}
        values = {**{k: v[:n] for k, v in self.shared.items()}, **actions}
        entries = {key: values[key] for key in self.order}
        entries["next"] = nxt
        return TensorDict._new_unsafe(entries, torch.Size((n,)), nxt.device, nested=False)  # type: ignore[arg-type]

    def close(self) -> None:
        """Nothing held."""

    def fallback(self) -> _TensorDicts:
        """TensorDicts holding the steps so far, to go on with (a policy's step whose input
        the rows cannot hold)."""
        env = self.env
        store = _TensorDicts(env, True, True, False, None, None, False)
        if self.count:
            for step in self.finish().unbind(0):
                store.steps.append(step)
        return store


def _fill(rows: TensorDictBase, t: int, td: TensorDictBase, what: str) -> bool:
    """Copy ``td`` (a step's ``"next"`` or a reset's outputs) into row ``t`` of ``rows``;
    returns whether it ended an episode (its root ``"done"``)."""
    entries = rows._tensordict
    for key, dst in entries.items():
        value = td.get(key, None)
        if (
            type(value) is not torch.Tensor
            or value.shape != dst.shape[1:]
            or (value.dtype != dst.dtype)
        ):
            got = "nothing" if value is None else f"{type(value).__name__} {value!r}"
            raise SpecViolationError(
                f"the env's {what} gave {got} for {key!r}; expected a tensor of shape "
                f"{tuple(dst.shape[1:])} and dtype {dst.dtype}, as its spec says",
                key=key,
            )
        dst[t] = value
    done = entries.get("done")
    return done is not None and bool(done[t].any())
