"""pytest plugin: gymnasium's ``SyncVectorEnv`` / ``AsyncVectorEnv`` replaced by aenv's bridge.

Loaded by ``tools/gymnasium_vector_suite.py`` (``-p _gymnasium_bridge_plugin``) before
gymnasium's test modules are imported, so that ``from gymnasium.vector import SyncVectorEnv``
in them (and ``gymnasium.make_vec``) builds :func:`aenv.libs.gym.make_gymnasium_vector` on the
pool backend named by ``AENV_BRIDGE_BACKEND``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium.vector
import gymnasium.vector.async_vector_env
import gymnasium.vector.sync_vector_env
from gymnasium.vector import AutoresetMode

from aenv.libs.gym import AenvGymnasiumVectorEnv, make_gymnasium_vector

BACKEND = os.environ.get("AENV_BRIDGE_BACKEND", "coroutine")
# the cases that built a bridge (written to AENV_BRIDGE_USED at the end of the session)
_current: list[str] = [""]
_used: set[str] = set()


def pytest_runtest_setup(item: Any) -> None:
    _current[0] = item.nodeid


def pytest_sessionfinish(session: Any) -> None:
    path = os.environ.get("AENV_BRIDGE_USED")
    if path:
        with open(path, "w") as f:
            f.write("\n".join(sorted(_used)))


def _bridge(name: str) -> type:
    def __new__(
        cls: type,
        env_fns: Sequence[Callable[[], Any]],
        copy: bool = True,
        observation_mode: Any = "same",
        autoreset_mode: Any = AutoresetMode.NEXT_STEP,
        **_async_only: Any,  # shared_memory, context, daemon, worker: no meaning here
    ) -> AenvGymnasiumVectorEnv:
        _used.add(_current[0])
        return make_gymnasium_vector(
            env_fns,
            backend=BACKEND,
            autoreset_mode=autoreset_mode,
            observation_mode=observation_mode,
        )

    return type(name, (AenvGymnasiumVectorEnv,), {"__new__": __new__})


SyncVectorEnv = _bridge("SyncVectorEnv")
AsyncVectorEnv = _bridge("AsyncVectorEnv")

for module in (
    gymnasium.vector,
    gymnasium.vector.sync_vector_env,
    gymnasium.vector.async_vector_env,
):
    module.SyncVectorEnv = SyncVectorEnv  # type: ignore[attr-defined]
    module.AsyncVectorEnv = AsyncVectorEnv  # type: ignore[attr-defined]
