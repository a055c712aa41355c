"""GymLikeEnv: the base of wrappers around backends that step with numpy-like values.

A gym-like backend (``self._env``) has ``step(action) -> (obs, reward, terminated, truncated,
info)`` and ``reset(seed=, options=) -> (obs, info)``. :class:`GymLikeEnv` turns those into
aenv tensordicts through small overridable readers (``read_obs``, ``read_reward``,
``read_done``, ``read_action``) and optional info-dict readers, built once from the specs.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.exceptions import SpecError
from aenv.specs import Categorical, Composite, TensorSpec, Unbounded
from aenv.specs._numpy import from_numpy_fn, np_dtype, to_numpy_fn

__all__ = ["BaseInfoDictReader", "DefaultInfoDictReader", "GymLikeEnv", "default_info_dict_reader"]


def _bool_spec(batch_size: torch.Size, device: torch.device | None) -> Categorical:
    return Categorical(2, shape=(*batch_size, 1), dtype=torch.bool, device=device)


class BaseInfoDictReader(abc.ABC):
    """Reads entries of a backend's ``info`` dict into the step's tensordict.

    Subclasses implement ``__call__(info, tensordict) -> tensordict`` and ``info_spec`` (a
    Composite of what they write, with the env's batch dims), which the env adds to its
    observation spec.
    """

    @abc.abstractmethod
    def __call__(self, info_dict: Mapping[str, Any], tensordict: TensorDictBase) -> TensorDictBase:
        """Write the entries read from ``info_dict`` into ``tensordict`` and return it."""

    @property
    @abc.abstractmethod
    def info_spec(self) -> Composite | None:
        """The spec of the entries written (None while it is still to be inferred)."""

    def infer_spec(self, infos: Sequence[Mapping[str, Any]], batch_size: torch.Size) -> None:  # noqa: B027
        """Learn the spec from sample info dicts (called by the env when ``info_spec`` is None)."""


class DefaultInfoDictReader(BaseInfoDictReader):
    """Reads the numeric entries (numbers, bools, numeric arrays, nested dicts of them) of info.

    Args:
        keys: the info keys to read (None: every numeric key found in sample infos).
        spec: their specs (a Composite or a dict key -> spec, with the env's batch dims);
            None infers them from sample infos the env collects (a reset and a step).
        ignore_private: skip keys starting with ``"_"`` (gymnasium's vector-env masks).

    A key missing from an info dict (reset infos often lack step entries) reads as zeros.

    Example:
        >>> env = GymEnv("CartPole-v1")
        >>> env.set_info_dict_reader(DefaultInfoDictReader(["x"], spec={"x": Unbounded(())}))
    """

    def __init__(
        self,
        keys: Sequence[str] | None = None,
        spec: Composite | Mapping[str, TensorSpec] | None = None,
        *,
        ignore_private: bool = True,
    ) -> None:
        self.keys = list(keys) if keys is not None else None
        self.ignore_private = ignore_private
        self._spec: Composite | None = None
        if spec is not None:
            self._set_spec(spec if isinstance(spec, Composite) else Composite(dict(spec)))

    @property
    def info_spec(self) -> Composite | None:
        return self._spec

    def _set_spec(self, spec: Composite) -> None:
        if self.keys is not None:
            missing = [k for k in self.keys if k not in spec.keys()]
            if missing:
                raise SpecError(f"info keys {missing} have no spec in {spec}")
        self._spec = spec
        self._readers = {k: (from_numpy_fn(v), v.zero()) for k, v in spec.items()}

    def infer_spec(self, infos: Sequence[Mapping[str, Any]], batch_size: torch.Size) -> None:
        specs: dict[str, TensorSpec] = {}
        for info in infos:
            for key, value in info.items():
                if key in specs or (self.keys is not None and key not in self.keys):
                    continue
                if self.ignore_private and key.startswith("_"):
                    continue
                spec = _infer(value, batch_size)
                if spec is not None:
                    specs[key] = spec
        if self.keys is not None:
            missing = [k for k in self.keys if k not in specs]
            if missing:
                raise SpecError(
                    f"info keys {missing} were not found (or are not numeric) in the sample "
                    "infos; pass their spec to DefaultInfoDictReader(spec=...)"
                )
        self._set_spec(Composite(specs, shape=batch_size))

    def __call__(self, info_dict: Mapping[str, Any], tensordict: TensorDictBase) -> TensorDictBase:
        for key, (read, zero) in self._readers.items():
            value = info_dict.get(key)
            tensordict.set(key, zero.clone() if value is None else read(value))
        return tensordict


default_info_dict_reader = DefaultInfoDictReader  # TorchRL's name


def _infer(value: Any, batch_size: torch.Size) -> TensorSpec | None:
    if isinstance(value, Mapping):
        subs = {k: _infer(v, batch_size) for k, v in value.items() if not str(k).startswith("_")}
        subs_ok = {k: s for k, s in subs.items() if s is not None}
        return Composite(subs_ok, shape=batch_size) if subs_ok else None
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        return None
    if tuple(arr.shape[: len(batch_size)]) != tuple(batch_size):
        return None
    dtype = torch.from_numpy(np.zeros((), dtype=arr.dtype)).dtype
    return Unbounded(shape=arr.shape, dtype=dtype)


def _reward_np_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype rewards are read as: the reward spec's (float32 where numpy lacks it)."""
    try:
        return np_dtype(dtype)
    except TypeError:
        return np.dtype(np.float32)


class GymLikeEnv(EnvBase):
    """Base of envs reading obs / reward / done / info from a gym-like backend ``self._env``.

    Subclasses build the backend, then call :meth:`_init_gym_specs` with the observation and
    action specs. Steps call ``self._env.step(read_action(action))`` (``frame_skip`` times,
    summing rewards) and turn the outputs into a tensordict with :meth:`read_obs`,
    :meth:`read_reward`, :meth:`read_done` and the info-dict readers. ``_output_transform``
    and ``_reset_output_transform`` adapt other backends' return conventions.

    Example:
        >>> class MyWrapper(GymLikeEnv):
        ...     def __init__(self, backend):
        ...         super().__init__()
        ...         self._env = backend
        ...         self._init_gym_specs(Composite(observation=Unbounded((3,))), Unbounded((1,)))
    """

    _env: Any
    frame_skip: int = 1
    # _step writes terminated, truncated and done (consistent, from read_done): EnvBase.step
    # need not complete them. A subclass replacing _step opts out unless it says otherwise.
    _done_outputs_complete = True

    #: The methods a subclass (or an instance) customises a gym-like env with. A wrapper's
    #: plain path (``_plain_step``: the backend stepped and its outputs written without the
    #: readers) runs only while none of them is replaced below the class that defines it:
    #: ``_plain_ok`` on the class; on the instance, ``_no_instance_extensions`` (kept until
    #: one of them is assigned or deleted there).
    EXTENSION_POINTS: ClassVar[frozenset[str]] = frozenset(
        (
            "_step",
            "_reset",
            "read_action",
            "read_obs",
            "read_reward",
            "read_done",
            "_output_transform",
            "_reset_output_transform",
        )
    )
    _plain_ok: ClassVar[bool] = True
    #: what decides, besides the extension points, whether a wrapper's plain path may write
    #: rows inline (``_fast``, ``blocking``, ``run_type_checks``: see
    #: :meth:`~aenv.libs.GymWrapper._writes_rows_now`)
    _ROW_CONDITIONS: ClassVar[frozenset[str]] = EXTENSION_POINTS | {
        "_fast",
        "blocking",
        "run_type_checks",
    }
    # decisions kept on the instance until one of _ROW_CONDITIONS is assigned or deleted
    # there (see __setattr__), None until made: whether no extension point is replaced on
    # the instance; whether the row hooks may write rows (a wrapper's)
    _plain_instance: bool | None = None
    _rows_ok: bool | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name in GymLikeEnv._ROW_CONDITIONS:
            self._forget_decisions()
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if name in GymLikeEnv._ROW_CONDITIONS:
            self._forget_decisions()
        super().__delattr__(name)

    def _forget_decisions(self) -> None:
        entries = self.__dict__
        entries.pop("_plain_instance", None)
        entries.pop("_rows_ok", None)

    def _no_instance_extensions(self) -> bool:
        """Whether no extension point is replaced on this instance (``env.read_obs = f``),
        kept until one is assigned or deleted there."""
        plain = self._plain_instance
        if plain is None:
            plain = self.__dict__.keys().isdisjoint(GymLikeEnv.EXTENSION_POINTS)
            self.__dict__["_plain_instance"] = plain
        return plain

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_step" in cls.__dict__ and "_done_outputs_complete" not in cls.__dict__:
            cls._done_outputs_complete = False
        if "_plain_step" in cls.__dict__:
            # the class writing a plain path vouches for its own extension points and its
            # bases'; a class below it replacing one turns the path off
            cls._plain_ok = True
        elif not GymLikeEnv.EXTENSION_POINTS.isdisjoint(cls.__dict__):
            cls._plain_ok = False

    def _init_gym_specs(
        self,
        observation_spec: Composite,
        action_spec: TensorSpec,
        *,
        action_space: Any = None,
        reward_spec: TensorSpec | None = None,
    ) -> None:
        bs, dev = self.batch_size, self._device
        self.observation_spec = observation_spec
        self.action_spec = action_spec
        self.reward_spec = reward_spec if reward_spec is not None else Unbounded((*bs, 1), dev)
        self.full_done_spec = Composite(
            done=_bool_spec(bs, dev),
            terminated=_bool_spec(bs, dev),
            truncated=_bool_spec(bs, dev),
            shape=bs,
            device=dev,
        )
        self._obs_readers = {k: from_numpy_fn(v, dev) for k, v in observation_spec.items()}
        self._action_writer = to_numpy_fn(self.full_action_spec["action"], action_space)
        self._info_readers: list[BaseInfoDictReader] = []
        self._flag_shape = (*bs, 1)
        self._reward_np = _reward_np_dtype(self.full_reward_spec["reward"].dtype)

    # ------------------------------------------------------------------ readers
    def read_action(self, action: Any) -> Any:
        """The backend value of an action tensor (numpy / python / dict / tuple)."""
        return self._action_writer(action)

    def read_obs(self, observations: Any) -> dict[str, Any]:
        """A dict key -> tensor of the backend's observation.

        A non-dict observation goes to ``"observation"``; a dict one keeps its keys (with
        ``"state"`` renamed ``"observation"``, as pixel wrappers name it).
        """
        readers = self._obs_readers
        if not isinstance(observations, Mapping):
            return {"observation": readers["observation"](observations)}
        out = {}
        for key, value in observations.items():
            if key == "state" and "state" not in readers:
                key = "observation"
            out[key] = readers[key](value)
        return out

    def read_reward(self, reward: Any) -> torch.Tensor:
        """The reward tensor (the reward spec's dtype, float32 by default; shape ``(*batch, 1)``)."""
        return torch.from_numpy(np.array(reward, dtype=self._reward_np).reshape(self._flag_shape))

    def read_done(
        self, terminated: Any, truncated: Any, done: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """``(terminated, truncated, done, do_break)`` as bool tensors of shape ``(*batch, 1)``.

        ``do_break`` tells a frame-skip loop to stop repeating the action.
        """
        shape = self._flag_shape
        term = np.asarray(terminated, dtype=np.bool_).reshape(shape)
        trunc = np.asarray(truncated, dtype=np.bool_).reshape(shape)
        d = term | trunc if done is None else np.asarray(done, dtype=np.bool_).reshape(shape)
        return torch.from_numpy(term), torch.from_numpy(trunc), torch.from_numpy(d), bool(d.any())

    def _output_transform(self, step_outputs: tuple[Any, ...]) -> tuple[Any, ...]:
        """Normalize the backend's step output to ``(obs, reward, terminated, truncated, done, info)``.

        Handles gymnasium's 5-tuple and legacy gym's 4-tuple (``TimeLimit.truncated`` info).
        """
        if len(step_outputs) == 5:
            obs, reward, terminated, truncated, info = step_outputs
            return obs, reward, terminated, truncated, None, info
        obs, reward, done, info = step_outputs
        truncated = (
            bool(info.get("TimeLimit.truncated", False)) if isinstance(info, dict) else False
        )
        terminated = np.logical_and(done, not truncated)
        return obs, reward, terminated, truncated, done, info

    def _reset_output_transform(self, reset_outputs: Any) -> tuple[Any, dict[str, Any]]:
        """Normalize the backend's reset output to ``(obs, info)``."""
        if (
            isinstance(reset_outputs, tuple)
            and len(reset_outputs) == 2
            and isinstance(reset_outputs[1], dict)
        ):
            return reset_outputs
        return reset_outputs, {}

    # ------------------------------------------------------------------ info readers
    @property
    def info_dict_reader(self) -> list[BaseInfoDictReader]:
        """The info readers in use (applied in order after each step and reset)."""
        return self._info_readers

    def set_info_dict_reader(
        self, info_dict_reader: BaseInfoDictReader | Callable[..., Any] | None = None
    ) -> GymLikeEnv:
        """Add an info reader (default: :class:`DefaultInfoDictReader` for numeric infos).

        A reader without a spec learns it from the infos of one reset and one random step of
        the backend (the env then needs a reset before use). Its spec joins the observation
        spec. Returns the env.
        """
        reader = info_dict_reader if info_dict_reader is not None else DefaultInfoDictReader()
        spec = getattr(reader, "info_spec", None)
        if spec is None and isinstance(reader, BaseInfoDictReader):
            reader.infer_spec(self._sample_infos(), self.batch_size)
            spec = reader.info_spec
        if spec is not None and len(spec.keys()):
            obs = self.full_observation_spec.clone()
            obs.unlock_()
            for key, sub in spec.items():
                if key in obs.keys():
                    raise SpecError(f"info key {key!r} clashes with an observation key")
                obs[key] = sub.to(self._device) if self._device is not None else sub
            self.full_observation_spec = obs
        self._info_readers.append(reader)  # type: ignore[arg-type]
        return self

    def auto_register_info_dict(self) -> GymLikeEnv:
        """Register the default reader for every numeric info entry (TorchRL's name)."""
        return self.set_info_dict_reader(DefaultInfoDictReader())

    def _sample_infos(self) -> list[Mapping[str, Any]]:
        _, info0 = self._reset_output_transform(self._env.reset())
        action = self.read_action(self.full_action_spec["action"].rand())
        info1 = self._output_transform(self._env.step(action))[5]
        self._needs_reset_after_probe = True
        return [info0, info1]

    def _read_infos(self, info: Mapping[str, Any], td: TensorDictBase) -> None:
        for reader in self._info_readers:
            reader(info, td)

    # ------------------------------------------------------------------ step and reset
    def _make_td(self, fields: dict[str, Any]) -> TensorDictBase:
        return TensorDict(fields, batch_size=self.batch_size, device=self._device)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = self.read_action(tensordict.get("action"))
        env = self._env
        reward = 0.0
        for _ in range(self.frame_skip):
            obs, r, terminated, truncated, done, info = self._output_transform(env.step(action))
            reward = reward + r
            if done is None:
                done = np.logical_or(terminated, truncated)
            if np.any(done):
                break
        out = self.read_obs(obs)
        out["reward"] = self.read_reward(reward)
        term, trunc, d, _ = self.read_done(terminated, truncated, done)
        out["terminated"], out["truncated"], out["done"] = term, trunc, d
        td = self._make_td(out)
        if self._info_readers:
            self._read_infos(info, td)
        return td

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        obs, info = self._reset_output_transform(self._env.reset(**kwargs))
        out = self.read_obs(obs)
        td = self._make_td(out)
        if self._info_readers:
            self._read_infos(info, td)
        return td
