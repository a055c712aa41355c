"""TensorDictPrimer: entries (e.g. recurrent states) created at reset and carried along."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict import TensorDictBase

from aenv._mdp import NestedKey, unravel
from aenv.specs import Composite, TensorSpec
from aenv.transforms._base import Transform, reset_mask

__all__ = ["TensorDictPrimer"]


class TensorDictPrimer(Transform):
    """Adds entries to reset outputs and carries them through steps.

    On reset each primer gets ``default_value`` (a number, a per-key mapping, or a callable
    returning a tensor) or, with ``random=True``, a draw from its spec; partial resets prime
    only the reset elements. On steps, a primer missing from the base env's output is copied
    from the input (where a policy may have updated it, e.g. a recurrent state). Primers are
    added to the observation and state specs; spec shapes lacking the env's batch dims get
    them prepended.

    Args:
        primers: ``{key: spec}`` or a Composite (also accepted as keyword arguments).
        random: draw initial values from the specs.
        default_value: initial value(s) when not random.

    Example:
        >>> env = TransformedEnv(CountingEnv(), TensorDictPrimer(hidden=Unbounded((3,))))
        >>> (await env.reset())["hidden"]
        tensor([0., 0., 0.])
    """

    def __init__(
        self,
        primers: Mapping[NestedKey, TensorSpec] | Composite | None = None,
        random: bool = False,
        default_value: float | Mapping[NestedKey, Any] | Callable[..., Any] = 0.0,
        **kwargs: TensorSpec,
    ) -> None:
        super().__init__()
        items: dict[NestedKey, TensorSpec] = {}
        if primers is not None:
            src = primers.items(True, True) if isinstance(primers, Composite) else primers.items()
            items.update({k: v for k, v in src})
        items.update(kwargs)
        if not items:
            raise ValueError("TensorDictPrimer needs at least one primer spec")
        self.primers = items
        self.random = random
        self.default_value = default_value
        self._specs: dict[NestedKey, TensorSpec] = {}
        self._env_ndim = 0

    def _batched(self, spec: TensorSpec, batch: torch.Size) -> TensorSpec:
        if tuple(spec.shape[: len(batch)]) == tuple(batch) and len(spec.shape) > len(batch):
            return spec.clone()
        return spec.expand(*batch, *spec.shape)

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        batch = output_spec.shape
        self._env_ndim = len(batch)
        obs = output_spec["full_observation_spec"]
        self._specs = {}
        for key, spec in self.primers.items():
            full = self._batched(spec, batch)
            self._specs[key] = full
            obs[key] = full.clone()
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        state = input_spec["full_state_spec"]
        for key, spec in self._specs.items():
            state[key] = spec.clone()
        return input_spec

    def _initial(self, key: NestedKey, spec: TensorSpec, extra: torch.Size) -> torch.Tensor:
        if self.random:
            return spec.rand(extra)
        zero = spec.zero(extra)
        value = self.default_value
        if isinstance(value, Mapping):
            value = value.get(key, 0.0)
        if callable(value):
            return (
                torch.as_tensor(value(), dtype=zero.dtype, device=zero.device)
                .expand_as(zero)
                .clone()
            )
        return torch.full_like(zero, value)

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        extra = tensordict_reset.batch_size[: tensordict_reset.batch_dims - self._env_ndim]
        for key, spec in self._specs.items():
            value = self._initial(key, spec, extra)
            prev = tensordict.get(key, None)
            if isinstance(prev, torch.Tensor) and prev.shape == value.shape:
                mask = reset_mask(tensordict, unravel(key)[:-1], value)
                if mask is not None:
                    value = torch.where(mask, value, prev)
            tensordict_reset.set(key, value)
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for key in self._specs:
            if next_tensordict.get(key, None) is None:
                prev = tensordict.get(key, None)
                if prev is not None:
                    next_tensordict.set(key, prev)
        return next_tensordict

    def extra_repr(self) -> str:
        return f"primers={list(self.primers)}, random={self.random}"
