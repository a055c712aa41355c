"""CSVLogger: scalars to CSV files and videos to video files (the seeds' logger for videos)."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aenv.exceptions import BackendUnavailableError

__all__ = ["CSVLogger"]


class CSVLogger:
    """Logs scalars to ``<log_dir>/<exp_name>/scalars/<name>.csv`` and videos to
    ``<log_dir>/<exp_name>/videos/<name>_<step>.<video_format>``.

    Videos are ``(T, C, H, W)`` uint8 tensors (what :class:`~aenv.VideoRecorder` hands
    over). ``video_format="mp4"`` (or another container ffmpeg writes) goes through imageio
    and its ffmpeg plugin (``pip install imageio imageio-ffmpeg``, or ``aenv[video]``); H.264
    needs even sizes, so an odd height or width gets one black row or column. ``"pt"`` saves
    the tensor with ``torch.save``.

    Args:
        exp_name: the experiment's folder name.
        log_dir: the parent folder (default: the current directory).
        video_format: ``"pt"``, ``"mp4"``, ``"avi"``, ``"mov"``, ...
        video_fps: frames per second of written videos.

    Example:
        >>> logger = CSVLogger("exp", log_dir=tmp, video_format="mp4")
        >>> logger.log_video("rollout", torch.zeros(10, 3, 64, 64, dtype=torch.uint8))
        >>> os.listdir(f"{tmp}/exp/videos")
        ['rollout_0.mp4']
    """

    def __init__(
        self,
        exp_name: str,
        log_dir: str | os.PathLike[str] | None = None,
        video_format: str = "pt",
        video_fps: int = 30,
    ) -> None:
        self.exp_name = exp_name
        self.log_dir = Path(log_dir if log_dir is not None else ".") / exp_name
        self.video_format = video_format.lower().lstrip(".")
        self.video_fps = video_fps
        if self.video_format != "pt":
            _imageio()  # fail now, not at the first dump

    def log_scalar(self, name: str, value: float, step: int | None = None) -> None:
        """Append ``(step, value)`` to the scalar's CSV file."""
        folder = self.log_dir / "scalars"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{name}.csv", "a", newline="") as f:
            csv.writer(f).writerow([step if step is not None else "", float(value)])

    def log_video(
        self, name: str, video: torch.Tensor, step: int | None = None, fps: int | None = None
    ) -> Path:
        """Write ``video`` (``(T, C, H, W)`` uint8); returns the file written."""
        if video.ndim != 4:
            raise ValueError(
                f"log_video takes a (T, C, H, W) video, got shape {tuple(video.shape)}"
            )
        folder = self.log_dir / "videos"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}_{step if step is not None else 0}.{self.video_format}"
        if self.video_format == "pt":
            torch.save(video, path)
            return path
        frames = video.permute(0, 2, 3, 1).contiguous().cpu().numpy()
        if frames.shape[-1] == 1:
            frames = np.repeat(frames, 3, axis=-1)
        pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
        if pad_h or pad_w:
            frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)))
        _imageio().imwrite(path, frames, fps=fps or self.video_fps, macro_block_size=1)
        return path

    def __repr__(self) -> str:
        return f"CSVLogger(exp_name={self.exp_name!r}, log_dir={str(self.log_dir.parent)!r})"


def _imageio() -> Any:
    try:
        import imageio.v3 as iio
        import imageio_ffmpeg  # noqa: F401 - the plugin that writes video containers
    except ImportError:
        raise BackendUnavailableError(
            "writing videos needs imageio and imageio-ffmpeg: pip install imageio imageio-ffmpeg "
            "(or aenv[video]); video_format='pt' needs neither"
        ) from None
    return iio
