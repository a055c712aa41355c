"""Recorders (the seeds' ``torchrl.record``): transforms that keep what passes through an env
(:class:`TensorDictRecorder`, :class:`VideoRecorder`), :class:`PixelRenderTransform` (render
an env's images into its outputs) and :class:`CSVLogger` (scalars and video files)."""

from aenv.record._loggers import CSVLogger
from aenv.record._pixels import PixelRenderTransform
from aenv.record._recorders import TensorDictRecorder, VideoRecorder, to_video_frame

__all__ = [
    "CSVLogger",
    "PixelRenderTransform",
    "TensorDictRecorder",
    "VideoRecorder",
    "to_video_frame",
]
