"""EnvCreator: a picklable env factory that knows its env's metadata (the seeds' class)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from aenv.envs._common import EnvBase
from aenv.envs._utils import EnvMetaData
from aenv.sync._runner import get_runner

__all__ = ["EnvCreator"]


class EnvCreator:
    """Wraps an env factory so that it crosses process boundaries and knows its metadata.

    The factory (and its keyword arguments) is pickled with cloudpickle, so lambdas and
    closures work in worker processes. :attr:`meta_data` (specs, batch size, device) is read
    once and shared by every copy made afterwards: a process pool fills it from the envs its
    workers built; read before any pool did, it builds one env here, reads it and closes it.

    Args:
        create_env_fn: a callable returning an :class:`~aenv.EnvBase`.
        create_env_kwargs: keyword arguments passed to it on every call.

    Example:
        >>> from aenv import EnvCreator
        >>> from aenv.testing import CountingEnv
        >>> make = EnvCreator(lambda max_steps: CountingEnv(max_steps=max_steps), {"max_steps": 3})
        >>> make.meta_data.batch_size
        torch.Size([])
        >>> env = make()
    """

    def __init__(
        self,
        create_env_fn: Callable[..., EnvBase],
        create_env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(create_env_fn, EnvCreator):
            inner: EnvCreator = create_env_fn
            create_env_kwargs = {**inner.create_env_kwargs, **(create_env_kwargs or {})}
            create_env_fn = inner.create_env_fn
        if not callable(create_env_fn):
            raise TypeError(f"create_env_fn must be callable, got {type(create_env_fn).__name__}")
        self.create_env_fn: Callable[..., EnvBase] = create_env_fn
        self.create_env_kwargs: dict[str, Any] = dict(create_env_kwargs or {})
        self._meta_data: EnvMetaData | None = None

    def __call__(self, **kwargs: Any) -> EnvBase:
        """Build one env (``kwargs`` override the stored keyword arguments)."""
        env = self.create_env_fn(**{**self.create_env_kwargs, **kwargs})
        if not isinstance(env, EnvBase):
            raise TypeError(f"the env factory returned {type(env).__name__}, not an aenv EnvBase")
        return env

    @property
    def meta_data(self) -> EnvMetaData:
        """The env's metadata, read once (see the class docstring)."""
        if self._meta_data is None:
            env = self()
            try:
                self._meta_data = EnvMetaData.metadata_from_env(env)
            finally:
                _close_quietly(env)
        return self._meta_data

    def _note_meta_data(self, meta: EnvMetaData) -> None:
        """Record metadata read elsewhere (a worker process) if none is known yet."""
        if self._meta_data is None:
            self._meta_data = meta

    def __getstate__(self) -> dict[str, Any]:
        import cloudpickle

        return {
            "fn": cloudpickle.dumps((self.create_env_fn, self.create_env_kwargs)),
            "meta": self._meta_data,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        import cloudpickle

        self.create_env_fn, self.create_env_kwargs = cloudpickle.loads(state["fn"])
        self._meta_data = state["meta"]

    def __repr__(self) -> str:
        name = getattr(self.create_env_fn, "__name__", type(self.create_env_fn).__name__)
        return f"EnvCreator({name}, create_env_kwargs={self.create_env_kwargs})"


def _close_quietly(env: EnvBase) -> None:
    with contextlib.suppress(Exception):  # a metadata probe env: closing is best effort
        get_runner().run(env.aclose)
