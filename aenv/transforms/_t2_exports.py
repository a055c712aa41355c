"""The public names of the shape, image, cat, discretize, step, value and bookkeeping transforms.

``aenv.transforms.__init__`` imports these names explicitly from here.
"""

from __future__ import annotations

from aenv.transforms._cat import CatFrames, CatTensors
from aenv.transforms._discretize import ActionDiscretizer
from aenv.transforms._image import CenterCrop, Crop, GrayScale, Resize, ToTensorImage
from aenv.transforms._misc import FiniteTensorDictCheck, RemoveEmptySpecs, TrajCounter
from aenv.transforms._shape import (
    FlattenObservation,
    PermuteTransform,
    SqueezeTransform,
    UnsqueezeTransform,
)
from aenv.transforms._steps import FrameSkipTransform, NoopResetEnv
from aenv.transforms._values import BinarizeReward, ClipTransform, SignTransform

__all__ = [
    "ActionDiscretizer",
    "BinarizeReward",
    "CatFrames",
    "CatTensors",
    "CenterCrop",
    "ClipTransform",
    "Crop",
    "FiniteTensorDictCheck",
    "FlattenObservation",
    "FrameSkipTransform",
    "GrayScale",
    "NoopResetEnv",
    "PermuteTransform",
    "RemoveEmptySpecs",
    "Resize",
    "SignTransform",
    "SqueezeTransform",
    "ToTensorImage",
    "TrajCounter",
    "UnsqueezeTransform",
]
