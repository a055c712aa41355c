"""DeepMind Control (``dm_control``, any ``dm_env.Environment``) as aenv envs."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.exceptions import BackendUnavailableError
from aenv.libs._flags import done_flags, require
from aenv.specs import Bounded, Categorical, Composite, TensorSpec, Unbounded
from aenv.specs._numpy import from_numpy_fn, to_numpy_fn

__all__ = ["DMControlEnv", "DMControlWrapper", "from_dm_env_spec"]


def _dm_env() -> Any:
    return require("dm_env", "DMControlWrapper needs dm_control: pip install 'aenv[dmcontrol]'")


def _suite() -> Any:
    # MuJoCo picks its GL backend when dm_control is imported. Its default (GLFW) needs a
    # display; without one, EGL renders headless. A choice the user made is kept.
    if sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        from dm_control import suite
    except ImportError:
        raise BackendUnavailableError(
            "DMControlEnv needs dm_control: pip install 'aenv[dmcontrol]'"
        ) from None
    return suite


def from_dm_env_spec(spec: Any, *, scalars_as_vectors: bool = False) -> TensorSpec:
    """The aenv spec of a ``dm_env`` spec (or a dict / nested dicts of them).

    ``DiscreteArray`` becomes :class:`~aenv.specs.Categorical`, ``BoundedArray``
    :class:`~aenv.specs.Bounded` (``Unbounded`` where a bound is infinite), ``Array``
    :class:`~aenv.specs.Unbounded`, a dict a :class:`~aenv.specs.Composite` of its
    entries; dtypes are kept. ``scalars_as_vectors`` turns shape ``()`` into ``(1,)`` (how
    observations and rewards are stored, so they stack and concatenate).

    Example:
        >>> from dm_env import specs
        >>> from_dm_env_spec(specs.BoundedArray((2,), np.float32, -1.0, 1.0)).high
        tensor([1., 1.])
    """
    dm_specs = _dm_env().specs
    if isinstance(spec, Mapping):
        return Composite(
            {k: from_dm_env_spec(v, scalars_as_vectors=scalars_as_vectors) for k, v in spec.items()}
        )
    if isinstance(spec, dm_specs.StringArray) or not isinstance(spec, dm_specs.Array):
        raise TypeError(f"no aenv spec for the dm_env spec {spec!r}")
    shape: tuple[int, ...] = tuple(spec.shape)
    if scalars_as_vectors and not shape:
        shape = (1,)
    dtype = torch.from_numpy(np.zeros(0, spec.dtype)).dtype
    if isinstance(spec, dm_specs.DiscreteArray):
        return Categorical(spec.num_values, shape=shape, dtype=dtype)
    if isinstance(spec, dm_specs.BoundedArray):
        low = np.array(np.broadcast_to(spec.minimum, spec.shape)).reshape(shape)
        high = np.array(np.broadcast_to(spec.maximum, spec.shape)).reshape(shape)
        if np.isfinite(low).all() and np.isfinite(high).all():
            return Bounded(torch.as_tensor(low), torch.as_tensor(high), shape, dtype=dtype)
    return Unbounded(shape, dtype=dtype)


def _copied(value: Any) -> Any:
    """``value`` with every array copied: dm_control may hand out views of its physics
    state, which the next step would overwrite under the tensors made from them."""
    if isinstance(value, Mapping):
        return {k: _copied(v) for k, v in value.items()}
    return np.array(value)


class DMControlWrapper(EnvBase):
    """A DeepMind Control env (any ``dm_env.Environment``, e.g. ``suite.load(...)``) as an
    aenv env.

    Observations: each entry of the env's observation dict is a root key (``"position"``,
    ``"velocity"``...; nested dicts become nested keys), with dm_env's dtype (float64 for
    dm_control) and scalars stored as shape ``(1,)``. ``"reward"`` has the reward spec's
    dtype, shape ``(1,)``. The action spec is the env's (``Bounded`` for dm_control).

    Episode ends: dm_env ends an episode with a ``LAST`` time step; its discount says why.
    Discount 0 is a termination (``"terminated"``); any other discount (dm_control's time
    limit gives 1) is a truncation (``"truncated"``): the value of the next state still
    counts.

    Seeding: ``await env.set_seed(s)`` gives the task a new ``RandomState(s)`` (what
    ``suite.load(..., task_kwargs={"random": s})`` does), so the next reset draws from it;
    ``await env.reset(seed=s)`` seeds, then resets.

    Rendering: with ``from_pixels=True``, ``"pixels"`` holds ``physics.render(**render_kwargs)``
    (uint8 ``(height, width, 3)``; default 240 x 320, camera 0); ``pixels_only=True`` drops
    the state observations. Without a display, ``MUJOCO_GL=egl`` is set before dm_control
    is first imported (by :class:`DMControlEnv`); set ``MUJOCO_GL`` yourself to pick another.

    Args:
        env: the dm_env environment (closed with this wrapper).
        from_pixels: add ``"pixels"``.
        pixels_only: only ``"pixels"`` (needs ``from_pixels``).
        render_kwargs: arguments of ``physics.render`` (``height``, ``width``, ``camera_id``).
        frame_skip: env steps per aenv step, the action repeated and rewards summed (an
            episode end stops it early).
        device: device of the output tensors.

    Example:
        >>> from dm_control import suite
        >>> env = DMControlWrapper(suite.load("cartpole", "swingup", task_kwargs={"random": 0}))
        >>> td = await env.rollout(3)
        >>> td["next", "position"].shape, td["action"].dtype
        (torch.Size([3, 3]), torch.float64)
    """

    def __init__(
        self,
        env: Any,
        *,
        from_pixels: bool = False,
        pixels_only: bool = False,
        render_kwargs: Mapping[str, Any] | None = None,
        frame_skip: int = 1,
        device: torch.device | str | None = None,
    ) -> None:
        dm_env = _dm_env()
        if not isinstance(env, dm_env.Environment):
            raise TypeError(
                f"DMControlWrapper wraps a dm_env.Environment, got {type(env).__name__}"
            )
        if pixels_only and not from_pixels:
            raise ValueError("pixels_only=True needs from_pixels=True")
        if frame_skip < 1:
            raise ValueError(f"frame_skip must be >= 1, got {frame_skip}")
        super().__init__(device=device)
        self._env = env
        self.from_pixels, self.pixels_only, self.frame_skip = from_pixels, pixels_only, frame_skip
        self.render_kwargs = {"height": 240, "width": 320, "camera_id": 0}
        self.render_kwargs.update(render_kwargs or {})
        self._build_specs()

    def _build_specs(self) -> None:
        env = self._env
        reward = from_dm_env_spec(env.reward_spec(), scalars_as_vectors=True)
        if not isinstance(reward, (Bounded, Unbounded)) or reward.shape != (1,):
            raise TypeError(
                f"DMControlWrapper needs a scalar reward spec, got {env.reward_spec()!r}"
            )
        obs_spec = env.observation_spec()
        if not isinstance(obs_spec, Mapping):  # a single array: one "observation" key
            obs_spec = {"observation": obs_spec}
            self._obs_in_dict = False
        else:
            self._obs_in_dict = True
        obs = from_dm_env_spec(obs_spec, scalars_as_vectors=True)
        assert isinstance(obs, Composite)
        self._read_obs = from_numpy_fn(obs)
        leaves = {} if self.pixels_only else dict(obs.items())
        if self.from_pixels:
            frame = self._render()
            leaves["pixels"] = Bounded(0, 255, frame.shape, dtype=torch.uint8)
        self.full_observation_spec = Composite(leaves)
        action = from_dm_env_spec(env.action_spec())
        self.full_action_spec = Composite(action=action)
        self._write_action = to_numpy_fn(action)
        self.full_reward_spec = Composite(reward=Unbounded((1,), dtype=reward.dtype))
        self.full_done_spec = Composite(done_flags((1,)))
        self._reward_dtype = reward.dtype

    @property
    def physics(self) -> Any:
        """The wrapped env's MuJoCo physics (dm_control envs only)."""
        return self._env.physics

    def _render(self) -> torch.Tensor:
        physics = getattr(self._env, "physics", None)
        if physics is None:
            raise ValueError(
                f"from_pixels=True needs a dm_control env (one with .physics), got "
                f"{type(self._env).__name__}"
            )
        return torch.from_numpy(np.array(physics.render(**self.render_kwargs)))

    def _read(self, timestep: Any, reward: float | None) -> TensorDictBase:
        out = TensorDict({}, batch_size=(), device=None)
        if not self.pixels_only:
            obs = (
                timestep.observation if self._obs_in_dict else {"observation": timestep.observation}
            )
            out.update(self._read_obs(_copied(obs)))
        if self.from_pixels:
            out["pixels"] = self._render()
        last = bool(timestep.last())
        terminated = last and float(timestep.discount) == 0.0
        out["terminated"] = torch.tensor([terminated])
        out["truncated"] = torch.tensor([last and not terminated])
        out["done"] = torch.tensor([last])
        if reward is not None:
            out["reward"] = torch.tensor([reward], dtype=self._reward_dtype)
        return out.to(self.device) if self.device is not None else out

    # ------------------------------------------------------------------ env API
    def _set_seed(self, seed: int | None) -> None:
        task = getattr(self._env, "task", None)
        if task is None or not hasattr(task, "_random"):
            raise TypeError(
                f"{type(self._env).__name__} has no dm_control task to seed; seed it when "
                "building it"
            )
        # the task draws every reset's initial state from this generator (dm_control's
        # base.Task keeps it in `_random`; `task_kwargs={"random": s}` sets the same)
        task._random = np.random.RandomState(seed)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        if "seed" in kwargs:
            self._set_seed(kwargs.pop("seed"))
        if kwargs:
            raise TypeError(f"DMControlWrapper.reset got unexpected arguments {sorted(kwargs)}")
        return self._read(self._env.reset(), None)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = self._write_action(tensordict.get("action"))
        total = 0.0
        for _ in range(self.frame_skip):
            timestep = self._env.step(action)
            total += float(timestep.reward or 0.0)
            if timestep.last():
                break
        return self._read(timestep, total)

    async def _aclose(self) -> None:
        self._env.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self._env).__name__}, from_pixels={self.from_pixels})"


