"""Batch and memory layout: BatchSizeTransform and PinMemoryTransform."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from aenv.specs import Composite
from aenv.transforms._base import Transform

__all__ = ["BatchSizeTransform", "PinMemoryTransform"]


class BatchSizeTransform(Transform):
    """Gives a batch-unlocked env (a stateless one such as :class:`~aenv.PendulumEnv`) a
    batch size of its own, so it can be driven like a batched env (rollouts, collectors).

    The transformed env's batch size becomes ``batch_size`` (which must end with the base
    env's own batch dims); its specs are expanded to it and a reset without input resets a
    batch of that size.

    Args:
        batch_size: the new batch size.

    Example:
        >>> env = TransformedEnv(PendulumEnv(), BatchSizeTransform([4]))
        >>> (await env.rollout(3)).batch_size
        torch.Size([4, 3])
    """

    def __init__(self, batch_size: Sequence[int] | torch.Size) -> None:
        super().__init__()
        self.batch_size = torch.Size(batch_size)
        self._base_batch: torch.Size | None = None

    def transform_env_batch_size(self, batch_size: torch.Size) -> torch.Size:
        new = self.batch_size
        if tuple(new[len(new) - len(batch_size) :]) != tuple(batch_size) or len(new) < len(
            batch_size
        ):
            raise ValueError(
                f"BatchSizeTransform: batch size {tuple(new)} must end with the env's own "
                f"batch size {tuple(batch_size)}"
            )
        env = self.container
        if env is not None and batch_size != new and env.base_env.batch_locked:
            raise ValueError(
                f"BatchSizeTransform needs a batch-unlocked base env; {type(env.base_env).__name__} "
                "is batch-locked"
            )
        self._base_batch = batch_size
        return new

    def _expand(self, spec: Composite) -> Composite:
        extra = self.batch_size[: len(self.batch_size) - len(spec.shape)]
        return spec.expand(*extra, *spec.shape) if extra else spec

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        return self._expand(output_spec)

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        return self._expand(input_spec)


class PinMemoryTransform(Transform):
    """Pins the memory of every reset and step output (page-locked host memory makes their
    copies to an accelerator faster and asynchronous).

    Needs an accelerator (CUDA) to pin for; without one it raises at construction rather
    than silently doing nothing.

    Example:
        >>> env = TransformedEnv(GymEnv("CartPole-v1"), PinMemoryTransform())
        >>> (await env.reset())["observation"].is_pinned()
        True
    """

    def __init__(self) -> None:
        super().__init__()
        if not torch.cuda.is_available():
            raise RuntimeError("PinMemoryTransform needs a CUDA device to pin memory for")

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return next_tensordict.pin_memory()

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        return tensordict_reset.pin_memory()
