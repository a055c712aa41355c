"""The async rollout loop shared by every env (pools and transformed envs included)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio.lowlevel
import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from aenv._mdp import any_true, fast_stack, time_named, unravel
from aenv.envs._policy import make_policy
from aenv.exceptions import PoolError

if TYPE_CHECKING:
    from aenv.envs._common import EnvBase

__all__ = ["YIELD_EVERY", "call_policy", "rollout_policy", "run_rollout"]

#: A rollout lets the event loop run (other tasks, a cancel) at least once every this many
#: steps, however many of them complete without suspending (cheap sync envs).
YIELD_EVERY = 64


async def call_policy(policy: Callable[..., Any], td: TensorDictBase) -> TensorDictBase:
    """Apply a policy to ``td``: awaits async policies; a None result means "in place", and
    a new TensorDict (an out-of-place policy) is merged into ``td``, as TorchRL does, so the
    step keeps its observations and done flags."""
    out = policy(td)
    if inspect.isawaitable(out):
        out = await out
    if out is None or out is td:
        return td
    if not isinstance(out, TensorDictBase):
        raise TypeError(
            f"a rollout policy must return a TensorDict (or None, writing in place); got "
            f"{type(out).__name__}. Wrap plain modules in tensordict.nn.TensorDictModule."
        )
    return td.update(out)


def rollout_policy(env: EnvBase, policy: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """The callable a rollout runs for ``policy``: a plain callable on observation tensors
    (an ``nn.Module`` on the observation, say) is wrapped to read the observations and write
    the action (:func:`~aenv.envs._policy.make_policy`); one whose call it cannot tell is
    used as it is."""
    if policy is None:
        return None
    try:
        return make_policy(policy, env)
    except TypeError:
        if not callable(policy):
            raise
        return policy


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


async def run_rollout(
    env: EnvBase,
    max_steps: int,
    policy: Callable[..., Any] | None,
    callback: Callable[..., Any] | None,
    *,
    auto_reset: bool,
    auto_cast_to_device: bool,
    break_when_any_done: bool | None,
    break_when_all_done: bool | None,
    return_contiguous: bool | None,
    tensordict: TensorDictBase | None,
    set_truncated: bool,
) -> TensorDictBase:
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if break_when_any_done is None and break_when_all_done is None:
        break_when_any_done = True
    if break_when_any_done and break_when_all_done:
        raise ValueError("break_when_any_done and break_when_all_done cannot both be True")
    if auto_reset:
        if tensordict is not None:
            raise RuntimeError("tensordict cannot be passed when auto_reset=True")
    elif tensordict is None:
        raise RuntimeError("a tensordict is required when auto_reset=False")
    policy = rollout_policy(env, policy)
    if tensordict is not None and env._any_done_write_reset(tensordict):
        # a rollout going on from a given tensordict (the last step of another, say): what
        # it says is done is reset first, as TorchRL does; nothing else is
        tensordict = await env.reset(tensordict)
    if (
        callback is None
        and not auto_cast_to_device
        and not break_when_all_done
        and not set_truncated
        and return_contiguous
    ):
        whole = await env._rollout_whole(
            max_steps, policy, break_when_any_done=bool(break_when_any_done), tensordict=tensordict
        )
        if whole is not None:
            return time_named(whole)
    if auto_reset:
        tensordict = await env.reset()
    assert tensordict is not None
    if set_truncated and not any(unravel(k)[-1] == "truncated" for k in env.done_keys):
        raise RuntimeError(
            "set_truncated=True needs 'truncated' entries in the done spec; "
            "call env.add_truncated_keys() first"
        )
    # random actions: rand_action is plain and returns its input, so no call_policy
    rand_action = env.rand_action if policy is None else None
    # an env keeping EnvBase's step and step_and_maybe_reset: the loop calls their body
    # directly, and skips the action checks for actions that EnvBase.rand_action drew
    from aenv.envs._common import EnvBase as Base

    cls = type(env)
    plain = (
        cls.step is Base.step
        and cls.step_and_maybe_reset is Base.step_and_maybe_reset
        and cls.rand_action is Base.rand_action
    )
    device = env.device
    steps = _StepStore(bool(return_contiguous))
    try:
        await _loop(
            env,
            steps,
            tensordict,
            max_steps,
            policy,
            callback,
            rand_action,
            plain,
            auto_cast_to_device and device is not None,
            bool(break_when_any_done),
            bool(break_when_all_done),
        )
    except PoolError as err:
        # a pool's sub-env failed: the steps done before are the caller's, not lost
        if steps.pending or steps.chunks:
            err.rollout = time_named(steps.finish())
        raise
    if set_truncated:
        last = steps.last.get("next")
        for key in env.done_keys:
            key_t = unravel(key)
            if key_t[-1] in ("truncated", "done"):
                last.set(key, torch.ones_like(last.get(key)))
    return time_named(steps.finish())


async def _loop(
    env: EnvBase,
    steps: _StepStore,
    td: TensorDictBase,
    max_steps: int,
    policy: Callable[..., Any] | None,
    callback: Callable[..., Any] | None,
    rand_action: Callable[..., Any] | None,
    plain: bool,
    cast: bool,
    break_when_any_done: bool,
    break_when_all_done: bool,
) -> None:
    """The rollout's steps, appended to ``steps``."""
    device = env.device
    for i in range(max_steps):
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            await anyio.lowlevel.checkpoint()
        if break_when_all_done and i:
            td.set("_step", ~_done_mask(env, td))
        td = rand_action(td) if rand_action is not None else await call_policy(policy, td)  # type: ignore[arg-type]
        if cast:
            td = td.to(device)
        if break_when_any_done or break_when_all_done or i == max_steps - 1:
            # (the last step of a rollout that goes on through episode ends resets
            # nothing: the env stays where the step left it, as TorchRL's does)
            if plain:
                td = await env._step_checked(td, rand_action is None)
            else:
                td = await env.step(td)
            if break_when_all_done:
                td.pop("_step", None)
            steps.append(td)
            if callback is not None:
                res = callback(env, td)
                if inspect.isawaitable(res):
                    await res
            if i == max_steps - 1:
                break
            td = env._step_mdp(td)
            if break_when_any_done:
                if _any_done(env, td):
                    break
            elif bool(_done_mask(env, td).all()):
                break
        else:
            if plain:
                td, nxt = await env._rollout_step(td, rand_action is None)
            else:
                td, nxt = await env.step_and_maybe_reset(td)
            steps.append(td)
            if callback is not None:
                res = callback(env, td)
                if inspect.isawaitable(res):
                    await res
            if i == max_steps - 1:
                break
            td = nxt


class _StepStore:
    """A rollout's steps, stacked along a new trailing dim.

    Steps are stacked in chunks as they come, so a long rollout keeps few live objects (the
    garbage collector's cost grows with them); the newest step stays unstacked, so it can
    still be edited (``set_truncated``). Steps whose shapes vary (dynamic specs) end up in a
    lazy stack, as do all steps when ``contiguous`` is False.
    """

    CHUNK = 256

    def __init__(self, contiguous: bool) -> None:
        self.contiguous = contiguous
        self.pending: list[TensorDictBase] = []
        self.chunks: list[TensorDictBase] = []
        self.dim = 0

    @property
    def last(self) -> TensorDictBase:
        return self.pending[-1]

    def append(self, td: TensorDictBase) -> None:
        if not self.pending and not self.chunks:
            self.dim = td.batch_dims
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