class DMControlEnv(DMControlWrapper):
    """A dm_control suite env built by name: ``DMControlEnv("cartpole", "swingup")``.

    Args:
        env_name: the suite domain (``"cartpole"``, ``"walker"``...).
        task_name: the domain's task (``"swingup"``, ``"walk"``...).
        seed: seed of the task's generator (``task_kwargs={"random": seed}``).
        time_limit: episode length in seconds (the suite's default otherwise); its last
            step is a truncation.
        task_kwargs: other arguments of the task.
        environment_kwargs: arguments of ``control.Environment`` (``flat_observation``...).
        **kwargs: see :class:`DMControlWrapper`.

    Example:
        >>> env = DMControlEnv("cartpole", "balance", seed=0, time_limit=0.1)
        >>> td = await env.rollout(100)
        >>> td.batch_size, td["next", "truncated"][-1].item()
        (torch.Size([10]), True)
    """

    def __init__(
        self,
        env_name: str,
        task_name: str,
        *,
        seed: int | None = None,
        time_limit: float | None = None,
        task_kwargs: Mapping[str, Any] | None = None,
        environment_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        suite = _suite()
        if (env_name, task_name) not in suite.ALL_TASKS:
            tasks = sorted(t for d, t in suite.ALL_TASKS if d == env_name)
            domains = sorted({d for d, _ in suite.ALL_TASKS})
            known = f"its tasks: {tasks}" if tasks else f"domains: {domains}"
            raise ValueError(f"unknown dm_control task ({env_name!r}, {task_name!r}); {known}")
        kw = dict(task_kwargs or {})
        if seed is not None:
            kw["random"] = seed
        if time_limit is not None:
            kw["time_limit"] = time_limit
        self.env_name, self.task_name = env_name, task_name
        env = suite.load(
            env_name, task_name, task_kwargs=kw, environment_kwargs=dict(environment_kwargs or {})
        )
        super().__init__(env, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env_name!r}, {self.task_name!r})"
