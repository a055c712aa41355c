"""Transforms: TransformedEnv, Compose and the transform library.

A :class:`TransformedEnv` chains :class:`Transform` objects between a base env and the user:
forward hooks map outputs (and specs), inverse hooks map inputs. See
:mod:`aenv.transforms._base` for the hooks a new transform overrides.
"""

from aenv.transforms._actions import DiscreteActionProjection, gSDENoise
from aenv.transforms._autoreset import AutoResetEnv, AutoResetTransform
from aenv.transforms._base import Transform, reset_mask
from aenv.transforms._batch import BatchSizeTransform, PinMemoryTransform
from aenv.transforms._cat import CatFrames, CatTensors
from aenv.transforms._compose import Compose
from aenv.transforms._counters import InitTracker, RewardSum, StepCounter
from aenv.transforms._discretize import ActionDiscretizer
from aenv.transforms._dreamer import DreamerDecoder
from aenv.transforms._dtype import DeviceCastTransform, DoubleToFloat, DTypeCastTransform
from aenv.transforms._env import TransformedEnv
from aenv.transforms._image import CenterCrop, Crop, GrayScale, Resize, ToTensorImage
from aenv.transforms._keys import ExcludeTransform, RenameTransform, SelectTransform
from aenv.transforms._masks import ActionMask, ConditionalSkip
from aenv.transforms._misc import FiniteTensorDictCheck, RemoveEmptySpecs, TrajCounter
from aenv.transforms._norm import ObservationNorm, VecNorm
from aenv.transforms._primer import TensorDictPrimer
from aenv.transforms._returns import KLRewardTransform, TargetReturn
from aenv.transforms._reward import RewardClipping, RewardScaling
from aenv.transforms._shape import (
    FlattenObservation,
    PermuteTransform,
    SqueezeTransform,
    UnsqueezeTransform,
)
from aenv.transforms._steps import FrameSkipTransform, NoopResetEnv
from aenv.transforms._temporal import EndOfLifeTransform, TimeMaxPool
from aenv.transforms._trajectory import BurnInTransform, RandomCropTensorDict, Reward2GoTransform
from aenv.transforms._values import BinarizeReward, ClipTransform, SignTransform

__all__ = [
    "DreamerDecoder",
    "BatchSizeTransform",
    "BurnInTransform",
    "DiscreteActionProjection",
    "EndOfLifeTransform",
    "KLRewardTransform",
    "PinMemoryTransform",
    "RandomCropTensorDict",
    "Reward2GoTransform",
    "TargetReturn",
    "TimeMaxPool",
    "gSDENoise",
    "ActionDiscretizer",
    "ActionMask",
    "AutoResetEnv",
    "AutoResetTransform",
    "BinarizeReward",
    "CatFrames",
    "CatTensors",
    "CenterCrop",
    "ClipTransform",
    "Compose",
    "ConditionalSkip",
    "Crop",
    "DTypeCastTransform",
    "DeviceCastTransform",
    "DoubleToFloat",
    "ExcludeTransform",
    "FiniteTensorDictCheck",
    "FlattenObservation",
    "FrameSkipTransform",
    "GrayScale",
    "InitTracker",
    "NoopResetEnv",
    "ObservationNorm",
    "PermuteTransform",
    "RemoveEmptySpecs",
    "RenameTransform",
    "Resize",
    "RewardClipping",
    "RewardScaling",
    "RewardSum",
    "SelectTransform",
    "SignTransform",
    "SqueezeTransform",
    "StepCounter",
    "TensorDictPrimer",
    "ToTensorImage",
    "TrajCounter",
    "Transform",
    "TransformedEnv",
    "UnsqueezeTransform",
    "VecNorm",
    "reset_mask",
]
