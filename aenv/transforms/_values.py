"""Element-wise value transforms: ClipTransform, SignTransform, BinarizeReward."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from aenv._mdp import NestedKey
from aenv.exceptions import SpecError
from aenv.specs import Binary, Bounded, TensorSpec
from aenv.transforms._base import Transform

__all__ = ["BinarizeReward", "ClipTransform", "SignTransform"]

Keys = Sequence[NestedKey] | NestedKey | None


def _as_bound(value: float | torch.Tensor | None, default: float) -> torch.Tensor:
    if value is None:
        return torch.tensor(default, dtype=torch.float64)
    return torch.as_tensor(value, dtype=torch.float64)


class ClipTransform(Transform):
    """A transform to clip input (state, action) or output (observation, reward) values.

    Forward on ``in_keys`` (outputs), inverse on ``in_keys_inv`` (inputs, before the base
    env sees them). Specs become ``Bounded`` on the intersection of ``[low, high]`` with the
    spec's own bounds, if any.

    Args:
        in_keys, out_keys: outputs to clip.
        in_keys_inv, out_keys_inv: inputs to clip.
        low: lower bound (None: none); a number or a tensor broadcast to the entry.
        high: upper bound (None: none).

    Example:
        >>> t = ClipTransform(in_keys=["reward"], low=-0.5, high=0.5)
        >>> env = TransformedEnv(CountingEnv(), t)
        >>> (await env.rand_step(await env.reset()))["next", "reward"]
        tensor([0.5000])
    """

    low: torch.Tensor
    high: torch.Tensor

    def __init__(
        self,
        in_keys: Keys = None,
        out_keys: Keys = None,
        in_keys_inv: Keys = None,
        out_keys_inv: Keys = None,
        *,
        low: float | torch.Tensor | None = None,
        high: float | torch.Tensor | None = None,
    ) -> None:
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        if low is None and high is None:
            raise ValueError("ClipTransform: give low, high or both")
        self.register_buffer("low", _as_bound(low, -math.inf))
        self.register_buffer("high", _as_bound(high, math.inf))
        if bool((self.low > self.high).any()):
            raise ValueError(f"ClipTransform: low ({low}) must not exceed high ({high})")

    def _clip(self, value: torch.Tensor) -> torch.Tensor:
        low = self.low.to(value.device)
        high = self.high.to(value.device)
        if value.is_floating_point():
            return torch.clamp(value, low.to(value.dtype), high.to(value.dtype))
        info = torch.iinfo(value.dtype)
        lo = low.clamp(info.min, info.max).ceil().to(value.dtype)
        hi = high.clamp(info.min, info.max).floor().to(value.dtype)
        return torch.clamp(value, lo, hi)

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return self._clip(value)

    def _inv_apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return self._clip(value)

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        dtype = spec.dtype
        if not isinstance(dtype, torch.dtype) or dtype == torch.bool or dtype.is_complex:
            raise SpecError(f"ClipTransform cannot clip {spec.describe()}")
        shape = spec.shape
        try:
            low = torch.broadcast_to(self.low, shape)
            high = torch.broadcast_to(self.high, shape)
        except RuntimeError as exc:
            raise SpecError(f"ClipTransform: bounds do not broadcast to {tuple(shape)}") from exc
        if isinstance(spec, Bounded):
            low = torch.maximum(low, spec.low.to(torch.float64))
            high = torch.minimum(high, spec.high.to(torch.float64))
        if not dtype.is_floating_point:
            info = torch.iinfo(dtype)
            low = low.clamp(info.min, info.max).ceil()
            high = high.clamp(info.min, info.max).floor()
        if bool((low > high).any()):
            raise SpecError(
                f"ClipTransform: [{self.low}, {self.high}] does not meet the bounds of {spec.describe()}"
            )
        return Bounded(low.to(dtype), high.to(dtype), shape=shape, dtype=dtype, device=spec.device)

    _inv_transform_spec = _transform_spec

    def extra_repr(self) -> str:
        return f"low={self.low.tolist()}, high={self.high.tolist()}, {super().extra_repr()}"


class SignTransform(Transform):
    """A transform to compute the signs of TensorDict values (-1, 0 or 1, same dtype).

    Forward on ``in_keys`` (e.g. rewards, as in Atari reward clipping), inverse on
    ``in_keys_inv``. Forward specs become ``Bounded(-1, 1)``.

    Args:
        in_keys, out_keys: outputs to map.
        in_keys_inv, out_keys_inv: inputs to map before the base env sees them.

    Example:
        >>> env = TransformedEnv(PendulumEnv(), SignTransform(in_keys=["reward"]))
        >>> r = await env.rollout(3)
        >>> set(r["next", "reward"].unique().tolist()) <= {-1.0, 0.0}
        True
    """

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return torch.sign(value)

    def _inv_apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return torch.sign(value)

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        dtype = spec.dtype
        if not isinstance(dtype, torch.dtype) or dtype == torch.bool or dtype.is_complex:
            raise SpecError(f"SignTransform cannot map {spec.describe()}")
        low = 0 if not dtype.is_signed and not dtype.is_floating_point else -1
        return Bounded(low, 1, shape=spec.shape, dtype=dtype, device=spec.device)


class BinarizeReward(Transform):
    """Maps the reward to a binary value (0 or 1) if the reward is null or non-null, respectively.

    The result is int8 of the reward's shape (whose last dim must be 1), with a
    ``Binary(n=1)`` spec.

    Args:
        in_keys: reward entries (default ``["reward"]``); out_keys: where to write (in place).

    Example:
        >>> env = TransformedEnv(CountingEnv(), BinarizeReward())
        >>> (await env.rand_step(await env.reset()))["next", "reward"]
        tensor([1], dtype=torch.int8)
    """

    def __init__(self, in_keys: Keys = None, out_keys: Keys = None) -> None:
        super().__init__(["reward"] if in_keys is None else in_keys, out_keys)

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        if not value.ndim or value.shape[-1] != 1:
            raise ValueError(
                f"BinarizeReward: the reward's last dim must be 1, got shape {tuple(value.shape)}"
            )
        return (value != 0).to(torch.int8)

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        if not spec.ndim or spec.shape[-1] != 1:
            raise SpecError(
                f"BinarizeReward: the reward's last dim must be 1, got {spec.describe()}"
            )
        return Binary(n=1, shape=spec.shape, dtype=torch.int8, device=spec.device)
