"""Async envs: the base class, helpers and built-in envs."""

from aenv.envs._chess import ChessEnv
from aenv.envs._common import EnvBase
from aenv.envs._financial import FinancialRegimeEnv
from aenv.envs._marl import MarlGroupMapType, check_marl_grouping
from aenv.envs._model_based import DreamerEnv, ModelBasedEnvBase
from aenv.envs._pendulum import PendulumEnv
from aenv.envs._tictactoe import TicTacToeEnv
from aenv.envs._utils import (
    EnvMetaData,
    ExplorationType,
    RandomPolicy,
    acheck_env_specs,
    exploration_type,
    get_available_libraries,
    set_exploration_type,
)

__all__ = [
    "ChessEnv",
    "FinancialRegimeEnv",
    "MarlGroupMapType",
    "ModelBasedEnvBase",
    "DreamerEnv",
    "check_marl_grouping",
    "TicTacToeEnv",
    "EnvBase",
    "EnvMetaData",
    "ExplorationType",
    "PendulumEnv",
    "RandomPolicy",
    "acheck_env_specs",
    "exploration_type",
    "get_available_libraries",
    "set_exploration_type",
]
