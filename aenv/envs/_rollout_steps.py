"""The per-step parts of the rollout loop (:mod:`aenv.envs._rollout`): the random actions it
draws (:class:`_Draws`, a chunk of steps at a time through the action specs' own ``rand``, the
same way whichever store keeps the steps, so all give equal results) and the store that keeps
steps as TensorDicts (:class:`_TensorDicts`: callbacks, partial steps, state kept at the
root, nested or non-tensor data), stacked along the time dim a chunk at a time
(:class:`_StepStore`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from aenv._mdp import any_true, fast_stack, put, unravel

if TYPE_CHECKING:
    from aenv.envs._common import EnvBase

__all__ = ["_Draws", "_StepStore", "_TensorDicts", "_any_done", "_done_mask"]

# random actions are drawn this many steps at a time at first, then twice as many each
# chunk up to _DRAW_MAX (a rollout that stops at its first done draws few it does not use)
_DRAW_MIN = 16
_DRAW_MAX = 1024
#: and at most this many elements per action leaf: torch runs an op on its intra-op threads
#: from 32k elements (see :func:`aenv.envs._rowplan.serial_copy`)
_DRAW_ELEMENTS = 16384


def _done_mask(env: EnvBase, td: TensorDictBase) -> torch.Tensor:
    """Per batch element: is any done flag (at any level) set? Shape ``td.batch_size``."""
    out = torch.zeros(td.batch_size, dtype=torch.bool, device=td.device)
    for key in env._done_flag_keys:
        flag = td.get(key, None)
        if flag is not None:
            out = out | flag.reshape(*td.batch_size, -1).any(-1)
    return out


def _any_done(env: EnvBase, td: TensorDictBase) -> bool:
    for key in env._done_flag_keys:
        flag = td.get(key, None)
        if flag is not None and any_true(flag):
            return True
    return False


class _Draws:
    """Random actions for a rollout, drawn through each action spec's own ``rand`` a chunk
    of steps at a time (one call per key and chunk instead of one per key and step); the
    same actions whichever store keeps the steps."""

    def __init__(self, env: EnvBase, max_steps: int) -> None:
        self.specs = [(key, spec) for key, spec, _ in env._action_checks]
        self.left = max_steps
        per_step = max((spec.shape.numel() for _, spec in self.specs), default=1)
        #: the largest chunk: _DRAW_MAX steps, fewer where they hold over _DRAW_ELEMENTS
        self.most = max(1, min(_DRAW_MAX, _DRAW_ELEMENTS // max(per_step, 1)))
        self.size = _DRAW_MIN
        self.start = self.end = 0
        self.rows: list[tuple[Any, tuple[torch.Tensor, ...]]] = []
        self.current: dict[Any, torch.Tensor] = {}

    @staticmethod
    def make(env: EnvBase, td: TensorDictBase, max_steps: int) -> _Draws | None:
        """The draws for ``env``, or None where ``env.rand_action`` must draw each step: an
        env replacing it, masked actions (a mask may change from step to step), dynamic or
        non-tensor action specs, an input with batch dims beyond the env's."""
        if not env._rand_from_specs or env._extra_dims(td):
            return None
        for _, spec, tensorlike in env._action_checks:
            if not tensorlike or getattr(spec, "mask", None) is not None or -1 in spec.shape:
                return None
        return _Draws(env, max_steps)

    def chunk(self, t: int) -> dict[Any, torch.Tensor]:
        """Draw the actions of steps ``t`` to ``t + k`` (k the chunk size): key -> ``(k, ...)``."""
        k = min(self.size, self.left, self.most)
        self.size = min(self.size * 2, self.most)
        self.left -= k
        self.start, self.end = t, t + k
        self.current = {key: spec.rand((k,)) for key, spec in self.specs}
        return self.current

    def row(self, t: int) -> list[tuple[Any, torch.Tensor]]:
        """Step ``t``'s actions (key, value), steps taken in order."""
        if t >= self.end:
            self.rows = [(key, value.unbind(0)) for key, value in self.chunk(t).items()]
        i = t - self.start
        return [(key, values[i]) for key, values in self.rows]


