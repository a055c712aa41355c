"""Batch and memory layout: BatchSizeTransform and PinMemoryTransform."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from tensordict import TensorDict, TensorDictBase

from aenv.specs import Composite
from aenv.transforms._base import Transform

__all__ = ["BatchSizeTransform", "PinMemoryTransform"]


class BatchSizeTransform(Transform):
    """Changes the batch size an env shows: gives a batch-unlocked env (a stateless one such
    as :class:`~aenv.PendulumEnv`) a batch size of its own, or reshapes a batched env's.

    With ``batch_size``, the transformed env's batch size becomes ``batch_size`` (which must
    end with the base env's own batch dims); its specs are expanded to it and a reset without
    input resets a batch of that size. With ``reshape_fn`` (a function of a tensordict that
    only reshapes its batch dims: ``td.reshape(-1)``, ``td.unsqueeze(0)``...), outputs and
    specs are reshaped by it and inputs reshaped back to the base env's batch size.

    Args:
        batch_size: the new batch size (batch-unlocked base envs).
        reshape_fn: a batch reshape (any base env); exclusive with ``batch_size``.

    Example:
        >>> env = TransformedEnv(PendulumEnv(), BatchSizeTransform([4]))
        >>> (await env.rollout(3)).batch_size
        torch.Size([4, 3])
        >>> flat = TransformedEnv(CountingEnv(batch_size=(2, 3)),
        ...                       BatchSizeTransform(reshape_fn=lambda td: td.reshape(-1)))
        >>> flat.batch_size
        torch.Size([6])
    """

    def __init__(
        self,
        batch_size: Sequence[int] | torch.Size | None = None,
        *,
        reshape_fn: Callable[[TensorDictBase], TensorDictBase] | None = None,
    ) -> None:
        super().__init__()
        if (batch_size is None) == (reshape_fn is None):
            raise ValueError("BatchSizeTransform takes one of batch_size and reshape_fn")
        self.batch_size = torch.Size(batch_size) if batch_size is not None else None
        self.reshape_fn = reshape_fn
        self._base_batch = torch.Size()
        self._new_batch = torch.Size()

    def transform_env_batch_size(self, batch_size: torch.Size) -> torch.Size:
        self._base_batch = batch_size
        if self.reshape_fn is not None:
            new = self.reshape_fn(TensorDict({}, batch_size=batch_size)).batch_size
            if new.numel() != batch_size.numel():
                raise ValueError(
                    f"BatchSizeTransform: reshape_fn maps batch size {tuple(batch_size)} to "
                    f"{tuple(new)}, which does not hold the same number of elements"
                )
            self._new_batch = new
            return new
        assert self.batch_size is not None
        new = self.batch_size
        if len(new) < len(batch_size) or tuple(new[len(new) - len(batch_size) :]) != tuple(
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
                "is batch-locked (reshape a batched env with reshape_fn)"
            )
        self._new_batch = new
        return new

    def _map_spec(self, spec: Composite) -> Composite:
        if self.reshape_fn is not None:
            return spec.reshape(*self._new_batch)  # type: ignore[no-any-return]
        extra = self._new_batch[: len(self._new_batch) - len(spec.shape)]
        return spec.expand(*extra, *spec.shape) if extra else spec

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        return self._map_spec(output_spec)

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        return self._map_spec(input_spec)

    # the reshape form maps data both ways; the batch_size form needs no data change
    def _outward(self, td: TensorDictBase) -> TensorDictBase:
        return self.reshape_fn(td) if self.reshape_fn is not None else td

    def _inward(self, td: TensorDictBase) -> TensorDictBase:
        if self.reshape_fn is None or td.batch_size == self._base_batch:
            return td
        return td.reshape(*self._base_batch)

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        return self._outward(tensordict_reset)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._outward(next_tensordict)

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._inward(tensordict)

    def _reset_env_preprocess(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._inward(tensordict)

    @property
    def _needs_inv(self) -> bool:
        return self.reshape_fn is not None


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
