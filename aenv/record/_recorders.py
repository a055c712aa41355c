"""Recorders: transforms that keep what passes through an env for logging (the seeds'
``TensorDictRecorder`` and ``VideoRecorder``)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from aenv._mdp import NestedKey
from aenv.transforms._base import Transform, _norm_keys

__all__ = ["TensorDictRecorder", "VideoRecorder", "to_video_frame"]

_CHANNELS = (1, 3, 4)


def to_video_frame(image: torch.Tensor, make_grid: bool = True) -> torch.Tensor:
    """One ``(C, H, W)`` uint8 frame from an image: ``HWC`` (numpy style) or ``CHW`` (torch
    style) layout, detected from where a channel dim of 1, 3 or 4 sits (HWC when both
    could be); floats are read as ``[0, 1]``; leading batch dims are tiled into a grid
    (row-major, as square as possible) or, without ``make_grid``, must be absent.

    Example:
        >>> to_video_frame(torch.zeros(4, 32, 48, 3, dtype=torch.uint8)).shape
        torch.Size([3, 64, 96])
    """
    if image.ndim < 3:
        raise ValueError(
            f"an image needs at least 3 dims (H, W, C or C, H, W), got {tuple(image.shape)}"
        )
    if image.shape[-1] in _CHANNELS:
        hwc = image
    elif image.shape[-3] in _CHANNELS:
        hwc = image.movedim(-3, -1)
    else:
        raise ValueError(
            f"cannot find the channel dim (1, 3 or 4 channels, first or last) of an image of "
            f"shape {tuple(image.shape)}"
        )
    if hwc.is_floating_point():
        hwc = (hwc.clamp(0, 1) * 255).round()
    hwc = hwc.to(torch.uint8)
    if hwc.ndim > 3:
        if not make_grid:
            raise ValueError(f"batched images of shape {tuple(image.shape)} need make_grid=True")
        tiles = hwc.reshape(-1, *hwc.shape[-3:])
        n, h, w, c = tiles.shape
        cols = math.ceil(math.sqrt(n))
        rows = math.ceil(n / cols)
        grid = torch.zeros(rows * h, cols * w, c, dtype=torch.uint8, device=tiles.device)
        for i in range(n):
            r, col = divmod(i, cols)
            grid[r * h : (r + 1) * h, col * w : (col + 1) * w] = tiles[i]
        hwc = grid
    return hwc.movedim(-1, 0).contiguous()


class _Recorder(Transform):
    """A transform that watches resets and steps and changes nothing."""

    def __init__(self, in_keys: Sequence[NestedKey] | None, skip: int | None) -> None:
        super().__init__(in_keys=in_keys)
        if skip is not None and skip < 1:
            raise ValueError(f"skip must be >= 1, got {skip}")
        self.skip = skip
        self.count = 0  # steps seen
        self.iter = 0  # dumps made

    def _keep(self) -> bool:
        self.count += 1
        return self.skip is None or self.count % self.skip == 0

    def _record(self, td: TensorDictBase) -> None:
        raise NotImplementedError

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> Any:
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> Any:
        if self._keep():
            self._record(next_tensordict)
        return next_tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Record ``tensordict`` (e.g. a rollout's ``"next"``, step by step) as it is."""
        self._record(tensordict)
        return tensordict