class _TensorDicts:
    """Steps kept as TensorDicts (the input with its ``"next"``, a :class:`_StepStore`)."""

    def __init__(
        self,
        env: EnvBase,
        contiguous: bool,
        plain: bool,
        random: bool,
        draws: _Draws | None,
        callback: Callable[..., Any] | None,
        cast: bool,
    ) -> None:
        self.env = env
        self.contiguous = contiguous
        self.plain = plain
        self.draws = draws
        self.callback = callback
        self.cast = cast
        # actions drawn from the action specs (by the draws or EnvBase.rand_action) pass
        # the action checks by construction: only a policy's, or another rand_action's,
        # are checked
        self.check = not random or not env._rand_from_specs
        self.steps = _StepStore(contiguous)
        self.stash: TensorDictBase | None = None
        self.drawn = 0  # (random actions are written into each step's input: see act)

    @property
    def count(self) -> int:
        return self.steps.count

    def act(self, td: TensorDictBase, t: int) -> TensorDictBase:
        """Step ``t``'s random actions, written into ``td``."""
        draws = self.draws
        if draws is None:
            return self.env.rand_action(td)
        for key, value in draws.row(t):
            if type(key) is str:
                put(td, key, value)
            else:
                td.set(key, value)
        return td

    async def step(self, td: TensorDictBase, t: int, reset: bool) -> tuple[TensorDictBase, bool]:
        env = self.env
        if self.cast:
            td = td.to(env.device)  # type: ignore[arg-type]
        check = self.check
        if reset:
            if self.plain:
                td = await env._step_checked(td, check)
                nxt = await env._reset_into(td, None)
                assert not isinstance(nxt, bool)
            else:
                td, nxt = await env.step_and_maybe_reset(td)
            self.stash = nxt
        else:
            td = await (env._step_checked(td, check) if self.plain else env.step(td))
            td.pop("_step", None)
        self.steps.append(td)
        if self.callback is not None:
            res = self.callback(env, td)
            if inspect.isawaitable(res):
                await res
        return td, False if reset else _any_done(env, td.get("next"))

    def advance(self, td: TensorDictBase, t: int) -> TensorDictBase:
        """The next step's input: what ``step_and_maybe_reset`` gave, or ``step_mdp``."""
        if self.stash is not None:
            nxt, self.stash = self.stash, None
            return nxt
        return self.env._step_mdp(td)

    async def reset(self, td: TensorDictBase, t: int) -> TensorDictBase:
        return self.advance(td, t)  # (step_and_maybe_reset reset what the step ended)

    def adopt(self, td: TensorDictBase, nxt: TensorDictBase | None) -> tuple[TensorDictBase, bool]:
        """Keep a step taken elsewhere (by rows that could not hold it): ``td`` with its
        ``"next"``, and the next input ``nxt`` when the step reset what it ended (None when
        no reset was asked); as :meth:`step` returns."""
        self.steps.append(td)
        self.stash = nxt
        return td, False if nxt is not None else _any_done(self.env, td.get("next"))

    def close(self) -> None:
        """Nothing held (see :meth:`aenv.envs._rollout_batch._BatchRows.close`)."""

    def set_truncated(self) -> None:
        """Mark the last step truncated (and done) wherever the done spec has the entries."""
        last = self.steps.pending[-1].get("next")
        for key in self.env.done_keys:
            if unravel(key)[-1] in ("truncated", "done"):
                last.set(key, torch.ones_like(last.get(key)))

    def finish(self) -> TensorDictBase:
        return self.steps.finish()


class _StepStore:
    """Steps stacked along a new trailing dim in chunks as they come, so a long rollout
    keeps few live objects (the garbage collector's cost grows with them); the newest step
    stays unstacked, so it can still be edited (``set_truncated``). Steps whose shapes vary
    (dynamic specs) end up in a lazy stack, as do all steps when ``contiguous`` is False."""

    CHUNK = 256

    def __init__(self, contiguous: bool) -> None:
        self.contiguous = contiguous
        self.pending: list[TensorDictBase] = []
        self.chunks: list[TensorDictBase] = []
        self.dim = 0
        self.count = 0

    def append(self, td: TensorDictBase) -> None:
        if not self.count:
            self.dim = td.batch_dims
        self.count += 1
        self.pending.append(td)
        if self.contiguous and len(self.pending) > self.CHUNK:
            head = self.pending[: self.CHUNK]
            try:
                self.chunks.append(_stack(head, self.dim))
            except RuntimeError:
                self._go_lazy()
                return
            del self.pending[: self.CHUNK]

    def _go_lazy(self) -> None:
        self.contiguous = False
        unbound = [t for chunk in self.chunks for t in chunk.unbind(self.dim)]
        self.pending = unbound + self.pending
        self.chunks = []

    def finish(self) -> TensorDictBase:
        if self.contiguous:
            try:
                tail = _stack(self.pending, self.dim)
                if not self.chunks:
                    return tail
                return torch.cat([*self.chunks, tail], self.dim)  # type: ignore[arg-type, return-value]
            except RuntimeError:
                self._go_lazy()
        return LazyStackedTensorDict.lazy_stack(self.pending, dim=self.dim)


def _stack(tds: list[TensorDictBase], dim: int) -> TensorDictBase:
    out = fast_stack(tds, dim)
    if out is None:
        return torch.stack(tds, dim)  # type: ignore[arg-type, return-value]
    return out
