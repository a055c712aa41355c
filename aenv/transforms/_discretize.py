"""ActionDiscretizer: a discrete action space over a continuous (Bounded) one."""

from __future__ import annotations

import enum
from collections.abc import Sequence

import torch

from aenv._mdp import NestedKey, unravel
from aenv.exceptions import SpecError
from aenv.specs import (
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    OneHot,
    TensorSpec,
)
from aenv.transforms._base import Transform

__all__ = ["ActionDiscretizer"]


class _SamplingStrategy(enum.IntEnum):
    """Which continuous value stands for an interval."""

    MEDIAN = 0
    LOW = 1
    HIGH = 2
    RANDOM = 3


class ActionDiscretizer(Transform):
    """A transform to discretize a continuous action space.

    Each dim of a ``Bounded`` action of the base env is cut into ``num_intervals`` equal
    intervals; the outer action picks one interval per dim, and the inverse pass turns it
    into a continuous action: the interval's middle (``MEDIAN``, the default), its lower or
    upper end (``LOW`` / ``HIGH``) or a uniform draw inside it (``RANDOM``).

    With ``categorical=True`` (default) the outer action holds interval indices: a
    ``Categorical(n)`` of the action's shape, or a ``MultiCategorical`` when the dims have
    different counts. Otherwise it is one-hot: ``OneHot(n)`` for a single dim, else a
    ``MultiOneHot`` (one segment per dim).

    Args:
        num_intervals: intervals per dim: an int, or one per action dim.
        action_key: the base env's continuous action entry (default ``"action"``).
        out_action_key: the outer discrete action entry (default: ``action_key``).
        sampling: an ``ActionDiscretizer.SamplingStrategy`` (default ``MEDIAN``).
        categorical: indices (True) or one-hot (False) outer actions.

    Example:
        >>> env = TransformedEnv(PendulumEnv(), ActionDiscretizer(5))
        >>> env.action_spec
        Categorical(shape=(1,), ..., n=5)
        >>> td = await env.rand_step(await env.reset())  # torques in {-1.6, -0.8, 0, 0.8, 1.6}
    """

    SamplingStrategy = _SamplingStrategy

    def __init__(
        self,
        num_intervals: int | Sequence[int] | torch.Tensor,
        action_key: NestedKey = "action",
        out_action_key: NestedKey | None = None,
        sampling: _SamplingStrategy | None = None,
        categorical: bool = True,
    ) -> None:
        out_action_key = action_key if out_action_key is None else out_action_key
        super().__init__(in_keys_inv=[action_key], out_keys_inv=[out_action_key])
        n = torch.as_tensor(num_intervals, dtype=torch.int64)
        if n.ndim > 1 or bool((n < 1).any()):
            raise ValueError(f"ActionDiscretizer: num_intervals must be >= 1, got {num_intervals}")
        self.num_intervals = n
        self.action_key = action_key
        self.out_action_key = out_action_key
        self.sampling = (
            _SamplingStrategy.MEDIAN if sampling is None else _SamplingStrategy(sampling)
        )
        self.categorical = categorical
        self._low: torch.Tensor | None = None
        self._high: torch.Tensor | None = None
        self._dtype: torch.dtype | None = None

    # ------------------------------------------------------------------ helpers
    def _counts(self, dims: int) -> list[int]:
        n = self.num_intervals
        if n.ndim == 0:
            return [int(n)] * dims
        if n.numel() != dims:
            raise SpecError(
                f"ActionDiscretizer: {n.numel()} interval counts for an action with {dims} dims"
            )
        return [int(v) for v in n.tolist()]

    def _indices(self, action: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Interval indices (..., dims) from the outer action (indices or one-hot)."""
        if self.categorical:
            return action.long()
        if len(counts) == 1 and action.shape[-1] == counts[0]:
            return action.long().argmax(-1, keepdim=True)
        parts = action.split(counts, dim=-1)
        return torch.stack([p.long().argmax(-1) for p in parts], -1)

    # ------------------------------------------------------------------ inverse pass
    def _inv_apply_transform(self, action: torch.Tensor) -> torch.Tensor:
        if self._low is None or self._high is None or self._dtype is None:
            raise RuntimeError(
                "ActionDiscretizer: the action bounds are unknown; add the transform to an env first"
            )
        counts = self._counts(self._low.shape[-1])
        idx = self._indices(action, counts)
        n = torch.tensor(counts, dtype=torch.float64, device=idx.device)
        if self.sampling == _SamplingStrategy.MEDIAN:
            offset: torch.Tensor | float = 0.5
        elif self.sampling == _SamplingStrategy.LOW:
            offset = 0.0
        elif self.sampling == _SamplingStrategy.HIGH:
            offset = 1.0
        else:
            offset = torch.rand(idx.shape, dtype=torch.float64, device=idx.device)
        low = self._low.to(device=idx.device, dtype=torch.float64)
        high = self._high.to(device=idx.device, dtype=torch.float64)
        frac = (idx.clamp(min=0).to(torch.float64) + offset) / n
        value = low + frac.clamp(0.0, 1.0) * (high - low)
        value = torch.minimum(torch.maximum(value, low), high)
        return value.to(self._dtype)

    # ------------------------------------------------------------------ specs
    def _discrete_spec(self, spec: TensorSpec) -> TensorSpec:
        if not isinstance(spec, Bounded) or not spec.dtype.is_floating_point:
            raise SpecError(
                f"ActionDiscretizer needs a continuous Bounded action spec, got {spec.describe()}"
            )
        if not bool(torch.isfinite(spec.low).all() and torch.isfinite(spec.high).all()):
            raise SpecError("ActionDiscretizer needs finite action bounds")
        if spec.ndim == 0:
            raise SpecError("ActionDiscretizer needs an action with at least one dim")
        self._low = spec.low.clone()
        self._high = spec.high.clone()
        self._dtype = spec.dtype
        counts = self._counts(spec.shape[-1])
        batch = tuple(spec.shape[:-1])
        dims = spec.shape[-1]
        same = len(set(counts)) == 1
        if self.categorical:
            if same:
                return Categorical(counts[0], shape=spec.shape, device=spec.device)
            return MultiCategorical(counts, shape=spec.shape, device=spec.device)
        if dims == 1:
            return OneHot(counts[0], shape=(*batch, counts[0]), device=spec.device)
        return MultiOneHot(counts, shape=(*batch, sum(counts)), device=spec.device)

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        if self.action_key not in action_spec:
            raise SpecError(
                f"ActionDiscretizer: {self.action_key!r} is not in the action spec "
                f"{list(action_spec.keys(True, True))}"
            )
        new = self._discrete_spec(action_spec[self.action_key])
        if unravel(self.action_key) != unravel(self.out_action_key):
            del action_spec[self.action_key]
        action_spec[self.out_action_key] = new
        return action_spec

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        return state_spec

    def extra_repr(self) -> str:
        return (
            f"num_intervals={self.num_intervals.tolist()}, action_key={self.action_key!r}, "
            f"out_action_key={self.out_action_key!r}, sampling={self.sampling.name}, "
            f"categorical={self.categorical}"
        )