class TensorDictRecorder(_Recorder):
    """Keeps every ``skip``-th step's output (``in_keys``, or all of it) in memory;
    :meth:`dump` writes them to disk, stacked along a first dim, as a memory-mapped
    tensordict folder ``<out_file_base>_<suffix>`` (read it back with
    ``TensorDict.load_memmap(path)``), and clears the cache.

    Args:
        out_file_base: path prefix of the dumps.
        skip_reset: do not record reset outputs.
        skip: record one step in ``skip``.
        in_keys: entries to keep (default: all).

    Example:
        >>> env = TransformedEnv(CountingEnv(), TensorDictRecorder(tmp / "steps", skip=1))
        >>> await env.rollout(5)
        >>> TensorDict.load_memmap(env.transform[0].dump())["observation"].squeeze(-1)
        tensor([1., 2., 3., 4., 5.])
    """

    def __init__(
        self,
        out_file_base: str | os.PathLike[str],
        skip_reset: bool = True,
        skip: int = 4,
        in_keys: Sequence[NestedKey] | None = None,
    ) -> None:
        super().__init__(in_keys, skip)
        self.out_file_base = str(out_file_base)
        self.skip_reset = skip_reset
        self.cache: list[TensorDictBase] = []

    def _record(self, td: TensorDictBase) -> None:
        kept = td.select(*self.in_keys, strict=False) if self.in_keys else td
        self.cache.append(kept.clone())

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> Any:
        if not self.skip_reset:
            self._record(tensordict_reset)
        return tensordict_reset

    def dump(self, suffix: str | None = None) -> Path:
        """Write the cached steps and clear them; returns the folder written."""
        if not self.cache:
            raise RuntimeError("TensorDictRecorder.dump: nothing was recorded")
        path = Path(f"{self.out_file_base}_{suffix if suffix is not None else self.iter}")
        # a lazy stack where keys differ between steps (a reset output has no reward)
        data = LazyStackedTensorDict.maybe_dense_stack(self.cache, 0)
        data.memmap(path)
        self.cache = []
        self.iter += 1
        return path


class VideoRecorder(_Recorder):
    """Keeps the frames of an image entry (default ``"pixels"``) of every step (or one in
    ``skip``) and of resets; :meth:`dump` hands them to ``logger.log_video`` as one
    ``(T, C, H, W)`` uint8 video (e.g. :class:`~aenv.record.CSVLogger` writes an mp4) and
    clears the cache, which grows until then.

    Images may be ``HWC`` or ``CHW``, uint8 or float in ``[0, 1]``, and batched (a pool's
    or batched env's frames are tiled into one grid per step), see :func:`to_video_frame`.

    Args:
        logger: anything with ``log_video(name, video, step=..., fps=...)``.
        tag: the video's name.
        in_keys: the image entry (one).
        skip: record one step in ``skip``.
        make_grid: tile batched images (else they are refused).
        fps: frames per second (default: the logger's).

    Example:
        >>> logger = CSVLogger("exp", video_format="mp4")
        >>> env = TransformedEnv(GymEnv("CartPole-v1", from_pixels=True), VideoRecorder(logger, "cartpole"))
        >>> await env.rollout(10)
        >>> env.transform[0].dump()  # writes exp/videos/cartpole_0.mp4
    """

    def __init__(
        self,
        logger: Any,
        tag: str,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        skip: int | None = None,
        make_grid: bool = True,
        fps: int | None = None,
    ) -> None:
        keys = _norm_keys(in_keys) if in_keys is not None else ["pixels"]
        if len(keys) != 1:
            raise ValueError(f"VideoRecorder records one image entry, got {keys}")
        super().__init__(keys, skip)
        if not callable(getattr(logger, "log_video", None)):
            raise TypeError(f"the logger {type(logger).__name__} has no log_video method")
        self.logger = logger
        self.tag = tag
        self.make_grid = make_grid
        self.fps = fps
        self.frames: list[torch.Tensor] = []

    def _record(self, td: TensorDictBase) -> None:
        image = td.get(self.in_keys[0], None)
        if image is None:
            raise KeyError(f"VideoRecorder: {self.in_keys[0]!r} is missing from the output")
        self.frames.append(to_video_frame(torch.as_tensor(image), self.make_grid).cpu())

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> Any:
        if tensordict_reset.get(self.in_keys[0], None) is not None:
            self._record(tensordict_reset)
        return tensordict_reset

    def dump(self, suffix: str | None = None) -> Any:
        """Log the cached frames as one video and clear them; returns what the logger does."""
        if not self.frames:
            raise RuntimeError("VideoRecorder.dump: no frame was recorded")
        video = torch.stack(self.frames, 0)
        self.frames = []
        name = self.tag if suffix is None else f"{self.tag}_{suffix}"
        kwargs = {"step": self.iter}
        if self.fps is not None:
            kwargs["fps"] = self.fps
        self.iter += 1
        return self.logger.log_video(name, video, **kwargs)
