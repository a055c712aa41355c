"""Envs with TorchRL's sync verbs over aenv's async ones: ``EnvBase``, ``TransformedEnv``,
``GymEnv``, and :func:`async_env` to hand any of them to aenv's async API.

A class here puts :class:`SyncVerbs` before an aenv env class: its ``reset``, ``step``,
``step_and_maybe_reset``, ``rand_step``, ``rollout`` and ``set_seed`` are plain methods, each
one call through aenv's loop runner into the async implementation. That implementation runs
on the env's *async face*: an object of a twin class (the same class with the async verbs
put back) sharing the env's ``__dict__``, so the env and its face are one state seen through
two sets of verbs. Everything aenv's engine touches (pools, transforms, rollouts) gets the
face and awaits it, exactly as it awaits any aenv env; nothing is implemented twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from tensordict import TensorDictBase

from aenv.envs._common import EnvBase as _AsyncEnvBase
from aenv.envs._utils import acheck_env_specs
from aenv.libs.gym import GymEnv as _AsyncGymEnv
from aenv.libs.gym import GymWrapper as _AsyncGymWrapper
from aenv.specs import Composite
from aenv.sync._creator import _OWN_METHODS, env_state_dict, load_env_state_dict
from aenv.sync._facades import SyncEnv
from aenv.sync._runner import get_runner
from aenv.transforms import Compose, Transform
from aenv.transforms._env import TransformedEnv as _AsyncTransformedEnv
from aenv.transforms._env import _TransformedEnvMeta

__all__ = [
    "EnvBase",
    "GymEnv",
    "GymWrapper",
    "SyncVerbs",
    "TransformedEnv",
    "_apply_to_composite",
    "async_env",
    "check_env_specs",
]

#: the env verbs that are coroutines on aenv envs and plain methods here
VERBS = ("reset", "step", "step_and_maybe_reset", "rand_step", "rollout", "set_seed")


class SyncVerbs:
    """Mixin placed before an aenv env class: TorchRL's sync verbs over the async ones.

    Each subclass gets a twin class (its async face, see the module docstring) whose verbs
    are the aenv class's coroutines. Called from a running event loop (Jupyter), the verbs
    run on the runner's background loop thread, as the sync facades do.
    """

    _aenv_async_cls: ClassVar[type]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_aenv_async_face" in cls.__dict__:
            return
        later = cls.__mro__[cls.__mro__.index(SyncVerbs) + 1 :]
        namespace: dict[str, Any] = {
            "_aenv_async_face": True,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
        }
        for verb in VERBS:  # the aenv class's coroutine, skipping the sync ones above it
            namespace[verb] = next(k.__dict__[verb] for k in later if verb in k.__dict__)
        namespace.update(cls._async_face_extras())
        cls._aenv_async_cls = type(cls.__name__, (cls,), namespace)

    @classmethod
    def _async_face_extras(cls) -> dict[str, Any]:
        """More attributes the async face restores (a subclass's public overrides)."""
        return {}

    def _face(self) -> Any:
        return async_env(self)

    def _sync_call(self, verb: str, *args: Any, **kwargs: Any) -> Any:
        return get_runner().run(getattr(self._face(), verb), *args, **kwargs)

    def reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        """Reset (or partially reset through ``"_reset"``); returns the reset tensordict."""
        return self._sync_call("reset", tensordict, **kwargs)  # type: ignore[no-any-return]

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Step; writes ``"next"`` into ``tensordict`` and returns it."""
        return self._sync_call("step", tensordict)  # type: ignore[no-any-return]

    def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Step, then reset what is done: ``(stepped, next_input)``."""
        return self._sync_call("step_and_maybe_reset", tensordict)  # type: ignore[no-any-return]

    def rand_step(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Step with a random action."""
        return self._sync_call("rand_step", tensordict)  # type: ignore[no-any-return]

    def rollout(
        self,
        max_steps: int,
        policy: Callable[..., Any] | None = None,
        callback: Callable[..., Any] | None = None,
        **kwargs: Any,
    ) -> TensorDictBase:
        """A rollout of ``max_steps`` steps, stacked along a trailing ``"time"`` dim."""
        return self._sync_call("rollout", max_steps, policy, callback, **kwargs)  # type: ignore[no-any-return]

    def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seed the env (works in ``__init__`` too); returns the next seed."""
        return self._sync_call("set_seed", seed, static_seed)  # type: ignore[no-any-return]

    def close(self, *, raise_if_closed: bool = True) -> None:
        """Close the env (idempotent; ``raise_if_closed`` is accepted for TorchRL's sake)."""
        face = self._face()
        if not face.is_closed:
            get_runner().run(face.aclose)

    # nn.Module-style calls that TorchRL scripts make on envs: envs hold no parameters
    def eval(self) -> Any:
        """Returns the env (an env has no training mode; kept for ``nn.Module`` callers)."""
        return self

    def train(self, mode: bool = True) -> Any:
        """Returns the env (see :meth:`eval`)."""
        return self

    def state_dict(self) -> OrderedDict[str, torch.Tensor]:
        """The env's state as TorchRL's ``nn.Module`` envs give it: its transforms' buffers
        under ``"transform."``, its base env's under ``"base_env."`` (the env's own tensors)."""
        return env_state_dict(self)

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Load a :meth:`state_dict` (values copied); ``strict`` (TorchRL's default) refuses
        keys the env lacks and a state that leaves some of the env's keys out."""
        if strict:
            have = set(env_state_dict(self))
            given = set(state_dict)
            missing, unexpected = sorted(have - given), sorted(given - have)
            if missing or unexpected:
                raise RuntimeError(
                    f"Error(s) in loading state_dict for {type(self).__name__}: missing keys "
                    f"{missing}, unexpected keys {unexpected} (strict=False loads what fits)"
                )
        load_env_state_dict(self, state_dict)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_OWN_METHODS.update((SyncVerbs.state_dict, SyncVerbs.load_state_dict))


def async_env(env: Any) -> Any:
    """The aenv async env behind ``env``: an env of this namespace's face, a sync facade's
    env, or ``env`` itself when it already is an aenv env.

    Example:
        >>> from aenv.torchrl import GymEnv, async_env
        >>> face = async_env(GymEnv("CartPole-v1"))
        >>> import inspect; inspect.iscoroutinefunction(face.reset)
        True
    """
    if isinstance(env, SyncVerbs) and "_aenv_async_face" not in type(env).__dict__:
        state = env.__dict__
        face: Any = state.get("_aenv_async_face_obj")
        if face is None:
            face = object.__new__(type(env)._aenv_async_cls)
            face.__dict__ = state  # one state, two sets of verbs
            state["_aenv_async_face_obj"] = face
        return face
    if isinstance(env, SyncEnv):
        return env.env
    return env


def async_factory(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` returning the async face of the env it builds (picklable when ``fn`` is)."""
    return fn if isinstance(fn, _AsyncFactory) else _AsyncFactory(fn)


class _AsyncFactory:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return async_env(self.fn(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:  # EnvCreator's meta_data and the like
        if name.startswith("__") or name == "fn":
            raise AttributeError(name)
        return getattr(self.fn, name)


class EnvBase(SyncVerbs, _AsyncEnvBase):  # type: ignore[misc]  # sync verbs by design
    """TorchRL's ``EnvBase``: subclass it as in TorchRL; its verbs are sync.

    Implement ``_reset``, ``_step`` and ``_set_seed`` and set the specs in ``__init__`` as
    for :class:`aenv.EnvBase` (TorchRL's ``batch_locked = False`` class attribute and
    ``self.set_seed(seed)`` in ``__init__`` work). Pass it to aenv's async API through
    :func:`async_env`; this namespace's classes do that themselves.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from aenv.torchrl import Composite, EnvBase, Unbounded
        >>> class Walk(EnvBase):
        ...     def __init__(self, seed=0):
        ...         super().__init__()
        ...         self.observation_spec = Composite(x=Unbounded((1,)))
        ...         self.action_spec = Unbounded((1,))
        ...         self.set_seed(seed)
        ...     def _set_seed(self, seed):
        ...         self.rng = torch.Generator().manual_seed(seed)
        ...     def _reset(self, td):
        ...         return TensorDict(x=torch.rand(1, generator=self.rng))
        ...     def _step(self, td):
        ...         return TensorDict(x=td["x"] + td["action"], reward=-td["x"].abs())
        >>> Walk().rollout(5).batch_size
        torch.Size([5])
    """


class _SyncTransformedEnvMeta(_TransformedEnvMeta):
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        # the base env of any kind (this namespace's env, a sync facade) is its async env
        given = args[0] if args else kwargs.get("env")
        if args:
            args = (async_env(given), *args[1:])
        elif "env" in kwargs:
            kwargs["env"] = async_env(given)
        obj = super().__call__(*args, **kwargs)
        obj.__dict__["_given_base_env"] = given  # what `base_env` says, as in TorchRL
        return obj


class TransformedEnv(SyncVerbs, _AsyncTransformedEnv, metaclass=_SyncTransformedEnvMeta):  # type: ignore[misc]  # sync verbs by design
    """TorchRL's ``TransformedEnv``, sync: over any env (this namespace's, an aenv env or a
    sync facade such as ``SerialEnv``).

    As in TorchRL, ``TransformedEnv(env, t).transform`` is ``t`` itself until a second
    transform is appended (then a ``Compose`` of them).

    Example:
        >>> from aenv.torchrl import GymEnv, StepCounter, TransformedEnv
        >>> env = TransformedEnv(GymEnv("Pendulum-v1"), StepCounter(5))
        >>> env.rollout(10)["next", "step_count"].squeeze(-1).tolist()
        [1, 2, 3, 4, 5]
    """

    @classmethod
    def _async_face_extras(cls) -> dict[str, Any]:
        # the engine reads the chain itself (always a Compose) and the async base env
        return {
            "transform": property(lambda self: self.__dict__["transform"]),
            "base_env": property(lambda self: self.__dict__["base_env"]),
        }

    @property
    def base_env(self) -> Any:
        """The env this one transforms, as it was given (a ``SerialEnv``, a ``GymEnv``...)."""
        state = self.__dict__
        return state.get("_given_base_env", state["base_env"])

    @property
    def transform(self) -> Any:
        """The transform: the one given, or the ``Compose`` of several."""
        chain = self.__dict__["transform"]
        single = self.__dict__.get("_single_transform")
        if single is not None and len(chain) == 1 and chain[0] is single:
            return single
        return chain

    def __init__(self, env: Any, transform: Transform | None = None, *args: Any, **kw: Any):
        super().__init__(env, transform, *args, **kw)
        if isinstance(transform, Transform) and not isinstance(transform, Compose):
            self.__dict__["_single_transform"] = transform


class GymWrapper(SyncVerbs, _AsyncGymWrapper):  # type: ignore[misc]  # sync verbs by design
    """TorchRL's ``GymWrapper`` with sync verbs (a Gymnasium env instance)."""


class GymEnv(SyncVerbs, _AsyncGymEnv):  # type: ignore[misc]  # sync verbs by design
    """TorchRL's ``GymEnv`` with sync verbs; ``GymEnv.available_envs`` lists the ids
    Gymnasium has registered.

    Example:
        >>> from aenv.torchrl import GymEnv
        >>> "CartPole-v1" in GymEnv.available_envs
        True
        >>> GymEnv("CartPole-v1").rollout(3).batch_size
        torch.Size([3])
    """

    class _AvailableEnvs:
        def __get__(self, obj: Any, owner: type) -> list[str]:
            import gymnasium

            return list(gymnasium.envs.registry.keys())

    available_envs: ClassVar[list[str]] = _AvailableEnvs()  # type: ignore[assignment]


def check_env_specs(
    env: Any,
    return_contiguous: bool = True,
    check_dtype: bool = True,
    seed: int | None = None,
    tensordict: TensorDictBase | None = None,
    max_steps: int = 3,
) -> None:
    """TorchRL's ``check_env_specs``: a short rollout checked against the env's specs.

    Sync from anywhere (in a running loop it runs on the runner's background thread, as
    the facades do), on any env of this namespace, aenv env or sync facade; a mismatch
    raises ``AssertionError`` naming the key. It never hands back a coroutine.

    Example:
        >>> from aenv.torchrl import GymEnv, check_env_specs
        >>> check_env_specs(GymEnv("CartPole-v1"))
    """
    get_runner().run(
        acheck_env_specs,
        async_env(env),
        return_contiguous=return_contiguous,
        check_dtype=check_dtype,
        seed=seed,
        tensordict=tensordict,
        max_steps=max_steps,
    )


def _apply_to_composite(
    function: Callable[[Any, Any], Any],
) -> Callable[[Any, Any], Any]:
    """TorchRL's decorator for a transform's ``transform_observation_spec`` written for one
    leaf: applied to a ``Composite``, it maps each ``in_key``'s spec through ``function`` into
    its ``out_key``; applied to a leaf spec, it is ``function`` itself.

    Example:
        >>> class Sin(Transform):
        ...     def _apply_transform(self, obs):
        ...         return obs.sin()
        ...     @_apply_to_composite
        ...     def transform_observation_spec(self, spec):
        ...         return Bounded(-1, 1, shape=spec.shape, dtype=spec.dtype)
    """

    def per_key(self: Any, spec: Any) -> Any:
        if not isinstance(spec, Composite):
            return function(self, spec)
        keys = spec.keys(True, True)
        for in_key, out_key in zip(self.in_keys, self.out_keys, strict=True):
            if in_key in keys:
                spec[out_key] = function(self, spec[in_key].clone())
        return spec

    per_key.__name__ = getattr(function, "__name__", "transform_observation_spec")
    per_key.__doc__ = function.__doc__
    return per_key
