"""Auto-resetting envs: AutoResetTransform and AutoResetEnv (``auto_reset=True`` env argument)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from aenv._mdp import NestedKey, pad_mask, unravel
from aenv.envs._common import EnvBase
from aenv.specs import Composite
from aenv.transforms._base import Transform
from aenv.transforms._compose import Compose
from aenv.transforms._env import TransformedEnv

__all__ = ["AutoResetEnv", "AutoResetTransform"]


class AutoResetTransform(Transform):
    """Handles envs that reset themselves on the step that ends an episode.

    Such an env returns, with the done flags of the finished transition, the *first*
    observation of the next episode. This transform keeps that observation for the reset
    that follows (which then does not call the base env) and, unless ``replace=False``,
    replaces the step's observations of done elements with placeholders (NaN for floats,
    -1 for signed integers, False for booleans by default). It must be the first transform
    of an :class:`AutoResetEnv`; ``SomeEnv(..., auto_reset=True, auto_reset_replace=...)``
    builds exactly that.

    Args:
        replace: write placeholders into the done elements' step observations.
        fill_float: placeholder of floating entries (a number or ``"nan"``; None: keep).
        fill_int: placeholder of signed integer entries (None: keep).
        fill_bool: placeholder of boolean entries (None: keep).

    Example:
        >>> env = MyAutoResettingEnv(auto_reset=True)   # an AutoResetEnv
        >>> r = await env.rollout(30, break_when_any_done=False)
        >>> r["next", "observation"][r["next", "done"].squeeze(-1)].isnan().all()
        tensor(True)
    """

    def __init__(
        self,
        *,
        replace: bool = True,
        fill_float: float | str | None = "nan",
        fill_int: int | None = -1,
        fill_bool: bool | None = False,
    ) -> None:
        super().__init__()
        self.replace = replace
        self.fill_float = float(fill_float) if isinstance(fill_float, str) else fill_float
        self.fill_int = fill_int
        self.fill_bool = fill_bool
        self._obs_keys: list[NestedKey] = []
        self._env_ndim = 0
        self._saved: TensorDictBase | None = None

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        self._obs_keys = list(output_spec["full_observation_spec"].keys(True, True))
        self._env_ndim = len(output_spec.shape)
        return output_spec

    def _fill(self, dtype: torch.dtype) -> float | int | bool | None:
        if dtype == torch.bool:
            return self.fill_bool
        if dtype.is_floating_point or dtype.is_complex:
            return self.fill_float
        if dtype.is_signed:
            return self.fill_int
        return None

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        done = next_tensordict.get("done", None)
        if done is None or not bool(done.any()):
            return next_tensordict
        self._saved = next_tensordict.select(*self._obs_keys, strict=False).clone()
        if not self.replace:
            return next_tensordict
        flag = done.reshape(*next_tensordict.batch_size, -1).any(-1)
        for key in self._obs_keys:
            value = next_tensordict.get(key, None)
            if not isinstance(value, torch.Tensor):
                continue
            fill = self._fill(value.dtype)
            if fill is None:
                continue
            m = pad_mask(flag, value.ndim)
            next_tensordict.set(key, torch.where(m, torch.full_like(value, fill), value))
        return next_tensordict

    def take_saved(self) -> TensorDictBase | None:
        """The first observations of the episodes started by the last done step (once)."""
        saved, self._saved = self._saved, None
        return saved

    def extra_repr(self) -> str:
        return f"replace={self.replace}"


class AutoResetEnv(TransformedEnv):
    """A TransformedEnv over an auto-resetting env (see :class:`AutoResetTransform`).

    Its first reset resets the base env; a reset with ``"_reset"`` masks (the one a rollout
    asks for after a done step) does not call the base env: it hands out the observations
    the base env returned with the done flags. Built by ``EnvClass(..., auto_reset=True)``.

    Example:
        >>> env = AutoResetEnv(base_env, AutoResetTransform(replace=True))
    """

    def __init__(self, env: EnvBase, transform: Transform | None = None, **kwargs: Any) -> None:
        transform = transform if transform is not None else AutoResetTransform()
        first = transform[0] if isinstance(transform, Compose) and len(transform) else transform
        if not isinstance(first, AutoResetTransform):
            raise ValueError("AutoResetEnv's first transform must be an AutoResetTransform")
        super().__init__(env, transform, **kwargs)

    @property
    def auto_reset_transform(self) -> AutoResetTransform:
        t = self.transform[0]
        assert isinstance(t, AutoResetTransform)
        return t

    async def _base_reset(self, td_in: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        base = self.base_env
        if td_in is not None and any(td_in.get(k, None) is not None for k in base.reset_keys):
            saved = self.auto_reset_transform.take_saved()
            if saved is not None:
                out = saved
                for key in base.done_keys:
                    spec = base.full_done_spec[key]
                    extra = out.batch_size[: out.batch_dims - len(base.batch_size)]
                    out.set(key, spec.zero(extra))
                for key in base.reset_keys:
                    if unravel(key)[-1] == "_reset":
                        out.pop(key, None)
                return out
        return await base.reset(td_in, **kwargs)


def wrap_auto_reset(env: EnvBase, replace: bool = True) -> AutoResetEnv:
    """Wrap an auto-resetting env (the ``auto_reset=True`` env argument's doing)."""
    return AutoResetEnv(env, AutoResetTransform(replace=replace))
