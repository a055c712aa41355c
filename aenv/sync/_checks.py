"""check_env_specs from sync code (TorchRL's helper); its coroutine is
:func:`aenv.envs.acheck_env_specs`."""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase

from aenv.envs._utils import acheck_env_specs
from aenv.sync._facades import SyncEnv
from aenv.sync._runner import run_blocking

__all__ = ["check_env_specs"]


def check_env_specs(
    env: Any,
    return_contiguous: bool = True,
    check_dtype: bool = True,
    seed: int | None = None,
    tensordict: TensorDictBase | None = None,
    max_steps: int = 3,
) -> None:
    """Check, from sync code, that what the env outputs matches its specs (TorchRL's helper).

    ``env`` is an aenv env or a sync facade (``SerialEnv``, ``ParallelEnv``, ``SyncEnv``).
    The check is :func:`acheck_env_specs`, run to completion through aenv's loop runner;
    inside a running event loop this raises :class:`~aenv.exceptions.AsyncContextError`
    for an async env (await :func:`acheck_env_specs` there); a facade works anywhere.

    Example:
        >>> check_env_specs(CountingEnv())
    """
    kwargs: dict[str, Any] = dict(
        return_contiguous=return_contiguous,
        check_dtype=check_dtype,
        seed=seed,
        tensordict=tensordict,
        max_steps=max_steps,
    )
    if isinstance(env, SyncEnv):
        env.check_env_specs(**kwargs)
        return
    run_blocking(
        acheck_env_specs,
        env,
        api="check_env_specs(env)",
        twin="await acheck_env_specs(env)",
        **kwargs,
    )
