"""Transforms that run extra env steps: FrameSkipTransform and NoopResetEnv.

Both step the transform's ``parent`` (the base env behind the transforms that come before
this one), awaiting it like any env, and use ``"_step"`` masks so that batch elements that
must not move (done ones, ones not being reset) stay where they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tensordict import TensorDictBase

from aenv._mdp import reduce_mask, step_mdp
from aenv.transforms._base import Transform
from aenv.transforms._t2_common import batch_mask, done_mask

if TYPE_CHECKING:
    from aenv.transforms._env import TransformedEnv

__all__ = ["FrameSkipTransform", "NoopResetEnv"]


def _parent_or_raise(t: Transform) -> TransformedEnv:
    parent = t.parent
    if parent is None:
        raise RuntimeError(
            f"{type(t).__name__} must belong to a TransformedEnv: it steps the env behind it"
        )
    return parent


def _step_mask(td: TensorDictBase) -> torch.Tensor | None:
    mask = td.get("_step", None)
    if mask is None:
        return None
    return reduce_mask(mask, (*td.batch_size, 1)).to(torch.bool).reshape(td.batch_size)


class FrameSkipTransform(Transform):
    """A frame-skip transform: each action is repeated ``frame_skip`` times.

    The rewards of the repeated steps are summed; the other outputs are those of the last
    step. A batch element that is done stops repeating (its later frames are skipped with a
    ``"_step"`` mask, so a batch-locked base env must honour ``"_step"``, as EnvBase-based
    envs do); a single env stops at once. Stateless envs work too: each repeat starts from
    the previous repeat's output. Place it first (next to the base env) so the transforms
    before it, which the repeats also run through, are few.

    Args:
        frame_skip: how many times each action is applied (>= 1).

    Example:
        >>> env = TransformedEnv(CountingEnv(max_steps=10), FrameSkipTransform(3))
        >>> td = await env.rand_step(await env.reset())
        >>> td["next", "observation"], td["next", "reward"]
        (tensor([3.]), tensor([3.]))
    """

    def __init__(self, frame_skip: int = 1) -> None:
        super().__init__()
        if int(frame_skip) < 1:
            raise ValueError(f"FrameSkipTransform: frame_skip must be >= 1, got {frame_skip}")
        self.frame_skip = int(frame_skip)
        self._last_input: TensorDictBase | None = None

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        # the step input as this transform sees it is exactly what the parent env expects
        self._last_input = tensordict.copy() if self.frame_skip > 1 else None
        return tensordict

    async def _step(
        self, tensordict: TensorDictBase, next_tensordict: TensorDictBase
    ) -> TensorDictBase:
        current = self._last_input
        self._last_input = None
        if self.frame_skip == 1 or current is None:
            return next_tensordict
        parent = _parent_or_raise(self)
        bs = next_tensordict.batch_size
        outer = _step_mask(current)
        rewards = {
            k: next_tensordict.get(k) for k in parent.reward_keys if k in next_tensordict.keys(True)
        }
        done_keys = parent.done_keys
        current = current.exclude("next", "_step")
        for _ in range(self.frame_skip - 1):
            active = ~done_mask(next_tensordict, done_keys, bs)
            if outer is not None:
                active = active & outer
            if not bool(active.any()):
                break
            nxt_in = step_mdp(
                current,
                _next=next_tensordict,
                exclude_action=False,
                reward_keys=parent.reward_keys,
                done_keys=done_keys,
                action_keys=parent.action_keys,
            )
            for key in parent.action_keys:  # the same action again
                value = current.get(key, None)
                if value is not None:
                    nxt_in.set(key, value)
            if not bool(active.all()):
                nxt_in.set("_step", active)
            stepped = await parent.step(nxt_in)
            next_tensordict = stepped.get("next")
            for key, total in rewards.items():
                rewards[key] = total + next_tensordict.get(key)
            current = nxt_in.exclude("_step", "next")
        for key, total in rewards.items():
            next_tensordict.set(key, total)
        return next_tensordict

    def extra_repr(self) -> str:
        return f"frame_skip={self.frame_skip}"


class NoopResetEnv(Transform):
    """Runs a series of random actions when an environment is reset.

    After the base env resets, ``noops`` random steps are taken (a number drawn uniformly in
    ``[1, noops]`` when ``random``), so that episodes start from varied states. Only the
    elements being reset move: the others are masked out with ``"_step"``. If an element is
    done during the noops, it is reset again and the series restarts (up to 10 times).

    Args:
        noops: number of random steps (upper bound when ``random``); default 30.
        random: draw the number of steps in ``[1, noops]`` on each reset (torch's global RNG).

    Example:
        >>> env = TransformedEnv(CountingEnv(max_steps=100), NoopResetEnv(3, random=False))
        >>> (await env.reset())["observation"]
        tensor([3.])
    """

    max_trials = 10

    def __init__(self, noops: int = 30, random: bool = True) -> None:
        super().__init__()
        if int(noops) < 0:
            raise ValueError(f"NoopResetEnv: noops must be >= 0, got {noops}")
        self.noops = int(noops)
        self.random = random

    def _draw(self) -> int:
        if self.random and self.noops > 0:
            return int(torch.randint(1, self.noops + 1, ()).item())
        return self.noops

    async def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        if self.noops == 0:
            return tensordict_reset
        parent = _parent_or_raise(self)
        bs = tensordict_reset.batch_size
        mask = batch_mask(tensordict, bs)
        done_keys = parent.done_keys
        current = tensordict_reset
        for _ in range(self.max_trials):
            n = self._draw()
            restarted = False
            for _ in range(n):
                step_in = parent.rand_action(current.copy())
                if mask is not None:
                    step_in.set("_step", mask)
                stepped = await parent.step(step_in)
                current = parent._step_mdp(stepped)
                done = done_mask(current, done_keys, bs)
                if mask is not None:
                    done = done & mask
                if bool(done.any()):
                    again = current.copy()
                    again.set("_reset", done.reshape(*bs, 1) if bs else done.reshape(1))
                    current = await parent.reset(again)
                    restarted = True
                    break
            if not restarted:
                return current
        raise RuntimeError(
            f"NoopResetEnv: the env was done during the noop steps {self.max_trials} times in a "
            f"row; use fewer noops (now {self.noops})"
        )

    def extra_repr(self) -> str:
        return f"noops={self.noops}, random={self.random}"
