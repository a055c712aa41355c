"""ActionMask (keeps the action spec's mask in sync) and ConditionalSkip (skips steps)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase

from aenv._mdp import NestedKey
from aenv.specs import Composite
from aenv.transforms._base import Transform, reset_mask

__all__ = ["ActionMask", "ConditionalSkip"]


class ActionMask(Transform):
    """Copies the env's action mask output into its action spec after every reset and step.

    The base env outputs a boolean ``mask_key`` (shape of the action spec's mask); the
    transformed env's action spec (``Categorical`` / ``OneHot`` / multi-variants) is updated
    in place, so ``env.rand_action`` and spec-based random policies only draw allowed
    actions. In a batched env or pool, put this transform on the batched env itself, not on
    its sub-envs (the batched env's spec is its own copy).

    Args:
        action_key: the masked action.
        mask_key: the mask entry of the observations.

    Example:
        >>> env = TransformedEnv(masked_env, ActionMask())
        >>> td = await env.reset()
        >>> td = await env.rand_step(td)  # the action is always allowed
    """

    def __init__(
        self, action_key: NestedKey = "action", mask_key: NestedKey = "action_mask"
    ) -> None:
        super().__init__(in_keys=[action_key, mask_key])
        self.action_key = action_key
        self.mask_key = mask_key

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        spec = input_spec["full_action_spec"].get(self.action_key)
        if spec is None or not hasattr(spec, "update_mask"):
            raise ValueError(
                f"ActionMask needs a maskable (Categorical/OneHot) action spec at {self.action_key!r}, "
                f"got {type(spec).__name__}"
            )
        return input_spec

    def _update(self, mask: torch.Tensor) -> None:
        env = self.container
        if env is None:
            raise RuntimeError("ActionMask must belong to a TransformedEnv")
        spec = env.full_action_spec[self.action_key]
        spec.update_mask(mask.to(torch.bool))

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        mask = next_tensordict.get(self.mask_key, None)
        if mask is None:
            raise KeyError(f"ActionMask: {self.mask_key!r} is missing from the env's output")
        self._update(mask)
        return next_tensordict

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        mask = tensordict_reset.get(self.mask_key, None)
        if mask is None:
            raise KeyError(f"ActionMask: {self.mask_key!r} is missing from the reset output")
        prev = tensordict.get(self.mask_key, None)
        reset = reset_mask(tensordict, (), mask)
        if reset is not None and isinstance(prev, torch.Tensor) and prev.shape == mask.shape:
            mask = torch.where(reset, mask, prev)  # elements not reset keep their mask
        self._update(mask)
        return tensordict_reset


class ConditionalSkip(Transform):
    """Skips the base env's step where ``cond(tensordict)`` is True.

    ``cond`` gets the step input and returns a bool (or a batch-shaped bool tensor; it may
    be ``async``). Skipped elements keep their previous values (reward 0), and the forward
    transforms of the same TransformedEnv are skipped for them too; wrap the env in another
    TransformedEnv for transforms that must run on every step.

    Args:
        cond: ``True`` means "skip this step".

    Example:
        >>> middle = TransformedEnv(TransformedEnv(PendulumEnv(), StepCounter(step_count_key="inner")),
        ...                         ConditionalSkip(lambda td: td["step_count"] % 2 == 1))
        >>> env = TransformedEnv(middle, StepCounter())
        >>> r = await env.rollout(6)
        >>> r["inner"].squeeze(-1)  # every other step is skipped
        tensor([0, 1, 1, 2, 2, 3])
    """

    def __init__(self, cond: Callable[[TensorDictBase], Any]) -> None:
        super().__init__()
        self.cond = cond

    def _write(self, tensordict: TensorDictBase, skip: Any) -> TensorDictBase:
        skip_t = torch.as_tensor(skip, dtype=torch.bool, device=tensordict.device)
        bs = tensordict.batch_size
        if skip_t.shape != bs:
            if skip_t.numel() == 1:
                skip_t = skip_t.reshape(()).expand(bs)
            else:
                skip_t = skip_t.reshape(bs)
        step = ~skip_t
        prev = tensordict.get("_step", None)
        if prev is not None:
            step = step & prev.reshape(bs).to(torch.bool)
        tensordict.set("_step", step)
        return tensordict

    def _inv_call(self, tensordict: TensorDictBase) -> Any:
        skip = self.cond(tensordict)
        if inspect.isawaitable(skip):
            return self._inv_async(tensordict, skip)
        return self._write(tensordict, skip)

    async def _inv_async(self, tensordict: TensorDictBase, pending: Any) -> TensorDictBase:
        return self._write(tensordict, await pending)
