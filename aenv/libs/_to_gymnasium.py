"""aenv envs as gymnasium envs: ``to_gymnasium`` (single) and ``to_gymnasium_vector`` (batched).

Each gymnasium call is one hop through aenv's loop runner (:func:`aenv.sync.get_runner`), so
any aenv env (async, transformed, a pool) can be driven by gymnasium-style training loops.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space
from tensordict import TensorDictBase

from aenv.envs._common import EnvBase
from aenv.exceptions import BatchSizeError
from aenv.specs import Composite, TensorSpec, to_gym_space
from aenv.specs._numpy import from_numpy_fn, to_numpy_fn
from aenv.sync import Runner, get_runner

__all__ = ["AenvGymnasiumEnv", "AenvGymnasiumVectorEnv", "to_gymnasium", "to_gymnasium_vector"]


def _unbatch(spec: TensorSpec, ndim: int) -> TensorSpec:
    for _ in range(ndim):
        spec = spec[0]
    return spec


class _Codec:
    """Spaces and converters of an env's observations and actions (specs without batch dims
    give the spaces; converters work on the batched values)."""

    def __init__(self, env: EnvBase, batch_ndim: int) -> None:
        obs_spec = env.full_observation_spec
        obs_keys = list(obs_spec.keys())
        self.single_obs = obs_keys == ["observation"]
        if self.single_obs:
            leaf = obs_spec["observation"]
            self.obs_space = to_gym_space(_unbatch(leaf, batch_ndim))
            self.obs_to_np = to_numpy_fn(leaf, self.obs_space)
        else:
            unbatched = Composite({k: _unbatch(v, batch_ndim) for k, v in obs_spec.items()})
            self.obs_space = to_gym_space(unbatched)
            self.obs_to_np = to_numpy_fn(obs_spec, self.obs_space)
        self.obs_keys = obs_keys
        act_keys = env.action_keys
        if len(act_keys) != 1:
            raise ValueError(f"to_gymnasium needs exactly one action key, got {act_keys}")
        self.action_key = act_keys[0]
        act = env.full_action_spec[self.action_key]
        self.action_space = to_gym_space(_unbatch(act, batch_ndim))
        self.action_from_np = from_numpy_fn(act, env.device)
        self.pixels = "pixels" in obs_keys

    def obs(self, td: TensorDictBase) -> Any:
        # gymnasium wants fresh data on every call: tensors may be shared with the env
        if self.single_obs:
            return _fresh(self.obs_to_np(td.get("observation")))
        return _fresh(self.obs_to_np(td.select(*self.obs_keys)))


def _fresh(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: _fresh(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_fresh(v) for v in value)
    return value


def _flag(td: TensorDictBase, key: str) -> torch.Tensor | None:
    return td.get(key, None)


class AenvGymnasiumEnv(gymnasium.Env):
    """A single aenv env (batch size ``()``) as a ``gymnasium.Env``; see :func:`to_gymnasium`."""

    def __init__(self, env: EnvBase, *, runner: Runner | None = None) -> None:
        if tuple(env.batch_size) != ():
            raise BatchSizeError(
                f"to_gymnasium needs an env of batch size (), got {tuple(env.batch_size)}; "
                "use to_gymnasium_vector for batched envs"
            )
        self.env = env
        self._runner = runner
        self._codec = _Codec(env, 0)
        self.observation_space = self._codec.obs_space
        self.action_space = self._codec.action_space
        self.render_mode = "rgb_array" if self._codec.pixels else None
        self.metadata = {"render_modes": ["rgb_array"] if self._codec.pixels else []}
        self._td: TensorDictBase | None = None

    @property
    def runner(self) -> Runner:
        return self._runner if self._runner is not None else get_runner()

    async def _areset(self, seed: int | None) -> TensorDictBase:
        if seed is not None:
            await self.env.set_seed(seed)
        return await self.env.reset()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._td = self.runner.run(self._areset, seed)
        return self._codec.obs(self._td), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        td = self._td
        if td is None:
            raise gymnasium.error.ResetNeeded("call reset() before step()")
        td.set(self._codec.action_key, self._codec.action_from_np(action))
        td = self.runner.run(self.env.step, td)
        nxt = td.get("next")
        obs = self._codec.obs(nxt)
        reward = float(nxt.get("reward"))
        term = _flag(nxt, "terminated")
        trunc = _flag(nxt, "truncated")
        done = bool(nxt.get("done"))
        terminated = bool(term) if term is not None else done
        truncated = bool(trunc) if trunc is not None else False
        self._td = self.env._step_mdp(td)
        return obs, reward, terminated, truncated, {}

    def render(self) -> Any:
        if not self._codec.pixels or self._td is None:
            return None
        return self._td.get("pixels").cpu().numpy()

    def close(self) -> None:
        if not self.env.is_closed:
            self.runner.run(self.env.aclose)


class AenvGymnasiumVectorEnv(VectorEnv):
    """A batched aenv env (batch size ``(n,)``) as a gymnasium ``VectorEnv`` with next-step
    autoreset; see :func:`to_gymnasium_vector`."""

    def __init__(self, env: EnvBase, *, runner: Runner | None = None) -> None:
        if len(env.batch_size) != 1:
            raise BatchSizeError(
                f"to_gymnasium_vector needs an env with one batch dim, got {tuple(env.batch_size)}"
            )
        self.env = env
        self._runner = runner
        self.num_envs = int(env.batch_size[0])
        self._codec = _Codec(env, 1)
        self.single_observation_space = self._codec.obs_space
        self.single_action_space = self._codec.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
        self.render_mode = None
        self._td: TensorDictBase | None = None
        self._autoreset = torch.zeros(self.num_envs, dtype=torch.bool)

    @property
    def runner(self) -> Runner:
        return self._runner if self._runner is not None else get_runner()

    async def _areset(self, seed: int | None) -> TensorDictBase:
        if seed is not None:
            await self.env.set_seed(seed)
        return await self.env.reset()

    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if isinstance(seed, list):
            seed = seed[0]
        super().reset(seed=seed)
        self._td = self.runner.run(self._areset, seed)
        self._autoreset = torch.zeros(self.num_envs, dtype=torch.bool)
        return self._codec.obs(self._td), {}

    async def _astep(self, td: TensorDictBase, autoreset: torch.Tensor) -> tuple[Any, ...]:
        env = self.env
        any_reset = bool(autoreset.any())
        if any_reset:
            td.set("_step", ~autoreset)
        td = await env.step(td)
        td.pop("_step", None)
        nxt = td.get("next")
        reward = nxt.get("reward").reshape(self.num_envs).clone()
        done = nxt.get("done").reshape(self.num_envs).clone()
        term = nxt.get("terminated", None)
        term = done.clone() if term is None else term.reshape(self.num_envs).clone()
        trunc = nxt.get("truncated", None)
        trunc = torch.zeros_like(done) if trunc is None else trunc.reshape(self.num_envs).clone()
        next_input = env._step_mdp(td)
        if any_reset:
            # the sub-envs that finished last step start anew now (their action is ignored)
            reward[autoreset] = 0
            term[autoreset] = False
            trunc[autoreset] = False
            done[autoreset] = False
            reset_shape = env.full_done_spec["done"].shape
            next_input.set("_reset", autoreset.reshape(reset_shape).to(next_input.device))
            next_input = await env.reset(next_input)
        return next_input, reward, term, trunc, done

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        td = self._td
        if td is None:
            raise gymnasium.error.ResetNeeded("call reset() before step()")
        td.set(self._codec.action_key, self._codec.action_from_np(actions))
        next_input, reward, term, trunc, done = self.runner.run(self._astep, td, self._autoreset)
        self._td = next_input
        self._autoreset = done.cpu()
        return (
            self._codec.obs(next_input),
            reward.cpu().numpy().astype(np.float64),
            term.cpu().numpy(),
            trunc.cpu().numpy(),
            {},
        )

    def close_extras(self, **kwargs: Any) -> None:
        if not self.env.is_closed:
            self.runner.run(self.env.aclose)


def to_gymnasium(env: EnvBase, *, runner: Runner | None = None) -> AenvGymnasiumEnv:
    """An aenv env of batch size ``()`` as a ``gymnasium.Env``.

    Spaces come from the specs (:func:`aenv.specs.to_gym_space`): one ``"observation"`` key
    gives its space, several give a ``Dict``; text (non-tensor) observations give ``Text``.
    Observations are numpy arrays (strings for text); ``reset(seed=s)`` seeds the env with
    ``set_seed(s)`` first. Each call runs through the loop runner (``runner`` or the default).

    Example:
        >>> genv = to_gymnasium(GymEnv("CartPole-v1"))
        >>> obs, info = genv.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = genv.step(genv.action_space.sample())
    """
    return AenvGymnasiumEnv(env, runner=runner)


def to_gymnasium_vector(env: EnvBase, *, runner: Runner | None = None) -> AenvGymnasiumVectorEnv:
    """A batched aenv env or pool (batch size ``(n,)``) as a gymnasium ``VectorEnv``.

    Autoreset is gymnasium 1.x's default, next-step: a sub-env that finishes returns its last
    observation with its done flags, and the next ``step`` resets it (ignoring its action,
    reward 0, not done) while the others step, through one partial step and one partial
    reset of the aenv env.

    Example:
        >>> venv = to_gymnasium_vector(GymEnv("CartPole-v1", num_envs=4))
        >>> obs, info = venv.reset(seed=0)
        >>> obs, rewards, terms, truncs, info = venv.step(venv.action_space.sample())
    """
    return AenvGymnasiumVectorEnv(env, runner=runner)
