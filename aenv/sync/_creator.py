"""EnvCreator: a picklable env factory that knows its env's metadata and carries the state
(transform buffers) its envs start from (the seeds' class)."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from aenv.envs._common import EnvBase
from aenv.envs._utils import EnvMetaData
from aenv.sync._runner import get_runner

__all__ = ["EnvCreator", "env_state_dict", "load_env_state_dict"]


def env_state_dict(env: Any) -> OrderedDict[str, torch.Tensor]:
    """The state of ``env`` as TorchRL's ``env.state_dict()`` gives it: its transforms'
    buffers and parameters under ``"transform."``, its base env's under ``"base_env."`` (an
    env that is an ``nn.Module`` or has its own ``state_dict`` gives that). Tensors are the
    env's own (not copies)."""
    own = getattr(env, "state_dict", None)
    if callable(own) and not _is_ours(own):
        return OrderedDict(own())
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    state = getattr(env, "__dict__", {})
    chain = state.get("transform")
    if isinstance(chain, nn.Module):
        out.update((f"transform.{k}", v) for k, v in chain.state_dict(keep_vars=True).items())
    base = state.get("base_env")
    if isinstance(base, EnvBase):
        out.update((f"base_env.{k}", v) for k, v in env_state_dict(base).items())
    return out


def load_env_state_dict(env: Any, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Load ``state_dict`` (as :func:`env_state_dict` gives it) into ``env``, values copied;
    keys the env does not have are left out (TorchRL's ``strict=False``). A buffer the env
    holds as None (a transform not initialized yet: an ``ObservationNorm`` without
    ``loc``) takes a copy of the value; then the env's specs are recomputed."""
    own = getattr(env, "load_state_dict", None)
    if callable(own) and not _is_ours(own):
        own(state_dict, strict=False)
        return
    state = getattr(env, "__dict__", {})
    chain = state.get("transform")
    if isinstance(chain, nn.Module):
        _load_module(chain, _under(state_dict, "transform."))
    base = state.get("base_env")
    if isinstance(base, EnvBase):
        load_env_state_dict(base, _under(state_dict, "base_env."))
    changed = getattr(env, "transform_changed", None)
    if isinstance(chain, nn.Module) and callable(changed):
        changed()  # (an initialized transform may map the specs differently)


def _is_ours(method: Any) -> bool:
    # the sync face's own state_dict / load_state_dict call the functions above
    return getattr(method, "__func__", None) in _OWN_METHODS


_OWN_METHODS: set[Any] = set()


def _under(state_dict: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}


def _load_module(module: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    for key, value in state_dict.items():
        path, _, name = key.rpartition(".")
        try:
            owner = module.get_submodule(path)
        except AttributeError:
            continue
        if name in owner._buffers and owner._buffers[name] is None:
            owner._buffers[name] = value.detach().clone()
    module.load_state_dict(dict(state_dict), strict=False)


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
        # the state every env built from here on starts from (None: the factory's own)
        self._state: OrderedDict[str, torch.Tensor] | None = None

    def __call__(self, **kwargs: Any) -> EnvBase:
        """Build one env (``kwargs`` override the stored keyword arguments), loaded with
        the creator's state where it has one (see :meth:`state_dict`)."""
        env = self.create_env_fn(**{**self.create_env_kwargs, **kwargs})
        if not isinstance(env, EnvBase):
            raise TypeError(f"the env factory returned {type(env).__name__}, not an aenv EnvBase")
        if self._state:
            load_env_state_dict(env, self._state)
        return env

    def state_dict(self) -> OrderedDict[str, torch.Tensor]:
        """The state the envs built by this creator start from: transform buffers such as
        an ``ObservationNorm``'s ``loc`` and ``scale`` (see :func:`env_state_dict` for the
        keys). Read once from an env built here (aenv's transforms make their buffers when
        the env is built: TorchRL's reset and random step are not needed), kept in shared
        memory, unless :meth:`load_state_dict` came first; the tensors are
        the creator's own: changing them in place changes what later envs get. Envs built
        in worker processes get the values the creator held when their pool started."""
        if self._state is None:
            env = self()
            try:
                state = OrderedDict(
                    (k, v.detach().clone().share_memory_()) for k, v in env_state_dict(env).items()
                )
                if self._meta_data is None:
                    self._meta_data = EnvMetaData.metadata_from_env(env)
            finally:
                _close_quietly(env)
            self._state = state
        return self._state

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Set the state later envs start from (e.g. ``creator.load_state_dict(
        env.state_dict())`` after ``init_stats`` on one env): values are copied into the
        creator's tensors; keys it did not have are added.

        Raises:
            TypeError: a value is not a tensor.
            ValueError: a value's shape or dtype differs from the creator's tensor of that
                key (nothing is changed then).
        """
        # (before any state was read, the loaded keys are the state: envs load it non-strictly)
        current = self._state if self._state is not None else OrderedDict()
        for key, value in state_dict.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"EnvCreator.load_state_dict: {key!r} must be a tensor, got "
                    f"{type(value).__name__}"
                )
            held = current.get(key)
            if held is not None and (held.shape != value.shape or held.dtype != value.dtype):
                raise ValueError(
                    f"EnvCreator.load_state_dict: {key!r} has shape {tuple(value.shape)} and "
                    f"dtype {value.dtype}; the creator holds shape {tuple(held.shape)} and "
                    f"dtype {held.dtype}"
                )
        for key, value in state_dict.items():
            held = current.get(key)
            if held is None:
                current[key] = value.detach().clone().share_memory_()
            else:
                held.copy_(value)
        self._state = current

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
            # the values as they are now (a worker's envs start from them)
            "state": None
            if self._state is None
            else {k: v.clone() for k, v in self._state.items()},
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        import cloudpickle

        self.create_env_fn, self.create_env_kwargs = cloudpickle.loads(state["fn"])
        self._meta_data = state["meta"]
        kept = state.get("state")
        self._state = None if kept is None else OrderedDict(kept)

    def __repr__(self) -> str:
        name = getattr(self.create_env_fn, "__name__", type(self.create_env_fn).__name__)
        return f"EnvCreator({name}, create_env_kwargs={self.create_env_kwargs})"


def _close_quietly(env: EnvBase) -> None:
    with contextlib.suppress(Exception):  # a metadata probe env: closing is best effort
        get_runner().run(env.aclose)
