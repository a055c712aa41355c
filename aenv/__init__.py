"""aenv: asyncio-first environments for reinforcement learning and agent loops.

Every env is awaited (``await env.reset()``, ``await env.step(td)``, ``await env.rollout(n)``);
pools run many envs on coroutine, thread, process or Ray backends and stream results as each
env finishes; sync facades (``SerialEnv``, ``ParallelEnv``, ``rollout``, ``SyncDataCollector``)
drive the same async engine from plain scripts.
"""

from __future__ import annotations

from aenv import exceptions
from aenv._mdp import step_mdp, terminated_or_truncated
from aenv.envs import (
    EnvBase,
    EnvMetaData,
    ExplorationType,
    PendulumEnv,
    RandomPolicy,
    check_env_specs,
    exploration_type,
    get_available_libraries,
    set_exploration_type,
)
from aenv.exceptions import (
    AenvError,
    BatchSizeError,
    DoneAfterResetError,
    EnvBusyError,
    EnvClosedError,
    EnvStepError,
    LockedSpecError,
    PoolError,
    ResetNeededError,
    SpecError,
    SpecViolationError,
    StepTimeoutError,
    WorkerCrashedError,
)
from aenv.libs.gym import (
    BaseInfoDictReader,
    DefaultInfoDictReader,
    GymEnv,
    GymLikeEnv,
    GymWrapper,
    default_info_dict_reader,
    gym_backend,
    set_gym_backend,
    to_gymnasium,
    to_gymnasium_vector,
)
from aenv.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    OneHot,
    Stacked,
    StackedComposite,
    TensorSpec,
    Unbounded,
    make_composite_from_td,
)

__version__ = "0.1.0"

__all__ = [
    "AenvError",
    "BaseInfoDictReader",
    "DefaultInfoDictReader",
    "GymEnv",
    "GymLikeEnv",
    "GymWrapper",
    "default_info_dict_reader",
    "gym_backend",
    "set_gym_backend",
    "to_gymnasium",
    "to_gymnasium_vector",
    "BatchSizeError",
    "Binary",
    "Bounded",
    "Categorical",
    "Composite",
    "DoneAfterResetError",
    "EnvBase",
    "EnvBusyError",
    "EnvClosedError",
    "EnvMetaData",
    "EnvStepError",
    "ExplorationType",
    "LockedSpecError",
    "MultiCategorical",
    "MultiOneHot",
    "NonTensor",
    "OneHot",
    "PendulumEnv",
    "PoolError",
    "RandomPolicy",
    "ResetNeededError",
    "SpecError",
    "SpecViolationError",
    "Stacked",
    "StackedComposite",
    "StepTimeoutError",
    "TensorSpec",
    "Unbounded",
    "WorkerCrashedError",
    "check_env_specs",
    "exceptions",
    "exploration_type",
    "get_available_libraries",
    "make_composite_from_td",
    "set_exploration_type",
    "step_mdp",
    "terminated_or_truncated",
]
