"""Casting transforms: DTypeCastTransform, DoubleToFloat, DeviceCastTransform."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from aenv._mdp import NestedKey
from aenv.specs import Bounded, Composite, TensorSpec
from aenv.transforms._base import Transform

__all__ = ["DTypeCastTransform", "DeviceCastTransform", "DoubleToFloat"]


def cast_spec(spec: TensorSpec, dtype: torch.dtype) -> TensorSpec:
    """``spec`` with another dtype (Bounded bounds are cast too)."""
    if spec.dtype == dtype:
        return spec
    if isinstance(spec, Bounded):
        return Bounded(
            spec.low.to(dtype),
            spec.high.to(dtype),
            shape=spec.shape,
            device=spec.device,
            dtype=dtype,
        )
    return spec.to(dtype)


class DTypeCastTransform(Transform):
    """Casts entries from ``dtype_in`` (inside, the base env) to ``dtype_out`` (outside).

    Forward: ``in_keys`` outputs go from ``dtype_in`` to ``dtype_out``. Inverse: the outer
    ``out_keys_inv`` inputs (``dtype_out``) go back to ``dtype_in`` under ``in_keys_inv``
    before the base env reads them (on steps, and state entries on resets). With neither
    ``in_keys`` nor ``in_keys_inv`` given, every observation and reward of ``dtype_in`` is
    cast forward and every action and state of ``dtype_in`` is cast on the inverse side.

    Args:
        dtype_in: the base env's dtype.
        dtype_out: the dtype seen outside.
        in_keys, out_keys, in_keys_inv, out_keys_inv: see :class:`Transform`.

    Example:
        >>> env = TransformedEnv(base_env, DTypeCastTransform(torch.float64, torch.float32,
        ...                                                   in_keys=["observation"]))
    """

    def __init__(
        self,
        dtype_in: torch.dtype,
        dtype_out: torch.dtype,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        self.dtype_in = dtype_in
        self.dtype_out = dtype_out
        self._auto = in_keys is None and in_keys_inv is None

    @property
    def _needs_inv(self) -> bool:
        return self._auto or bool(self.in_keys_inv)

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value.to(self.dtype_out)

    def _inv_apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value.to(self.dtype_in)

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        return cast_spec(spec, self.dtype_out)

    # the inner input spec maps to the outer one as outputs do
    _inv_transform_spec = _transform_spec

    def _keys_of_dtype(self, *specs: Composite) -> list[NestedKey]:
        keys: list[NestedKey] = []
        for spec in specs:
            for key, leaf in spec.items(True, True):
                if leaf.dtype == self.dtype_in:
                    keys.append(key)
        return keys

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        if self._auto:
            self.in_keys = self._keys_of_dtype(
                output_spec["full_observation_spec"], output_spec["full_reward_spec"]
            )
            self.out_keys = list(self.in_keys)
        return super().transform_output_spec(output_spec)

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        if self._auto:
            self.in_keys_inv = self._keys_of_dtype(
                input_spec["full_action_spec"], input_spec["full_state_spec"]
            )
            self.out_keys_inv = list(self.in_keys_inv)
            # state entries also come out of resets: cast them there too
            state_keys = self._keys_of_dtype(input_spec["full_state_spec"])
            self.in_keys = [*self.in_keys, *(k for k in state_keys if k not in self.in_keys)]
            self.out_keys = list(self.in_keys)
        return super().transform_input_spec(input_spec)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> Any:
        return self._apply_keys(next_tensordict, strict=not self._auto)

    def _reset_env_preprocess(self, tensordict: TensorDictBase) -> TensorDictBase:
        # state entries travel into the base env's reset: cast them back as on steps
        return self._inv_call(tensordict)

    def extra_repr(self) -> str:
        return f"{self.dtype_in} -> {self.dtype_out}, {super().extra_repr()}"


class DoubleToFloat(DTypeCastTransform):
    """Casts float64 entries of the base env to float32 (and float32 inputs back to float64).

    Example:
        >>> env = TransformedEnv(base_env, DoubleToFloat(in_keys=["observation"],
        ...                                              in_keys_inv=["action"]))
        >>> env.action_spec.dtype  # the base env steps with float64 actions
        torch.float32
    """

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        super().__init__(torch.float64, torch.float32, in_keys, out_keys, in_keys_inv, out_keys_inv)


class DeviceCastTransform(Transform):
    """Moves outputs to ``device`` and inputs back to the base env's device.

    Without keys the whole tensordict moves; with keys only those entries do. The
    transformed env's device (and its specs') becomes ``device``.

    Args:
        device: the device seen outside.
        orig_device: the base env's device (default: the base env's own, at spec time).
        in_keys, out_keys, in_keys_inv, out_keys_inv: restrict the move to these entries.

    Example:
        >>> env = TransformedEnv(PendulumEnv(device="cpu"), DeviceCastTransform("cuda"))
        >>> (await env.reset())["th"].device.type
        'cuda'
    """

    def __init__(
        self,
        device: torch.device | str | int,
        orig_device: torch.device | str | int | None = None,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        super().__init__(in_keys, out_keys, in_keys_inv, out_keys_inv)
        self.device = torch.device(device)
        self.orig_device = torch.device(orig_device) if orig_device is not None else None
        self._whole = not self.in_keys and not self.in_keys_inv

    @property
    def _needs_inv(self) -> bool:
        return self.orig_device is not None and (self._whole or bool(self.in_keys_inv))

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value.to(self.device, non_blocking=True)

    def _inv_apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        return value.to(self.orig_device, non_blocking=True)

    def _call(self, next_tensordict: TensorDictBase) -> Any:
        if self._whole:
            return next_tensordict.to(self.device, non_blocking=True)
        return super()._call(next_tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> Any:
        if self._whole:
            return tensordict_reset.to(self.device, non_blocking=True)
        return self._apply_keys(tensordict_reset, strict=False)

    def _inv_call(self, tensordict: TensorDictBase) -> Any:
        if self.orig_device is None:
            return tensordict
        if self._whole:
            return tensordict.to(self.orig_device, non_blocking=True)
        return super()._inv_call(tensordict)

    def _reset_env_preprocess(self, tensordict: TensorDictBase) -> Any:
        return self._inv_call(tensordict)

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        return spec.to(self.device)

    _inv_transform_spec = _transform_spec

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        if self.orig_device is None:
            dev = output_spec.device
            self.orig_device = dev if dev is not None else torch.device("cpu")
        if self._whole:
            return output_spec.to(self.device)  # type: ignore[return-value]
        return super().transform_output_spec(output_spec)

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        if self._whole:
            return input_spec.to(self.device)  # type: ignore[return-value]
        return super().transform_input_spec(input_spec)

    def extra_repr(self) -> str:
        return f"device={self.device}, orig_device={self.orig_device}"
