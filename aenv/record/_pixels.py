"""PixelRenderTransform: the base env's ``render()`` output as an observation."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from aenv._mdp import NestedKey
from aenv.specs import Composite, Unbounded
from aenv.transforms._base import Transform, _norm_keys

__all__ = ["PixelRenderTransform"]


class PixelRenderTransform(Transform):
    """Calls ``render()`` on the base env after each reset and step and writes the image at
    ``out_keys[0]`` (default ``"pixels"``), so envs that only render on request (e.g.
    ``GymEnv("CartPole-v1", render_mode="rgb_array")``) feed video recorders.

    On a pool the sub-envs render where they live (``pool.call("render")``, one image per
    env, stacked; on a process pool the frames then travel pickled: appending the transform
    to each sub-env in the env factory sends them through the pool's shared memory instead);
    on a single env the call reaches the library env (wrappers forward attribute reads). The image spec needs one frame: it is rendered when the transform is
    appended (resetting the env first when it cannot render yet), which needs sync code
    (no running event loop) for a pool, or give ``shape`` (``(H, W, C)``).

    Args:
        out_keys: where the image goes.
        preproc: a function applied to each image (a tensor) before it is written.
        render_method: the env method to call.
        shape: the image shape, to skip the probe frame.
        dtype: the image dtype (default: the probe frame's, else uint8).

    Example:
        >>> env = ParallelEnv(4, lambda: GymEnv("CartPole-v1", render_mode="rgb_array"))
        >>> env = env.append_transform(PixelRenderTransform())
        >>> env.rollout(3)["pixels"].shape
        torch.Size([4, 3, 400, 600, 3])
    """

    def __init__(
        self,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        preproc: Callable[[torch.Tensor], torch.Tensor] | None = None,
        render_method: str = "render",
        shape: Sequence[int] | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        keys = _norm_keys(out_keys) if out_keys is not None else ["pixels"]
        if len(keys) != 1:
            raise ValueError(f"PixelRenderTransform writes one entry, got {keys}")
        super().__init__()
        self.out_keys = list(keys)
        self.preproc = preproc
        self.render_method = render_method
        self.shape = tuple(shape) if shape is not None else None
        self.dtype = dtype

    # ------------------------------------------------------------------ rendering
    def _base(self) -> Any:
        env = self.container
        if env is None:
            raise RuntimeError("PixelRenderTransform must belong to a TransformedEnv")
        return env.base_env

    async def _render(self) -> torch.Tensor:
        from aenv.pool import AsyncEnvPool

        base = self._base()
        if isinstance(base, AsyncEnvPool):
            images = await base.call(self.render_method)
            frame = torch.stack([self._tensor(im) for im in images])
            return frame.reshape(*base.batch_size, *frame.shape[1:])
        out = getattr(base, self.render_method)()
        if inspect.isawaitable(out):
            out = await out
        return self._tensor(out)

    def _tensor(self, image: Any) -> torch.Tensor:
        if image is None:
            raise RuntimeError(
                f"{type(self._base()).__name__}.{self.render_method}() returned None: build the "
                "env with render_mode='rgb_array'"
            )
        value = torch.as_tensor(np.ascontiguousarray(image))
        return self.preproc(value) if self.preproc is not None else value

    async def _probe(self) -> torch.Tensor:
        from aenv.pool import AsyncEnvPool

        base = self._base()
        if not isinstance(base, AsyncEnvPool):
            try:
                return await self._render()
            except Exception:  # most envs cannot render before their first reset
                pass
        await base.reset()
        return await self._render()

    def _probe_now(self) -> torch.Tensor:
        """A probe frame from sync code: inline when the env never suspends (a library
        wrapper), else through the loop runner (not inside a running event loop)."""
        from aenv.pool import AsyncEnvPool

        if not isinstance(self._base(), AsyncEnvPool):
            probe = self._probe()
            try:
                probe.send(None)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            probe.close()  # it awaited something real: it needs a loop
        if asyncio._get_running_loop() is not None:
            raise RuntimeError(
                "PixelRenderTransform needs a probe frame for its spec, which it cannot render "
                "inside a running event loop for this env: pass shape=(H, W, C)"
            )
        from aenv.sync._runner import get_runner

        return get_runner().run(self._probe)

    # ------------------------------------------------------------------ specs and hooks
    def transform_output_spec(self, output_spec: Composite) -> Composite:
        batch = tuple(output_spec.shape)
        shape, dtype = self.shape, self.dtype
        if shape is None:
            frame = self._probe_now()
            shape = tuple(frame.shape[len(batch) :])
            dtype = dtype or frame.dtype
            self.shape, self.dtype = shape, dtype
        output_spec["full_observation_spec"][self.out_keys[0]] = Unbounded(
            (*batch, *shape), dtype=dtype or torch.uint8
        )
        return output_spec

    async def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        tensordict_reset.set(self.out_keys[0], await self._render())
        return tensordict_reset

    async def _step(
        self, tensordict: TensorDictBase, next_tensordict: TensorDictBase
    ) -> TensorDictBase:
        next_tensordict.set(self.out_keys[0], await self._render())
        return next_tensordict
