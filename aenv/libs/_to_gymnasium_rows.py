"""How the single-env gymnasium bridge calls its env: inline where the env cannot suspend,
into reused rows where it writes them.

Two costs dominate a bridged step that is not the env's own work: a hop through the loop
runner (an event loop run per call) and a TensorDict built per step. The first goes where
:func:`~aenv.pool._ops.runs_inline` says the env's operation cannot suspend: the bridge then
drives the coroutine itself (:func:`~aenv.pool._ops.drive`), as the pool's backends do. The
second goes for envs whose step hook writes rows (a gymnasium env on its plain path, see
:func:`~aenv.envs._rowplan.writes_rows`): :class:`StepRows` keeps two rows planned from
the specs, and each step's ``"next"`` row is the next step's input (what ``step_mdp``
carries: observations and done flags), the way a rollout's time rows are laid out. The step
itself is the env's one step hook, :meth:`~aenv.EnvBase._step_into`, after the env's own
action check, exactly as the pool's whole-batch path runs it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp import unravel, with_next
from aenv.envs._common import EnvBase
from aenv.envs._rowplan import STEP_GROUPS, plan_rows, writes_rows
from aenv.pool._ops import drive, runs_inline
from aenv.specs._numpy import from_numpy_into_fn
from aenv.sync import Runner

__all__ = ["StepRows", "call_env"]


def call_env(
    env: EnvBase, runner: Runner, op: str, fn: Callable[..., Awaitable[Any]], *args: Any
) -> Any:
    """``fn(*args)`` (an async method of ``env`` doing ``op``) run to completion: driven
    inline where the op cannot suspend, else one call through ``runner``."""
    if runs_inline(env, op):
        return drive(fn(*args))  # type: ignore[arg-type]
    return runner.run(fn, *args)


class StepRows:
    """Two rows, planned from ``env``'s specs, that the env's steps write into in turn.

    Row ``k`` holds step ``t``'s input (what ``step_mdp`` carries, and the action), row
    ``1 - k`` its ``"next"``, which is step ``t + 1``'s input. Built by :meth:`make` only for
    an unbatched env that writes rows, keeps no state outside its observations, and whose
    action is one tensor entry.
    """

    def __init__(self, env: EnvBase, planned: TensorDictBase, action_key: str) -> None:
        self.env = env
        self.action_key = action_key
        action_spec = env.full_action_spec[action_key]
        self.action_shape, self.action_dtype = action_spec.shape, action_spec.dtype
        rewards = {unravel(k)[-1] for k in env.reward_keys}
        entries = planned._tensordict  # type: ignore[attr-defined]
        self.carried = [k for k in entries if k not in rewards]
        shared = {k: entries[k] for k in self.carried}
        reward = {k: entries[k][0] for k in entries if k in rewards}
        size = torch.Size(())

        def td(values: dict[str, Any]) -> TensorDictBase:
            return TensorDict._new_unsafe(values, size, env.device, nested=False)  # type: ignore[arg-type]

        self.inputs = [td({k: v[i] for k, v in shared.items()}) for i in (0, 1)]
        # a reset's rows (observations and done flags): the current input's own leaves
        self.resets = [td({k: v[i] for k, v in shared.items()}) for i in (0, 1)]
        self.ended = False  # whether the last step ended the episode
        self.outs = [td({**{k: v[1 - i] for k, v in shared.items()}, **reward}) for i in (0, 1)]
        self.k = 0
        # numpy views of each row's reward and flags (for the outputs of the row just written)
        self.reward = next(iter(reward.values())).numpy().reshape(-1)
        term = shared.get("terminated", shared["done"]).numpy()
        trunc = shared["truncated"].numpy() if "truncated" in shared else None
        self.flags = [
            (term[i].reshape(-1), None if trunc is None else trunc[i].reshape(-1)) for i in (0, 1)
        ]
        # (one flag each, the common case: read with one call per value)
        self.one_flag = term[0].size == 1 and (trunc is None or trunc[0].size == 1)
        # one reused action tensor per input row, written in place from gymnasium's value
        # (no tensor made per step) where the spec has a writer for it
        device = action_spec.device
        self.action_into = (
            from_numpy_into_fn(action_spec) if device is None or device.type == "cpu" else None
        )
        self.actions = [torch.zeros(self.action_shape, dtype=self.action_dtype) for _ in (0, 1)]
        self.action_views = [a.numpy() for a in self.actions] if self.action_into else []

    @classmethod
    def make(cls, env: EnvBase, action_key: Any) -> StepRows | None:
        """Rows for ``env``, or None where they do not apply (see the class)."""
        if env.batch_size or not writes_rows(env) or not runs_inline(env, "step"):
            return None
        if env.run_type_checks:
            return None  # (EnvBase's full step checks the outputs)
        if env.state_keys or type(action_key) is not str or list(env.reward_keys) != ["reward"]:
            return None
        planned = plan_rows(env, STEP_GROUPS, 2)
        if planned is None or "done" not in planned.keys() or planned["reward"][0].numel() != 1:
            return None
        try:
            for leaf in planned.values():
                leaf.numpy()  # (a dtype numpy lacks: no rows)
        except TypeError:
            return None
        return cls(env, planned, action_key)

    @property
    def current(self) -> TensorDictBase:
        """The next step's input (its action entry as last set)."""
        return self.inputs[self.k]

    @property
    def last(self) -> TensorDictBase:
        """The last step's ``"next"`` row (also the current input's values)."""
        return self.outs[1 - self.k]

    def start(self, td: TensorDictBase) -> bool:
        """Take a reset's output ``td`` as the current input; False (nothing written) where
        it does not fit the rows."""
        row = self.inputs[self.k]._tensordict  # type: ignore[attr-defined]
        entries = td._tensordict if type(td) is TensorDict else None
        if entries is None or not all(k in entries for k in self.carried):
            return False
        for key in self.carried:
            value, dst = entries[key], row[key]
            if (
                type(value) is not torch.Tensor
                or value.shape != dst.shape
                or value.dtype != dst.dtype
            ):
                return False
        for key in self.carried:
            row[key].copy_(entries[key])
        return True

    def step_value(self, value: Any, convert: Callable[[Any], Any]) -> TensorDictBase | None:
        """:meth:`step` with gymnasium's action ``value``, written into this row's reused
        action tensor where it fits as it is, else converted by ``convert``."""
        into, k = self.action_into, self.k
        if into is not None and into(value, self.action_views[k]):
            td = self.inputs[k]
            td._tensordict[self.action_key] = self.actions[k]  # type: ignore[attr-defined]
            return self._step_row(td)
        return self.step(convert(value))

    def step(self, action: Any) -> TensorDictBase | None:
        """Step the env with ``action`` (a tensor, or a TensorDict for a composite action):
        None once its ``"next"`` row is written (read it from :attr:`last`), or the
        ``"next"`` TensorDict the env handed back instead (then the caller leaves the rows:
        the input it stepped from is :attr:`current`)."""
        td = self.inputs[self.k]
        if (
            type(action) is torch.Tensor
            and action.shape == self.action_shape
            and action.dtype == self.action_dtype
        ):
            # what the env's action check would pass as it is (its shape and dtype; the
            # domain is checked only with run_type_checks, which has no rows)
            td._tensordict[self.action_key] = action  # type: ignore[attr-defined]
        else:
            td.set(self.action_key, action)
            self.env._check_actions(td)
        return self._step_row(td)

    def _step_row(self, td: TensorDictBase) -> TensorDictBase | None:
        """:meth:`step` once ``td``, this row's input, holds the action."""
        env = self.env
        if env._closed:
            env._check_open()
        if env.run_type_checks:
            # (what lean_inline checks per step, less what make settled for the class and
            # the mask an input row never holds, as a pool's staged rows check it)
            return self._stepped(td)
        out = drive(env._step_into(td, self.outs[self.k]))  # type: ignore[arg-type]
        if type(out) is bool:
            self.k = 1 - self.k
            self.ended = out
            return None
        return out  # type: ignore[no-any-return]

    def reset_after_end(self) -> bool | TensorDictBase | None:
        """After a step that ended the episode, the env's reset-after-done hook
        (:meth:`~aenv.EnvBase._reset_into`, what a pool's step-and-maybe-reset runs) into
        the current input row: True once written there; the reset's TensorDict where the
        env handed one back instead (the env did reset: the caller goes on from it); None
        where it does not apply (nothing done: the caller resets the env itself)."""
        env = self.env
        if not (self.ended and runs_inline(env, "step_and_maybe_reset")):
            return None
        self.ended = False
        stepped = with_next(self.inputs[1 - self.k], self.last)
        out = drive(env._reset_into(stepped, self.resets[self.k]))  # type: ignore[arg-type]
        return True if out is True else out  # type: ignore[no-any-return]

    def _stepped(self, td: TensorDictBase) -> TensorDictBase:
        stepped = drive(self.env.step(td))  # type: ignore[arg-type]
        return stepped.get("next")  # type: ignore[no-any-return]

    def outputs(self) -> tuple[float, bool, bool]:
        """Reward, terminated and truncated of the last step, from its row."""
        term, trunc = self.flags[self.k]  # (the row the last step wrote is the input now)
        if self.one_flag:
            return self.reward.item(), term.item(), False if trunc is None else trunc.item()
        return (
            self.reward.item(),
            term.item() if term.shape[0] == 1 else bool(term.any()),
            False if trunc is None else trunc.item() if trunc.shape[0] == 1 else bool(trunc.any()),
        )
