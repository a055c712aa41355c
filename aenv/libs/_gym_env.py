"""GymWrapper / GymEnv: gymnasium envs (single or vector) as aenv envs."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium.spaces import Dict as DictSpace
from tensordict import TensorDict, TensorDictBase

from aenv.envs._gymlike import GymLikeEnv
from aenv.exceptions import BatchSizeError
from aenv.libs._gym_backend import gym_backend, to_gymnasium_space
from aenv.libs._gym_vector import VectorAutoreset, normalize_autoreset_mode
from aenv.specs import (
    Bounded,
    Composite,
    MultiOneHot,
    NonTensor,
    OneHot,
    TensorSpec,
    Unbounded,
    from_gym_space,
)
from aenv.specs._numpy import from_numpy_fn, np_dtype, to_numpy_fn

__all__ = ["GymEnv", "GymWrapper"]

_WRAPPER_KWARGS = frozenset(
    {
        "categorical_action_encoding",
        "from_pixels",
        "pixels_only",
        "frame_skip",
        "device",
        "batch_size",
        "auto_reset",
        "auto_reset_replace",
        "blocking",
        "allow_done_after_reset",
        "run_type_checks",
        "spec_locked",
        "reward_dtype",
    }
)


def _is_vector(env: Any) -> bool:
    return hasattr(env, "num_envs") and hasattr(env, "single_observation_space")


# the leaves of the rows the plain path writes: a step's "next" content, a reset's outputs
_ACTION_BLOCK = 256  # actions of a rollout's rows converted at a time
_STEP_ROW = ("observation", "reward", "terminated", "truncated", "done")
_NDARRAY = np.ndarray  # (a module global: read per step)
_RESET_ROW = ("observation", "terminated", "truncated", "done")


def _plain_array_spec(spec: TensorSpec) -> bool:
    """Whether the spec's values are the backend's arrays as they are (no index shift, no
    one-hot encoding, no nesting): then an array of the right dtype and shape is used as is."""
    if isinstance(spec, (Composite, OneHot, MultiOneHot, NonTensor)):
        return False
    start = spec._meta.get("gym_start", 0)
    return not (isinstance(start, list) or start)


def _placeholder(spec: TensorSpec) -> Any:
    """What replaces a lost last observation: NaN for floats, zeros otherwise."""
    zero = spec.zero()
    if isinstance(zero, torch.Tensor) and zero.dtype.is_floating_point:
        return torch.full_like(zero, float("nan"))
    return zero


class GymWrapper(GymLikeEnv):
    """A gymnasium env instance (``gymnasium.Env`` or a ``gymnasium.vector.VectorEnv``) as an
    aenv env.

    Specs come from the spaces (:func:`aenv.specs.from_gym_space`): a non-dict observation is
    ``"observation"``, a Dict observation keeps its keys; the action is ``"action"``;
    ``terminated`` / ``truncated`` map to the done keys (``done`` is their union). Seeding:
    ``await env.reset(seed=s)`` or ``await env.set_seed(s)`` (used by the next reset).

    A vector env becomes one env of batch size ``(num_envs,)``; its autoreset mode is mapped
    onto aenv's done/reset semantics (see :mod:`aenv.libs._gym_vector`).

    A single CPU env with one observation and no pixels, frame skip, auto reset or info
    readers steps on a plain path that writes gymnasium's outputs straight into the rows of
    a pool or of a rollout (:meth:`_step_into`, :meth:`_reset_into`).

    Args:
        env: the gymnasium env.
        categorical_action_encoding: Discrete spaces as ``Categorical`` (indices) instead of
            ``OneHot`` (observations and actions alike).
        from_pixels: add ``"pixels"`` from ``env.render()`` (needs ``render_mode="rgb_array"``).
        pixels_only: with ``from_pixels``, keep only ``"pixels"``.
        frame_skip: repeat each action this many times (rewards summed; stops at done).
        device: device of the output tensors.
        batch_size: checked against the env's (``(num_envs,)`` for vector envs, else ``()``).
        auto_reset: the env resets itself on the step that ends an episode (returning the
            next episode's first observation): the step's observation becomes
            ``info["final_obs"]`` (or a NaN / zero placeholder with ``auto_reset_replace``)
            and the first observation is returned by the next reset.
        auto_reset_replace: see ``auto_reset``.
        blocking: run gymnasium's (synchronous) calls in a worker thread instead of inline.
        allow_done_after_reset, run_type_checks, spec_locked: see :class:`~aenv.EnvBase`.
        reward_dtype: the reward spec's dtype (float32, as TorchRL's, by default;
            ``torch.float64`` keeps gymnasium's python-float rewards exact, as a gymnasium
            vector env's float64 rewards hold them).

    Example:
        >>> import gymnasium
        >>> env = GymWrapper(gymnasium.make("CartPole-v1"))
        >>> td = await env.reset(seed=0)
        >>> td = await env.rand_step(td)
        >>> td["next", "observation"].shape
        torch.Size([4])
    """

    # read_done always gives terminated, truncated and their union: nothing to complete
    _done_outputs_complete = True

    def __init__(
        self,
        env: Any = None,
        *,
        categorical_action_encoding: bool = False,
        from_pixels: bool = False,
        pixels_only: bool = False,
        frame_skip: int = 1,
        device: torch.device | str | int | None = None,
        batch_size: torch.Size | tuple[int, ...] | None = None,
        auto_reset: bool = False,
        auto_reset_replace: bool = True,
        blocking: bool = False,
        allow_done_after_reset: bool = False,
        run_type_checks: bool = False,
        spec_locked: bool = True,
        reward_dtype: torch.dtype = torch.float32,
    ) -> None:
        if env is None:
            raise TypeError("GymWrapper needs an env instance (use GymEnv to build one by id)")
        vector = _is_vector(env)
        env_bs = torch.Size([env.num_envs] if vector else [])
        if batch_size is not None and torch.Size(batch_size) != env_bs:
            raise BatchSizeError(
                f"batch_size {tuple(batch_size)} does not match the gymnasium env's {tuple(env_bs)}"
            )
        if frame_skip < 1:
            raise ValueError(f"frame_skip must be >= 1, got {frame_skip}")
        if vector and (frame_skip != 1 or auto_reset):
            raise ValueError("frame_skip and auto_reset are not supported for vector envs")
        if pixels_only and not from_pixels:
            raise ValueError("pixels_only=True needs from_pixels=True")
        super().__init__(
            device=device,
            batch_size=env_bs,
            run_type_checks=run_type_checks,
            allow_done_after_reset=allow_done_after_reset,
            spec_locked=spec_locked,
        )
        self._env = env
        self.blocking = blocking  # type: ignore[misc]
        self.frame_skip = frame_skip
        self.from_pixels = from_pixels
        self.pixels_only = pixels_only
        self.auto_reset = auto_reset
        self.auto_reset_replace = auto_reset_replace
        self.categorical_action_encoding = categorical_action_encoding
        self.reward_dtype = reward_dtype
        self._vector = VectorAutoreset(env, env.num_envs) if vector else None
        self._pending_seed: int | None = None
        self._stash: tuple[Any, Any] | None = None  # auto_reset: the next episode's start
        # rows written by _step_into / _reset_into: id -> (row, numpy views of its leaves)
        self._views: dict[int, tuple[TensorDictBase, tuple[np.ndarray, ...]]] = {}
        #: the two rows stepped into last and their views, the latest first (a process
        #: worker's two banks of slots take turns)
        self._last_views: list[Any] = [None, None, None, None]
        # a rollout's actions converted a block of rows at a time: (buffer, its version,
        # first row, end row, values)
        self._row_actions: tuple[torch.Tensor, int, int, int, list[Any]] | None = None
        self._build_specs()

    # ------------------------------------------------------------------ specs
    def _spaces(self) -> tuple[Any, Any, Any]:
        env = self._env
        if self._vector is not None:
            obs_space, act_space = env.single_observation_space, env.single_action_space
        else:
            obs_space, act_space = env.observation_space, env.action_space
        return to_gymnasium_space(obs_space), to_gymnasium_space(act_space), env.action_space

    def _build_specs(self) -> None:
        bs, dev = self.batch_size, self._device
        cat = self.categorical_action_encoding
        obs_space, act_space, batched_act_space = self._spaces()
        obs: dict[str, TensorSpec] = {}
        if not self.pixels_only:
            spec = from_gym_space(
                obs_space, device=dev, categorical_action_encoding=cat, batch_size=bs
            )
            if isinstance(spec, Composite) and not spec._meta.get("gym_tuple"):
                obs.update({("observation" if k == "state" else k): v for k, v in spec.items()})
            else:
                obs["observation"] = spec
        # a value that is a dict without a Dict space (a Sequence of Dicts) is one observation
        self._whole_obs = "observation" in obs and not isinstance(obs_space, DictSpace)
        if self.from_pixels:
            frame = self._probe_render()
            obs["pixels"] = Bounded(0, 255, frame.shape, dev, torch.uint8)
        action = from_gym_space(
            act_space, device=dev, categorical_action_encoding=cat, batch_size=bs
        )
        if isinstance(action, Composite):
            # a Dict / Tuple action space: its entries live under "action"
            action = Composite(action=action, shape=bs, device=dev)
        self._init_gym_specs(
            Composite(obs, shape=bs, device=dev),
            action,
            action_space=batched_act_space if self._vector is not None else act_space,
            reward_spec=Unbounded((*bs, 1), dev, self.reward_dtype),
        )
        # rows of actions converted as a block: the converter of the spec with a leading dim
        self._rows_writer = (
            None
            if isinstance(action, (Composite, NonTensor))
            else to_numpy_fn(action.expand(2, *action.shape), act_space)
        )
        if self.from_pixels:
            self._pixels_reader = from_numpy_fn(self.full_observation_spec["pixels"], dev)
        # the plain path for the common case: one env on the CPU, one observation key,
        # nothing extra (taken while no extension point is replaced: _plain_now)
        dev_ok = dev is None or dev.type == "cpu"
        self._fast = (
            self._plain_ok
            and self._vector is None
            and self.frame_skip == 1
            and not self.from_pixels
            and not self.auto_reset
            and dev_ok
            and list(obs) == ["observation"]
        )
        if self._fast:
            ospec = self.full_observation_spec["observation"]
            self._fast_obs = (
                self._obs_readers["observation"],
                np_dtype(ospec.dtype) if _plain_array_spec(ospec) else None,
                tuple(ospec.shape),
            )
            self._fast_obs_dtype = ospec.dtype

    def _render(self) -> np.ndarray:
        frames = self._env.render()
        if self._vector is not None:
            return np.stack(frames)
        return np.asarray(frames)

    def _probe_render(self) -> np.ndarray:
        if getattr(self._env, "render_mode", None) not in (None, "rgb_array"):
            raise ValueError(
                f"from_pixels needs render_mode='rgb_array', got {self._env.render_mode!r}"
            )
        self._env.reset()
        frame = self._render()
        if frame is None or frame.dtype != np.uint8 or frame.ndim < 3:
            raise ValueError(
                "from_pixels needs an env made with render_mode='rgb_array' whose render() "
                f"returns uint8 frames; render() gave {type(frame).__name__}"
            )
        return frame

    def read_obs(self, observations: Any) -> dict[str, Any]:
        if self.pixels_only:
            out: dict[str, Any] = {}
        elif self._whole_obs:
            out = {"observation": self._obs_readers["observation"](observations)}
        else:
            out = super().read_obs(observations)
        if self.from_pixels:
            out["pixels"] = self._pixels_reader(self._render())
        return out

    # ------------------------------------------------------------------ env methods
    def _set_seed(self, seed: int | None) -> None:
        self._pending_seed = seed
        if seed is not None:
            self._env.action_space.seed(seed)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self._plain_now():
            out = self._plain_step(tensordict, None)
            assert not isinstance(out, bool)
            return out
        if self._vector is not None:
            return self._vector_step(tensordict)
        td = super()._step(tensordict)
        if self.auto_reset and bool(td.get("done").any()):
            self._auto_reset_stash(td)
        return td

    def _plain_now(self) -> bool:
        """Whether the plain path may run: the common case (``_fast``: a subclass replacing
        an extension point of a gym-like env has it False, see
        :class:`~aenv.envs.GymLikeEnv`), no info reader, and no extension point replaced on
        this instance."""
        return self._fast and not self._info_readers and self._no_instance_extensions()

    def _writes_rows_now(self) -> bool:
        """Whether the row hooks may write rows inline now: the plain path, in this thread
        (not ``blocking``), with no output checks (``run_type_checks`` checks a TensorDict)
        and no info reader. All but the readers (a list, edited in place) are decided once
        and kept until one of them is assigned on the instance (``_rows_ok``, see
        :class:`~aenv.envs.GymLikeEnv`)."""
        ok = self._rows_ok
        if ok is None:
            ok = self.__dict__["_rows_ok"] = bool(
                self._fast
                and not (self.blocking or self.run_type_checks)
                and self._no_instance_extensions()
            )
        return ok and not self._info_readers

    def _forget_decisions(self) -> None:
        super()._forget_decisions()
        last = self.__dict__.get("_last_views")  # (None while __init__ runs)
        if last is not None:
            last[:] = None, None, None, None

    def _plain_step(
        self,
        tensordict: TensorDictBase,
        views: tuple[np.ndarray, ...] | None,
        index: int = 0,
    ) -> bool | TensorDictBase:
        """The plain path's gymnasium step: into row ``index`` of ``views`` (numpy views of
        rows of observations, and one-element rewards, terminated, truncated and done flags
        seen as 1-d), returning the done flag, or, without views or for an observation off
        its spec, as a TensorDict of fresh tensors built with the specs' dtypes and shapes
        (assembled without validation). ``tensordict`` is the input, or a buffer of inputs
        (a leading dim) whose row ``index`` is."""
        if type(tensordict) is TensorDict:
            src, rows = tensordict._tensordict, tensordict._batch_size
        else:
            src, rows = tensordict, tensordict.batch_size
        leaf = src["action"]
        if rows:
            hit = self._row_actions
            if (
                hit is not None
                and hit[0] is leaf
                and hit[1] == leaf._version
                and hit[2] <= index < hit[3]
            ):
                action = hit[4][index - hit[2]]  # (the common case of _row_action, inline)
            else:
                action = self._row_action(leaf, index)
        else:
            action = self._action_writer(leaf)
        obs, reward, terminated, truncated, _ = self._env.step(action)
        if views is None:
            return self._fast_outputs(self._fast_read_obs(obs), reward, terminated, truncated)
        obs_np, rew_np, term_np, trunc_np, done_np = views
        _, np_dt, shape = self._fast_obs
        # (the common case of _obs_into, inline: an array exactly as the spec says; an
        # equal dtype that is not numpy's canonical one takes _obs_into)
        if type(obs) is _NDARRAY and obs.dtype is np_dt and obs.shape == shape:
            obs_np[index] = obs
        else:
            value = self._obs_into(obs, obs_np, index)
            if value is not None:
                # not what the spec says: the caller handles it as _step's output
                return self._fast_outputs(value, reward, terminated, truncated)
        done = True if terminated or truncated else False
        rew_np[index] = reward
        term_np[index] = terminated
        trunc_np[index] = truncated
        done_np[index] = done
        return done

    def _row_action(self, leaf: torch.Tensor, index: int) -> Any:
        """The backend value of row ``index`` of a buffer of actions. Rows are converted a
        block at a time (one conversion of a ``(k, ...)`` tensor, as a vector env's actions
        are), kept while the buffer is not written to (its version stays)."""
        hit = self._row_actions
        if (
            hit is None
            or hit[0] is not leaf
            or hit[1] != leaf._version
            or not hit[2] <= index < hit[3]
        ):
            if self._rows_writer is None:
                return self._action_writer(leaf[index])
            block = leaf[index : index + _ACTION_BLOCK]
            values = list(self._rows_writer(block))
            hit = self._row_actions = (leaf, leaf._version, index, index + len(values), values)
        return hit[4][index - hit[2]]

    def _obs_into(self, obs: Any, rows: np.ndarray, index: int) -> torch.Tensor | None:
        """Copy the backend's observation into row ``index`` of the observation rows;
        returns None, or the observation read as a tensor when it is off its spec (then
        nothing is written)."""
        read, np_dt, shape = self._fast_obs
        if (
            np_dt is not None
            and type(obs) is _NDARRAY
            and obs.dtype == np_dt
            and obs.shape == shape
        ):
            rows[index] = obs
            return None
        value = read(obs)
        if value.dtype != self._fast_obs_dtype or value.shape != rows.shape[1:]:
            return value
        rows[index] = value.numpy()
        return None

    async def _step_into(
        self, tensordict: TensorDictBase, out: TensorDictBase | None, index: int | None = None
    ) -> bool | TensorDictBase:
        """The plain path writes gymnasium's outputs straight into the row's numpy views
        (no tensor or TensorDict made per step); anything else takes the default."""
        # (the rows stepped into last, a rollout's every step, a worker's two banks: kept
        # while _writes_rows_now's decision stands, see _forget_decisions; attribute reads
        # are dear on this class, whose __getattr__ turns off the interpreter's fast ones)
        last = self._last_views
        if out is not None and not self._info_readers:
            if last[0] is out:
                return self._plain_step(tensordict, last[1], index or 0)
            if last[2] is out:
                return self._plain_step(tensordict, last[3], index or 0)
        if out is not None and self._writes_rows_now():
            views = self._row_views(out, _STEP_ROW, index is not None)
            if views is not None:
                last[:] = out, views, last[0], last[1]
                return self._plain_step(tensordict, views, index or 0)
        return await super()._step_into(tensordict, out, index)

    async def _reset_into(
        self, stepped: TensorDictBase, out: TensorDictBase | None, index: int | None = None
    ) -> bool | TensorDictBase:
        """After a step that ended the episode, on the plain path: gymnasium's reset (with
        the pending seed, used once) straight into the row's numpy views, done flags
        cleared; anything else takes the default."""
        views = None
        if out is not None and not self._closed and self._writes_rows_now():
            views = self._row_views(out, _RESET_ROW, index is not None)
        if views is None:
            return await super()._reset_into(stepped, out, index)
        i = index or 0
        obs_np, term_np, trunc_np, done_np = views
        seed = self._pending_seed
        if seed is not None or self._stash is not None:
            self._pending_seed = self._stash = None
        obs, _ = self._reset_output_transform(
            self._env.reset() if seed is None else self._env.reset(seed=seed)
        )
        value = self._obs_into(obs, obs_np, i)
        if value is not None:
            # not what the spec says: the reset's TensorDict, as reset() gives it
            td = TensorDict._new_unsafe(
                {"observation": value},
                self.batch_size,
                self._device,  # type: ignore[arg-type]
                nested=False,
            )
            return self._reset_proc_data(None, td, None)
        term_np[i] = trunc_np[i] = done_np[i] = False
        return True

    def _row_views(
        self, out: TensorDictBase, keys: tuple[str, ...], rows: bool = False
    ) -> tuple[np.ndarray, ...] | None:
        """Numpy views of ``out``'s leaves ``keys`` with a leading row dim, when ``out`` holds
        exactly them, each a CPU tensor with its spec's dtype and shape (the reward and
        flags one element) after that leading dim (``rows``: a rollout's buffer) or as it
        is (a row of its own, seen as one row); None otherwise. Kept per ``out`` (a worker's
        slots live as long as the env)."""
        hit = self._views.get(id(out))
        if hit is not None and hit[0] is out:
            return hit[1]
        if type(out) is not TensorDict or sorted(out.keys()) != sorted(keys):
            return None
        specs = self.full_observation_spec, self.full_reward_spec, self.full_done_spec
        lead = out.batch_size[:1] if rows else torch.Size()
        if rows and out.batch_dims != 1:
            return None
        for key in keys:
            spec = next(group[key] for group in specs if key in group.keys())
            leaf = out.get(key)
            if (
                type(leaf) is not torch.Tensor
                or leaf.dtype != spec.dtype
                or leaf.shape != lead + spec.shape
                or leaf.device.type != "cpu"
                or (key != "observation" and spec.shape != (1,))
            ):
                return None
        # (observations with a leading row dim; the one-element leaves seen as 1-d)
        views = tuple(
            (out.get(key).numpy() if rows else out.get(key).numpy()[None])
            if key == "observation"
            else out.get(key).numpy().reshape(-1)
            for key in keys
        )
        if len(self._views) > 8:
            self._views.clear()
        self._views[id(out)] = (out, views)
        return views

    def _fast_outputs(
        self, obs: torch.Tensor, reward: Any, terminated: Any, truncated: Any
    ) -> TensorDictBase:
        """The step's TensorDict from the backend's outputs (the observation read)."""
        fields = {
            "observation": obs,
            "reward": torch.from_numpy(np.array((reward,), dtype=self._reward_np)),
            "terminated": torch.from_numpy(np.array((terminated,), dtype=np.bool_)),
            "truncated": torch.from_numpy(np.array((truncated,), dtype=np.bool_)),
            "done": torch.from_numpy(np.array((terminated or truncated,), dtype=np.bool_)),
        }
        return TensorDict._new_unsafe(fields, self.batch_size, self._device, nested=False)  # type: ignore[arg-type]

    def _fast_read_obs(self, obs: Any) -> torch.Tensor:
        """The observation tensor: the backend's array as it is when it already has the
        spec's dtype and shape (what the reader would give, without its checks)."""
        read, np_dt, shape = self._fast_obs
        if (
            np_dt is not None
            and type(obs) is np.ndarray
            and obs.dtype == np_dt
            and obs.shape == shape
            and obs.flags.writeable
        ):
            return torch.from_numpy(obs)
        return read(obs)

    def _auto_reset_stash(self, td: TensorDictBase) -> None:
        # the env already started its next episode: keep that start for the next reset and
        # put the episode's last observation (or a placeholder) in the step's output
        info = self._last_info
        self._stash = (self._last_obs, info)
        final = (
            info.get("final_obs", info.get("final_observation")) if isinstance(info, dict) else None
        )
        if final is not None:
            for key, value in self.read_obs(final).items():
                td.set(key, value)
        elif self.auto_reset_replace:
            for key in self.full_observation_spec.keys():
                if key in self._obs_readers:
                    td.set(key, _placeholder(self.full_observation_spec[key]))

    def _output_transform(self, step_outputs: tuple[Any, ...]) -> tuple[Any, ...]:
        out = super()._output_transform(step_outputs)
        if self.auto_reset:
            self._last_obs, self._last_info = out[0], out[5]
        return out

    def _vector_step(self, tensordict: TensorDictBase) -> TensorDictBase:
        vec = self._vector
        assert vec is not None
        vec.before_step(tensordict)
        action = self.read_action(tensordict.get("action"))
        obs, reward, terminated, truncated, info = self._env.step(action)
        obs = vec.after_step(obs, terminated, truncated, info)
        out = self.read_obs(obs)
        out["reward"] = self.read_reward(reward)
        term, trunc, done, _ = self.read_done(terminated, truncated)
        out["terminated"], out["truncated"], out["done"] = term, trunc, done
        td = self._make_td(out)
        if self._info_readers:
            self._read_infos(info, td)
        return td

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        seed = kwargs.pop("seed", None)
        if seed is None:
            seed = self._pending_seed
        self._pending_seed = None
        options = kwargs.pop("options", None)
        if kwargs:
            raise TypeError(f"unexpected reset arguments {sorted(kwargs)}")
        partial = tensordict is not None and tensordict.get("_reset", None) is not None
        if self._vector is not None:
            mask = None
            if partial:
                assert tensordict is not None
                m = tensordict.get("_reset").reshape(self.batch_size).cpu().numpy()
                mask = None if m.all() and seed is not None else m.astype(np.bool_)
            obs, info = self._vector.reset(mask, seed=seed, options=options)
        elif self.auto_reset and self._stash is not None and seed is None:
            obs, info = self._stash
            self._stash = None
        else:
            self._stash = None
            reset_kw: dict[str, Any] = {}
            if seed is not None:
                reset_kw["seed"] = seed
            if options is not None:
                reset_kw["options"] = options
            obs, info = self._reset_output_transform(self._env.reset(**reset_kw))
        if self._plain_now():
            fields = {"observation": self._fast_read_obs(obs)}
            td = TensorDict._new_unsafe(fields, self.batch_size, self._device, nested=False)  # type: ignore[arg-type]
        else:
            td = self._make_td(self.read_obs(obs))
        if self._info_readers:
            self._read_infos(info, td)
        return td

    async def _aclose(self) -> None:
        self._env.close()

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: public names are read from the gymnasium env
        # (through its wrappers, e.g. ``GymEnv("Pendulum-v1").g``). Private names, and any name
        # before ``_env`` is set (unpickling, copies), are not forwarded.
        env = self.__dict__.get("_env")
        if env is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        try:
            get = getattr(env, "get_wrapper_attr", None)
            return get(name) if get is not None else getattr(env, name)
        except AttributeError:
            raise AttributeError(
                f"{type(self).__name__!r} object and the gymnasium env it wraps have no "
                f"attribute {name!r}"
            ) from None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(env={self._env!r}, batch_size={tuple(self.batch_size)})"


class GymEnv(GymWrapper):
    """A gymnasium env built from its id: ``gymnasium.make(env_name, **kwargs)``, or
    ``gymnasium.make_vec`` when ``num_envs`` is given.

    Keyword arguments of :class:`GymWrapper` are the wrapper's; the others go to ``make``
    (``render_mode`` defaults to ``"rgb_array"`` with ``from_pixels``).

    Args:
        env_name: the registered id, e.g. ``"CartPole-v1"``.
        num_envs: build a vector env of that many sub-envs (batch size ``(num_envs,)``).
        vectorization_mode: ``"sync"`` or ``"async"`` (``make_vec``'s; with ``num_envs``).
        autoreset_mode: the vector env's autoreset mode (``"next_step"``, ``"same_step"``,
            ``"disabled"``; with ``num_envs``).
        **kwargs: :class:`GymWrapper` options and ``make`` arguments.

    Example:
        >>> env = GymEnv("Pendulum-v1", g=9.81)
        >>> rollout = await env.rollout(10)
        >>> rollout["next", "reward"].shape
        torch.Size([10, 1])
    """

    def __init__(
        self,
        env_name: str,
        *,
        num_envs: int | None = None,
        vectorization_mode: str = "sync",
        autoreset_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        wrapper_kwargs = {k: v for k, v in kwargs.items() if k in _WRAPPER_KWARGS}
        make_kwargs = {k: v for k, v in kwargs.items() if k not in _WRAPPER_KWARGS}
        if wrapper_kwargs.get("from_pixels"):
            make_kwargs.setdefault("render_mode", "rgb_array")
        gym = gym_backend()
        self.env_name = env_name
        if num_envs is not None:
            vector_kwargs = dict(make_kwargs.pop("vector_kwargs", {}) or {})
            if autoreset_mode is not None:
                name = normalize_autoreset_mode(autoreset_mode)
                vector_kwargs["autoreset_mode"] = {
                    "next_step": gym.vector.AutoresetMode.NEXT_STEP,
                    "same_step": gym.vector.AutoresetMode.SAME_STEP,
                    "disabled": gym.vector.AutoresetMode.DISABLED,
                }[name]
            env = gym.make_vec(
                env_name,
                num_envs=num_envs,
                vectorization_mode=vectorization_mode,
                vector_kwargs=vector_kwargs,
                **make_kwargs,
            )
        else:
            if autoreset_mode is not None:
                raise ValueError("autoreset_mode needs num_envs (a vector env)")
            env = gym.make(env_name, **make_kwargs)
        try:
            super().__init__(env, **wrapper_kwargs)
        except BaseException:
            env.close()
            raise

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(env_name={self.env_name!r}, "
            f"batch_size={tuple(self.batch_size)}, device={self.device})"
        )
