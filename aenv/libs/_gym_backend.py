"""Which gym library aenv's gym wrappers use: gymnasium (shipped) or the legacy ``gym``."""

from __future__ import annotations

import contextvars
import functools
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from aenv.exceptions import BackendUnavailableError

__all__ = ["gym_backend", "set_gym_backend"]

F = TypeVar("F", bound=Callable[..., Any])

_BACKEND: contextvars.ContextVar[ModuleType | None] = contextvars.ContextVar(
    "aenv_gym_backend", default=None
)


def _import_backend(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if name == "gym":
            raise BackendUnavailableError(
                "the legacy `gym` package is not installed (pip install gym); aenv ships with "
                "gymnasium, its default gym backend: use set_gym_backend('gymnasium')"
            ) from exc
        raise BackendUnavailableError(
            f"gym backend {name!r} is not installed (pip install {name})"
        ) from exc


def gym_backend(submodule: str | None = None) -> ModuleType:
    """The gym library in use (gymnasium unless :func:`set_gym_backend` says otherwise),
    or one of its submodules.

    Example:
        >>> gym_backend().__name__
        'gymnasium'
        >>> gym_backend("wrappers").__name__
        'gymnasium.wrappers'
    """
    module = _BACKEND.get()
    if module is None:
        module = _import_backend("gymnasium")
    if submodule is None:
        return module
    return importlib.import_module(f"{module.__name__}.{submodule}")


class set_gym_backend:
    """Use ``backend`` (a module or its name: ``"gymnasium"``, ``"gym"``) as the gym library,
    as a context manager or a function decorator.

    The choice lives in a context variable: it holds for the ``with`` block (or the decorated
    call), in this thread or task only.

    Example:
        >>> with set_gym_backend("gymnasium"):
        ...     env = GymEnv("Pendulum-v1")
        >>> @set_gym_backend("gymnasium")
        ... def make():
        ...     return GymEnv("CartPole-v1")
    """

    def __init__(self, backend: str | ModuleType) -> None:
        self._name = backend if isinstance(backend, str) else backend.__name__
        self._module = None if isinstance(backend, str) else backend
        self._tokens: list[contextvars.Token[ModuleType | None]] = []

    @property
    def module(self) -> ModuleType:
        """The backend module (imported on first use)."""
        if self._module is None:
            self._module = _import_backend(self._name)
        return self._module

    def __enter__(self) -> ModuleType:
        module = self.module
        self._tokens.append(_BACKEND.set(module))
        return module

    def __exit__(self, *exc: object) -> None:
        _BACKEND.reset(self._tokens.pop())

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"set_gym_backend({self._name!r})"


def to_gymnasium_space(space: Any) -> Any:
    """A gymnasium space equal to a legacy ``gym`` space (gymnasium ones are returned as is)."""
    import gymnasium.spaces as spaces

    if isinstance(space, spaces.Space):
        return space
    name = type(space).__name__
    if name == "Box":
        return spaces.Box(space.low, space.high, space.shape, space.dtype)
    if name == "Discrete":
        return spaces.Discrete(int(space.n), start=int(getattr(space, "start", 0)))
    if name == "MultiDiscrete":
        return spaces.MultiDiscrete(space.nvec)
    if name == "MultiBinary":
        return spaces.MultiBinary(space.n)
    if name == "Dict":
        return spaces.Dict({k: to_gymnasium_space(v) for k, v in space.spaces.items()})
    if name == "Tuple":
        return spaces.Tuple([to_gymnasium_space(v) for v in space.spaces])
    if name == "Text":
        return spaces.Text(space.max_length, min_length=space.min_length)
    raise TypeError(f"cannot convert gym space {name} to a gymnasium space")
