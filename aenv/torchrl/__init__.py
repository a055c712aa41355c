"""TorchRL's names with TorchRL's sync behaviour, over aenv's async engine.

A TorchRL script runs on aenv with its imports pointed here: ``from torchrl.envs import
EnvBase, TransformedEnv`` becomes ``from aenv.torchrl import EnvBase, TransformedEnv`` (and
the same for ``torchrl.data`` specs, ``torchrl.envs.libs.gym``, ``torchrl.envs.utils`` and
``torchrl.collectors``). Envs here have sync ``reset`` / ``step`` / ``rollout`` /
``set_seed`` / ``close``; batched envs index (``penv[1:]``) and restart after ``close()``;
``Collector`` is the sync collector TorchRL 0.14 calls by that name.

Each class is a thin layer over the aenv class of the same name: the async API stays the
primary one, and :func:`async_env` hands any env of this namespace to it.

Example:
    >>> from aenv.torchrl import GymEnv, StepCounter, TransformedEnv, check_env_specs
    >>> env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
    >>> check_env_specs(env)
    >>> env.rollout(3).batch_size
    torch.Size([3])
"""

from __future__ import annotations

from typing import Any

from aenv._mdp import step_mdp, terminated_or_truncated
from aenv.collectors import split_trajectories
from aenv.envs import (
    EnvMetaData,
    ExplorationType,
    RandomPolicy,
    exploration_type,
    set_exploration_type,
)
from aenv.envs import PendulumEnv as _AsyncPendulumEnv
from aenv.specs import (
    Binary,
    BinaryDiscreteTensorSpec,
    Bounded,
    BoundedTensorSpec,
    Categorical,
    Composite,
    CompositeSpec,
    DiscreteTensorSpec,
    MultiCategorical,
    MultiDiscreteTensorSpec,
    MultiOneHot,
    MultiOneHotDiscreteTensorSpec,
    NonTensor,
    NonTensorSpec,
    OneHot,
    OneHotDiscreteTensorSpec,
    TensorSpec,
    Unbounded,
    UnboundedContinuousTensorSpec,
    UnboundedDiscreteTensorSpec,
    make_composite_from_td,
)
from aenv.sync import EnvCreator
from aenv.torchrl._batched import ParallelEnv, SerialEnv
from aenv.torchrl._collectors import Collector, SyncDataCollector
from aenv.torchrl._envs import (
    EnvBase,
    GymEnv,
    GymWrapper,
    SyncVerbs,
    TransformedEnv,
    _apply_to_composite,
    async_env,
    check_env_specs,
)
from aenv.torchrl._modules import ADAPTED as _ADAPTED
from aenv.transforms import (
    ActionMask,
    BinarizeReward,
    CatFrames,
    CatTensors,
    CenterCrop,
    ClipTransform,
    Compose,
    DoubleToFloat,
    DTypeCastTransform,
    ExcludeTransform,
    FlattenObservation,
    FrameSkipTransform,
    GrayScale,
    InitTracker,
    NoopResetEnv,
    ObservationNorm,
    PermuteTransform,
    RenameTransform,
    Resize,
    RewardClipping,
    RewardScaling,
    RewardSum,
    SelectTransform,
    SignTransform,
    SqueezeTransform,
    StepCounter,
    TensorDictPrimer,
    ToTensorImage,
    Transform,
    UnsqueezeTransform,
    VecNorm,
)


class PendulumEnv(SyncVerbs, _AsyncPendulumEnv):  # type: ignore[misc]  # sync verbs
    """TorchRL's built-in ``PendulumEnv`` (aenv's :class:`~aenv.PendulumEnv`), sync.

    Example:
        >>> PendulumEnv(seed=0).rollout(3).batch_size
        torch.Size([3])
    """


__all__ = [
    "ActionMask",
    "BinarizeReward",
    "Binary",
    "BinaryDiscreteTensorSpec",
    "Bounded",
    "BoundedTensorSpec",
    "CatFrames",
    "CatTensors",
    "Categorical",
    "CenterCrop",
    "ClipTransform",
    "Collector",
    "Compose",
    "Composite",
    "CompositeSpec",
    "DTypeCastTransform",
    "DiscreteTensorSpec",
    "DoubleToFloat",
    "EnvBase",
    "EnvCreator",
    "EnvMetaData",
    "ExcludeTransform",
    "ExplorationType",
    "FlattenObservation",
    "FrameSkipTransform",
    "GrayScale",
    "GymEnv",
    "GymWrapper",
    "InitTracker",
    "MultiCategorical",
    "MultiDiscreteTensorSpec",
    "MultiOneHot",
    "MultiOneHotDiscreteTensorSpec",
    "NonTensor",
    "NonTensorSpec",
    "NoopResetEnv",
    "ObservationNorm",
    "OneHot",
    "OneHotDiscreteTensorSpec",
    "ParallelEnv",
    "PendulumEnv",
    "PermuteTransform",
    "RandomPolicy",
    "RenameTransform",
    "Resize",
    "RewardClipping",
    "RewardScaling",
    "RewardSum",
    "SelectTransform",
    "SerialEnv",
    "SignTransform",
    "SqueezeTransform",
    "StepCounter",
    "SyncDataCollector",
    "SyncVerbs",
    "TensorDictPrimer",
    "TensorSpec",
    "ToTensorImage",
    "Transform",
    "TransformedEnv",
    "Unbounded",
    "UnboundedContinuousTensorSpec",
    "UnboundedDiscreteTensorSpec",
    "UnsqueezeTransform",
    "VecNorm",
    "_apply_to_composite",
    "async_env",
    "check_env_specs",
    "exploration_type",
    "make_composite_from_td",
    "set_exploration_type",
    "split_trajectories",
    "step_mdp",
    "terminated_or_truncated",
]


def __getattr__(name: str) -> Any:
    # TorchRL's spec-reading modules and losses (aenv.torchrl._modules), built on first use
    # so that this namespace imports without torchrl
    if name in _ADAPTED:
        from aenv.torchrl._modules import adapted_class

        return adapted_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
