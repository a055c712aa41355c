"""Reward transforms: RewardScaling and RewardClipping."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from aenv._mdp import NestedKey
from aenv.specs import Bounded, TensorSpec, Unbounded
from aenv.transforms._base import Transform

__all__ = ["RewardClipping", "RewardScaling"]


class RewardScaling(Transform):
    """An affine map of the reward: ``reward * scale + loc``, or ``(reward - loc) / scale``
    with ``standard_normal=True``.

    Args:
        loc: offset (buffer).
        scale: scale (buffer).
        in_keys: reward keys (default ``["reward"]``).
        out_keys: where to write (default: in place).
        standard_normal: use ``(reward - loc) / scale``.

    Example:
        >>> env = TransformedEnv(CountingEnv(), RewardScaling(loc=1.0, scale=0.5))
        >>> (await env.rollout(2))["next", "reward"].squeeze(-1)
        tensor([1.5000, 1.5000])
    """

    loc: torch.Tensor
    scale: torch.Tensor

    def __init__(
        self,
        loc: float | torch.Tensor,
        scale: float | torch.Tensor,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        standard_normal: bool = False,
    ) -> None:
        super().__init__(in_keys if in_keys is not None else ["reward"], out_keys)
        self.register_buffer("loc", torch.as_tensor(loc, dtype=torch.float32))
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32).clamp_min(1e-6))
        self.standard_normal = standard_normal

    def _apply_transform(self, reward: torch.Tensor) -> torch.Tensor:
        loc, scale = self.loc, self.scale
        out = (reward - loc) / scale if self.standard_normal else reward * scale + loc
        return out.to(reward.dtype)

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        if isinstance(spec, Bounded):
            a, b = self._apply_transform(spec.low), self._apply_transform(spec.high)
            return Bounded(
                torch.minimum(a, b),
                torch.maximum(a, b),
                shape=spec.shape,
                dtype=spec.dtype,
                device=spec.device,
            )
        return Unbounded(shape=spec.shape, dtype=spec.dtype, device=spec.device)


class RewardClipping(Transform):
    """Clips the reward to ``[clamp_min, clamp_max]`` (either bound may be None).

    With both bounds the reward spec becomes ``Bounded(clamp_min, clamp_max)``.

    Example:
        >>> env = TransformedEnv(PendulumEnv(), RewardClipping(-1.0, 0.0))
        >>> bool((await env.rollout(5))["next", "reward"].min() >= -1)
        True
    """

    def __init__(
        self,
        clamp_min: float | None = None,
        clamp_max: float | None = None,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        if clamp_min is not None and clamp_max is not None and clamp_min > clamp_max:
            raise ValueError("clamp_min must be <= clamp_max")
        super().__init__(in_keys if in_keys is not None else ["reward"], out_keys)
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max

    def _apply_transform(self, reward: torch.Tensor) -> torch.Tensor:
        return reward.clamp(self.clamp_min, self.clamp_max)

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        if isinstance(spec, Bounded):
            low = spec.low if self.clamp_min is None else spec.low.clamp_min(self.clamp_min)
            high = spec.high if self.clamp_max is None else spec.high.clamp_max(self.clamp_max)
            return Bounded(
                low.clamp_max(high), high, shape=spec.shape, dtype=spec.dtype, device=spec.device
            )
        if self.clamp_min is not None and self.clamp_max is not None:
            return Bounded(
                self.clamp_min,
                self.clamp_max,
                shape=spec.shape,
                dtype=spec.dtype,
                device=spec.device,
            )
        return spec

    def extra_repr(self) -> str:
        return f"clamp_min={self.clamp_min}, clamp_max={self.clamp_max}, in_keys={self.in_keys}"
