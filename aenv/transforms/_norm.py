"""Normalization transforms: ObservationNorm (fixed affine map) and VecNorm (running stats)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from aenv._mdp import NestedKey
from aenv.specs import Bounded, Composite, TensorSpec, Unbounded
from aenv.transforms._base import Transform, reset_mask

__all__ = ["ObservationNorm", "VecNorm"]


def _affine_spec(spec: TensorSpec, fn: Any) -> TensorSpec:
    if isinstance(spec, Bounded):
        a, b = fn(spec.low), fn(spec.high)
        low, high = torch.minimum(a, b), torch.maximum(a, b)
        shape = torch.broadcast_shapes(low.shape, spec.shape)
        return Bounded(
            low.expand(shape), high.expand(shape), shape=shape, dtype=spec.dtype, device=spec.device
        )
    return Unbounded(shape=spec.shape, dtype=spec.dtype, device=spec.device)


class ObservationNorm(Transform):
    """An affine map of observations: ``obs * scale + loc``, or ``(obs - loc) / scale``
    with ``standard_normal=True``.

    ``loc`` and ``scale`` are buffers (they travel with ``state_dict``); when not given,
    ``transform.init_stats(num_iter)`` (in async code ``await transform.ainit_stats(num_iter)``)
    estimates them from rollouts of the parent env so that outputs have zero mean and unit
    variance. Bounded specs get mapped bounds.

    Args:
        loc: offset (tensor or float), or None to initialize with ``init_stats``.
        scale: scale (tensor or float), or None to initialize with ``init_stats``.
        in_keys: observations to normalize (default ``["observation"]``).
        out_keys: where to write them (default: in place).
        in_keys_inv, out_keys_inv: inputs mapped back (inverse map) before the base env.
        standard_normal: use ``(obs - loc) / scale`` instead of ``obs * scale + loc``.
        eps: lower bound of ``scale`` in ``init_stats``.

    Example:
        >>> t = ObservationNorm(in_keys=["th"], standard_normal=True)
        >>> env = TransformedEnv(PendulumEnv(), t)
        >>> await t.ainit_stats(num_iter=100)
        >>> r = await env.rollout(100)
    """

    def __init__(
        self,
        loc: float | torch.Tensor | None = None,
        scale: float | torch.Tensor | None = None,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        standard_normal: bool | torch.Tensor = False,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(
            in_keys if in_keys is not None else ["observation"], out_keys, in_keys_inv, out_keys_inv
        )
        # a buffer, as in TorchRL, so that ``ObservationNorm(**t.state_dict())`` keeps it
        self.register_buffer("standard_normal", torch.tensor(bool(standard_normal)))
        self.eps = eps
        self.register_buffer(
            "loc", None if loc is None else torch.as_tensor(loc, dtype=torch.float32)
        )
        self.register_buffer(
            "scale", None if scale is None else torch.as_tensor(scale, dtype=torch.float32)
        )

    @property
    def initialized(self) -> bool:
        """Whether ``loc`` and ``scale`` are set."""
        return self.loc is not None and self.scale is not None

    def _params(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.loc is None or self.scale is None:
            raise RuntimeError(
                "ObservationNorm has no loc/scale yet: pass them or call t.init_stats(...) (await t.ainit_stats(...) in async code)"
            )
        return self.loc, self.scale

    def _apply_transform(self, obs: torch.Tensor) -> torch.Tensor:
        loc, scale = self._params()
        out = (obs - loc) / scale if self.standard_normal else obs * scale + loc
        return out.to(obs.dtype) if obs.is_floating_point() else out

    def _inv_apply_transform(self, obs: torch.Tensor) -> torch.Tensor:
        loc, scale = self._params()
        out = obs * scale + loc if self.standard_normal else (obs - loc) / scale
        return out.to(obs.dtype) if obs.is_floating_point() else out

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        if not self.initialized:
            return spec
        return _affine_spec(spec, lambda t: self._apply_transform(t.to(torch.float32)).to(t.dtype))

    _inv_transform_spec = _transform_spec

    def init_stats(
        self,
        num_iter: int,
        reduce_dim: int | tuple[int, ...] = 0,
        cat_dim: int | None = None,
        key: NestedKey | None = None,
        keep_dims: tuple[int, ...] | None = None,
    ) -> None:
        """:meth:`ainit_stats` from sync code (TorchRL's name); inside a running event loop
        it raises :class:`~aenv.exceptions.AsyncContextError`: await ``ainit_stats`` there."""
        from aenv.sync._runner import run_blocking

        run_blocking(
            self.ainit_stats,
            num_iter,
            reduce_dim,
            cat_dim,
            key,
            keep_dims,
            api="ObservationNorm.init_stats()",
            twin="await transform.ainit_stats(...)",
        )

    async def ainit_stats(
        self,
        num_iter: int,
        reduce_dim: int | tuple[int, ...] = 0,
        cat_dim: int | None = None,
        key: NestedKey | None = None,
        keep_dims: tuple[int, ...] | None = None,
    ) -> None:
        """Estimate ``loc``/``scale`` from at least ``num_iter`` steps of the parent env.

        Rollouts of the parent (the env up to this transform) are concatenated along
        ``cat_dim`` (default ``reduce_dim``), then mean and std are taken over ``reduce_dim``
        (the rollout's time dim is its last batch dim: 0 for an unbatched env). Dims in
        ``keep_dims`` stay as singletons.
        """
        if self.initialized:
            raise RuntimeError("ObservationNorm is already initialized")
        parent = self.parent
        if parent is None:
            raise RuntimeError("init_stats needs the transform to belong to a TransformedEnv")
        key = key if key is not None else self.in_keys[0]
        cat_dim = (
            cat_dim
            if cat_dim is not None
            else (reduce_dim if isinstance(reduce_dim, int) else reduce_dim[0])
        )
        chunks: list[torch.Tensor] = []
        n = 0
        while n < num_iter:
            rollout = await parent.rollout(num_iter, break_when_any_done=False)
            value = rollout.get(("next", *((key,) if isinstance(key, str) else key)))
            chunks.append(value)
            n += value.shape[cat_dim]
        data = torch.cat(chunks, cat_dim).to(torch.float32)
        dims = (reduce_dim,) if isinstance(reduce_dim, int) else tuple(reduce_dim)
        loc = data.mean(dims, keepdim=True)
        scale = data.std(dims, keepdim=True).clamp_min(self.eps)
        squeeze = [d % data.ndim for d in dims if keep_dims is None or d not in keep_dims]
        for d in sorted(squeeze, reverse=True):
            loc, scale = loc.squeeze(d), scale.squeeze(d)
        if not self.standard_normal:
            loc, scale = -loc / scale, 1.0 / scale
        self.loc, self.scale = loc, scale
        self._invalidate_specs()


class VecNorm(Transform):
    """Normalizes observations with running (decayed) mean and variance.

    Statistics cover every batch element (and every step); each step (and each reset of the
    elements being reset) updates them unless frozen, then the entries are replaced by
    ``(obs - mean) / std``. The statistics are buffers (in ``state_dict``).

    Args:
        in_keys: observations to normalize (default ``["observation"]``).
        out_keys: where to write them (default: in place).
        decay: weight of past statistics per update (1.0: plain running average).
        eps: lower bound of the std.

    Example:
        >>> env = TransformedEnv(PendulumEnv(), VecNorm(in_keys=["th", "thdot"]))
        >>> r = await env.rollout(100)
        >>> env.transform[0].frozen_copy()  # an ObservationNorm-like frozen normalizer
    """

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        decay: float = 0.9999,
        eps: float = 1e-4,
    ) -> None:
        super().__init__(in_keys if in_keys is not None else ["observation"], out_keys)
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.decay = decay
        self.eps = eps
        self.frozen = False
        self._event_ndim: dict[NestedKey, int] = {}

    def _buf(self, kind: str, i: int) -> torch.Tensor | None:
        return self._buffers.get(f"{kind}_{i}")

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        env_ndim = len(observation_spec.shape)
        for i, (in_key, out_key) in enumerate(zip(self.in_keys, self.out_keys)):
            leaf = observation_spec[in_key]
            event = leaf.shape[env_ndim:]
            self._event_ndim[in_key] = len(event)
            if self._buf("sum", i) is None or self._buf("sum", i).shape != event:  # type: ignore[union-attr]
                self.register_buffer(f"sum_{i}", torch.zeros(event))
                self.register_buffer(f"ssq_{i}", torch.zeros(event))
                self.register_buffer(f"count_{i}", torch.zeros(()))
            observation_spec[out_key] = Unbounded(
                shape=leaf.shape, dtype=leaf.dtype, device=leaf.device
            )
        return observation_spec

    def _normalize(
        self, td: TensorDictBase, update_mask: torch.Tensor | None, strict: bool
    ) -> TensorDictBase:
        for i, (in_key, out_key) in enumerate(zip(self.in_keys, self.out_keys)):
            value = td.get(in_key, None)
            if value is None:
                if strict:
                    raise KeyError(f"VecNorm: {in_key!r} is missing")
                continue
            s, q, c = (
                self._buffers[f"sum_{i}"],
                self._buffers[f"ssq_{i}"],
                self._buffers[f"count_{i}"],
            )
            assert s is not None and q is not None and c is not None
            lead = value.ndim - self._event_ndim[in_key]
            x = value.to(s.dtype)
            if not self.frozen:
                flat = x.reshape(-1, *x.shape[lead:])
                if update_mask is not None:
                    flat = flat[update_mask.reshape(-1)]
                s.mul_(self.decay).add_(flat.sum(0))
                q.mul_(self.decay).add_(flat.pow(2).sum(0))
                c.mul_(self.decay).add_(flat.shape[0])
            if bool(c > 0):
                mean = s / c
                std = (q / c - mean.pow(2)).clamp_min(0).sqrt().clamp_min(self.eps)
                x = (x - mean) / std
            td.set(out_key, x.to(value.dtype))
        return td

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._normalize(next_tensordict, None, strict=True)

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        mask = reset_mask(tensordict)
        if mask is not None:
            mask = (
                mask.reshape(tensordict_reset.batch_size)
                if mask.numel() == tensordict_reset.numel()
                else None
            )
        return self._normalize(tensordict_reset, mask, strict=False)

    def freeze(self) -> VecNorm:
        """Stop updating the statistics (normalize with the current ones)."""
        self.frozen = True
        return self

    def unfreeze(self) -> VecNorm:
        """Resume updating the statistics."""
        self.frozen = False
        return self

    def frozen_copy(self) -> VecNorm:
        """A frozen clone with its own copy of the current statistics."""
        new = self.clone()
        assert isinstance(new, VecNorm)
        new._buffers = {k: (v.clone() if v is not None else None) for k, v in self._buffers.items()}
        new.frozen = True
        return new

    def to_observation_norm(self) -> ObservationNorm:
        """An ObservationNorm (``standard_normal``) with the current mean and std (one key)."""
        if len(self.in_keys) != 1:
            raise ValueError("to_observation_norm needs a VecNorm with exactly one in_key")
        s, q, c = self._buffers["sum_0"], self._buffers["ssq_0"], self._buffers["count_0"]
        if s is None or q is None or c is None or not bool(c > 0):
            raise RuntimeError("VecNorm has no statistics yet")
        mean = s / c
        std = (q / c - mean.pow(2)).clamp_min(0).sqrt().clamp_min(self.eps)
        return ObservationNorm(
            mean, std, in_keys=self.in_keys, out_keys=self.out_keys, standard_normal=True
        )
