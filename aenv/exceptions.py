"""Every public error aenv raises, in one tree.

::

    AenvError
    ├── SpecError (ValueError)                 bad spec construction or spec use
    │   ├── SpecViolationError                 a value outside its spec
    │   └── LockedSpecError (RuntimeError)     modifying a locked spec
    ├── EnvClosedError (RuntimeError)          using an env after aclose()
    ├── EnvBusyError (RuntimeError)            sending work to an env still working
    ├── EnvCancelledError (RuntimeError)       a per-env call whose work pool.cancel() stopped
    ├── ResetNeededError (RuntimeError)        stepping an env that must be reset first
    ├── DoneAfterResetError (RuntimeError)     an env reported done right after a reset
    ├── BatchSizeError (ValueError)            wrong input batch size on a batch-locked env
    ├── SpaceMismatchError (RuntimeError)      sub-env spaces a gymnasium vector env cannot batch
    ├── EnvStepError (RuntimeError)            a sub-env raised while working
    │   └── WorkerCrashedError                 a worker process died
    │       └── WorkerRestartError             a dead worker could not be brought back
    ├── StepTimeoutError (TimeoutError)        a sub-env step ran past its deadline
    ├── PoolError (RuntimeError)               several sub-envs failed in one call
    ├── AsyncContextError (RuntimeError)       a blocking sync API called in a running loop
    ├── BackendUnavailableError (ImportError)  a backend's optional dependency is missing
    └── SandboxError (RuntimeError)            a code sandbox could not run a program
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AenvError",
    "AsyncContextError",
    "BackendUnavailableError",
    "BatchSizeError",
    "DoneAfterResetError",
    "EnvBusyError",
    "EnvCancelledError",
    "EnvClosedError",
    "EnvStepError",
    "LockedSpecError",
    "PoolError",
    "ResetNeededError",
    "SandboxError",
    "SpaceMismatchError",
    "SpecError",
    "SpecViolationError",
    "StepTimeoutError",
    "WorkerCrashedError",
    "WorkerRestartError",
]


class AenvError(Exception):
    """Raised for any error of aenv's own; the root of the tree."""


class SpecError(AenvError, ValueError):
    """Raised when a spec is built with invalid arguments or used wrongly."""


class SpecViolationError(SpecError):
    """Raised when a value does not fit its spec (key, spec and value are named)."""

    def __init__(self, message: str, *, key: Any = None) -> None:
        super().__init__(message)
        self.key = key


class LockedSpecError(SpecError, RuntimeError):
    """Raised when a locked spec is modified."""


class EnvClosedError(AenvError, RuntimeError):
    """Raised when an env or pool is used after it was closed."""


class EnvBusyError(AenvError, RuntimeError):
    """Raised when work is sent to an env that is still working on earlier work."""

    def __init__(self, message: str, *, env_index: int | None = None) -> None:
        super().__init__(message)
        self.env_index = env_index


class EnvCancelledError(AenvError, RuntimeError):
    """Raised when a per-env pool call's work was stopped by ``pool.cancel(env_index)``."""

    def __init__(self, message: str, *, env_index: int | None = None) -> None:
        super().__init__(message)
        self.env_index = env_index


class ResetNeededError(AenvError, RuntimeError):
    """Raised when an env is stepped while it needs a reset (done, or never reset)."""


class DoneAfterResetError(AenvError, RuntimeError):
    """Raised when an env reports done right after a reset (unless allowed)."""


class BatchSizeError(AenvError, ValueError):
    """Raised when an input's batch size does not match a batch-locked env's."""


class SpaceMismatchError(AenvError, RuntimeError):
    """Raised when the sub-envs of a gymnasium vector bridge have spaces it cannot batch as
    asked (a RuntimeError, as gymnasium's vector envs raise)."""


class EnvStepError(AenvError, RuntimeError):
    """Raised when a sub-env raised while stepping or resetting.

    Carries the index of the failing env, the original exception's type name, and its
    formatted traceback (from the remote process or thread where it ran).
    """

    def __init__(
        self,
        message: str,
        *,
        env_index: int | None = None,
        remote_type: str | None = None,
        remote_traceback: str | None = None,
    ) -> None:
        super().__init__(message)
        self.env_index = env_index
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        base = super().__str__()
        if self.remote_traceback:
            return f"{base}\n\nRemote traceback:\n{self.remote_traceback.rstrip()}"
        return base

    def __reduce__(self) -> Any:
        return (
            _rebuild_step_error,
            (type(self), self.args, self.env_index, self.remote_type, self.remote_traceback),
        )


def _rebuild_step_error(
    cls: type[EnvStepError],
    args: tuple[Any, ...],
    env_index: int | None,
    remote_type: str | None,
    remote_traceback: str | None,
) -> EnvStepError:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.env_index = env_index
    err.remote_type = remote_type
    err.remote_traceback = remote_traceback
    if isinstance(err, WorkerCrashedError):
        err.exitcode = None
    return err


class WorkerCrashedError(EnvStepError):
    """Raised when a worker process hosting sub-envs died (exit code or signal attached)."""

    def __init__(
        self,
        message: str,
        *,
        env_index: int | None = None,
        exitcode: int | None = None,
    ) -> None:
        super().__init__(message, env_index=env_index, remote_type="WorkerCrashed")
        self.exitcode = exitcode

    @property
    def signal(self) -> int | None:
        """The signal that killed the worker, when it died from one."""
        if self.exitcode is not None and self.exitcode < 0:
            return -self.exitcode
        return None


class WorkerRestartError(WorkerCrashedError):
    """Raised when a worker process was given up after its env factories kept failing on restart."""

    def __init__(self, message: str, *, env_index: int | None = None, attempts: int = 0) -> None:
        super().__init__(message, env_index=env_index)
        self.attempts = attempts


class StepTimeoutError(AenvError, TimeoutError):
    """Raised when a sub-env's step or reset ran past its deadline."""

    def __init__(self, message: str, *, env_index: int | None = None) -> None:
        super().__init__(message)
        self.env_index = env_index


class PoolError(AenvError, RuntimeError):
    """Raised when a whole-batch pool call had failing sub-envs; holds each env's error.

    ``errors`` maps env index to the error of that env; ``results`` holds what the other
    envs returned, so nothing is lost. Raised out of a rollout, ``rollout`` holds the steps
    the rollout had finished before the failing one (None if none).
    """

    def __init__(
        self, message: str, *, errors: dict[int, BaseException], results: Any = None
    ) -> None:
        super().__init__(message)
        self.errors = errors
        self.results = results
        self.rollout: Any = None


class AsyncContextError(AenvError, RuntimeError):
    """Raised when a blocking sync API (``close()``, ``check_env_specs``, ...) is called inside a
    running event loop, where its ``a``-prefixed coroutine twin must be awaited instead."""


class BackendUnavailableError(AenvError, ImportError):
    """Raised when a pool backend or library wrapper needs an optional dependency that is missing."""


class SandboxError(AenvError, RuntimeError):
    """Raised when a code sandbox is closed or cannot start a program (not for what the
    program does: that is the run's result)."""
