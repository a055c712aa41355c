"""aenv envs as gymnasium envs: ``to_gymnasium`` (single); the codec both bridges share.

Each gymnasium call is one hop through aenv's loop runner (:func:`aenv.sync.get_runner`), so
any aenv env (async, transformed, a pool, or a sync facade over one) can be driven by
gymnasium-style training loops.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium
import numpy as np
import torch
from tensordict import NonTensorData, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.exceptions import BatchSizeError
from aenv.libs._gym_info import info_dicts
from aenv.libs._to_gymnasium_rows import StepRows, call_env
from aenv.specs import NonTensor, TensorSpec, to_gym_space
from aenv.specs._numpy import _plain_numpy as plain_numpy
from aenv.specs._numpy import from_numpy_fn, to_numpy_fn
from aenv.sync import Runner, get_runner

__all__ = ["AenvGymnasiumEnv", "to_gymnasium"]


def unwrap_facade(env: Any, runner: Runner | None) -> tuple[EnvBase, Runner | None]:
    """The async env under a sync facade (``SyncEnv``, ``SerialEnv``, ``ParallelEnv``) and
    the facade's runner: the bridge awaits the env itself, on that runner's loop (awaiting
    the facade's sync methods from the loop would be a sync call inside the loop)."""
    from aenv.sync import SyncEnv

    if isinstance(env, SyncEnv):
        facade_runner = env.__dict__.get("_runner")
        return env.env, runner if runner is not None else facade_runner
    if not isinstance(env, EnvBase):
        raise TypeError(f"the gymnasium bridge needs an aenv env, got {type(env).__name__}")
    return env, runner


def unbatch(spec: TensorSpec, ndim: int) -> TensorSpec:
    """``spec`` without its first ``ndim`` dims (element 0 of each)."""
    for _ in range(ndim):
        spec = spec[0]
    return spec


class Codec:
    """Spaces and converters of an env's observations, actions and infos.

    Observations are the observation spec's entries but the info entry (``info_key``, a
    non-tensor entry such as :class:`~aenv.libs.gym.InfoAsEntry` writes); the action is the
    action spec's one root entry (a leaf, or a Composite for Dict / Tuple spaces). Spaces
    come from the specs without their batch dims; ``batch_space`` (a function of the single
    space) gives the batched spaces the converters are built for.
    """

    def __init__(
        self, env: EnvBase, batch_ndim: int, info_key: str, batch_space: Any = None
    ) -> None:
        obs_spec = env.full_observation_spec
        info = obs_spec.get(info_key) if info_key in obs_spec.keys() else None
        self.info_key = info_key if isinstance(info, NonTensor) else None
        self.obs_keys = [k for k in obs_spec.keys() if k != self.info_key]
        self.single_obs = self.obs_keys == ["observation"]
        self.obs_spec: TensorSpec = (
            obs_spec["observation"] if self.single_obs else obs_spec.select(*self.obs_keys)
        )
        self.obs_space = to_gym_space(unbatch(self.obs_spec, batch_ndim))
        batched = batch_space(self.obs_space) if batch_space is not None else self.obs_space
        self.obs_to_np = to_numpy_fn(self.obs_spec, batched)
        roots = list(env.full_action_spec.keys())
        if len(roots) != 1:
            raise ValueError(
                f"the gymnasium bridge needs exactly one action entry, got {env.action_keys}"
            )
        self.action_key = roots[0]
        act = env.full_action_spec[self.action_key]
        self.action_spec = act
        self.action_space = to_gym_space(unbatch(act, batch_ndim))
        self.action_from_np = from_numpy_fn(act, env.device)
        act_batched = (
            batch_space(self.action_space) if batch_space is not None else self.action_space
        )
        self.action_to_np = to_numpy_fn(act, act_batched)
        self.pixels = "pixels" in self.obs_keys

    def obs(self, td: TensorDictBase) -> Any:
        # gymnasium wants fresh data on every call: tensors may be shared with the env
        if self.single_obs:
            return fresh(self.obs_to_np(td.get("observation")))
        return fresh(self.obs_to_np(td.select(*self.obs_keys)))

    def info(self, td: TensorDictBase) -> dict[str, Any]:
        """A single env's info dict kept in ``td`` (``{}`` without an info entry)."""
        value = None if self.info_key is None else td.get(self.info_key, None)
        if isinstance(value, NonTensorData) and isinstance(value.data, dict):
            return dict(value.data)
        return {}

    def infos(self, td: TensorDictBase, num_envs: int) -> list[dict[str, Any]]:
        """Each sub-env's info dict kept in a batched ``td``."""
        if self.info_key is None:
            return [{} for _ in range(num_envs)]
        return info_dicts(td.get(self.info_key, None), num_envs)


def fresh(value: Any) -> Any:
    """A copy of a gymnasium value whose arrays share no memory with the env's tensors."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: fresh(v) for k, v in value.items()}
    if isinstance(value, tuple):
        items = (fresh(v) for v in value)
        # a named tuple (a Graph's GraphInstance) keeps its type: spaces check it
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


def _flag(td: TensorDictBase, key: str) -> torch.Tensor | None:
    return td.get(key, None)


class AenvGymnasiumEnv(gymnasium.Env):  # type: ignore[type-arg]
    """An aenv env of batch size ``()`` (or a :class:`~aenv.sync.SyncEnv` facade over one)
    as a ``gymnasium.Env``.

    Spaces come from the specs (:func:`aenv.specs.to_gym_space`): one ``"observation"`` key
    gives its space, several give a ``Dict``; text (non-tensor) observations give ``Text``,
    and spaces gymnasium values cannot be tensors of (``Sequence``, ``Graph``, ``OneOf``)
    come back as they went in. Observations are numpy arrays of the space's dtype;
    ``reset(seed=s)`` seeds the env with ``set_seed(s)`` first; ``reset(options=...)`` passes
    the options to the env's reset. The non-tensor entry ``info_key`` (what
    :class:`~aenv.libs.gym.InfoAsEntry` keeps) is the ``info`` dict; without it, ``info`` is
    ``{}``. Each call runs through the loop runner (``runner``, the facade's, or the default).

    Example:
        >>> genv = to_gymnasium(GymEnv("CartPole-v1"))
        >>> obs, info = genv.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = genv.step(genv.action_space.sample())
    """

    def __init__(
        self, env: EnvBase, *, runner: Runner | None = None, info_key: str = "info"
    ) -> None:
        env, runner = unwrap_facade(env, runner)
        if tuple(env.batch_size) != ():
            raise BatchSizeError(
                f"to_gymnasium needs an env of batch size (), got {tuple(env.batch_size)}; "
                "use to_gymnasium_vector for batched envs"
            )
        self.env = env
        self._runner = runner
        codec = self._codec = Codec(env, 0, info_key)
        self.observation_space = codec.obs_space
        self.action_space = codec.action_space
        self.render_mode = "rgb_array" if codec.pixels else None
        self.metadata = {"render_modes": ["rgb_array"] if codec.pixels else []}
        # the last step's input-to-be: a TensorDict (the general path), or None with the
        # rows holding it (the row path), or before the first reset
        self._td: TensorDictBase | None = None
        self._started = False
        # the row path: an env writing its steps into rows, no info entry, one observation
        self._rows = (
            StepRows.make(env, codec.action_key)
            if codec.info_key is None and codec.single_obs
            else None
        )
        self._on_rows = False
        self._obs_view = None
        if self._rows is not None and codec.obs_to_np is plain_numpy:
            # the observation as gymnasium gets it is a copy of the row's numpy view
            self._obs_view = [td.get("observation").numpy() for td in self._rows.inputs]

    @property
    def runner(self) -> Runner:
        return self._runner if self._runner is not None else get_runner()

    def _call(self, op: str, fn: Any, *args: Any) -> Any:
        return call_env(self.env, self.runner, op, fn, *args)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        env = self.env
        rows = self._rows
        done = None
        if self._on_rows and seed is None and not options:
            assert rows is not None
            # after the step that ended the episode: the env's reset-after-done into the
            # rows, as a pool's step-and-maybe-reset resets it
            done = rows.reset_after_end()
            if done is True:
                views = self._obs_view
                obs = views[rows.k].copy() if views is not None else self._codec.obs(rows.current)
                return obs, {}
        if isinstance(done, TensorDictBase):
            td = done  # (the env reset itself and handed its output back)
        else:
            if seed is not None:
                self._call("seed", env.set_seed, seed)
            if options:
                td = self.runner.run(functools.partial(env.reset, options=options))
            else:
                td = self._call("reset", env.reset)
        self._started = True
        self._on_rows = rows is not None and rows.start(td)
        self._td = None if self._on_rows else td
        return self._codec.obs(td), self._codec.info(td)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if not self._started:
            raise gymnasium.error.ResetNeeded("call reset() before step()")
        codec = self._codec
        rows = self._rows
        if self._on_rows:
            assert rows is not None
            nxt = rows.step_value(action, codec.action_from_np)
            if nxt is None:
                reward, terminated, truncated = rows.outputs()
                views = self._obs_view
                obs = views[rows.k].copy() if views is not None else codec.obs(rows.current)
                return obs, reward, terminated, truncated, {}
            # the env handed a TensorDict back: on with the general path from here
            self._on_rows = False
            td = rows.current.clone()
            td.set("next", nxt)
        else:
            current = self._td
            assert current is not None
            td = current.set(codec.action_key, codec.action_from_np(action))
            td = self._call("step", self.env.step, td)
            nxt = td.get("next")
        obs = codec.obs(nxt)
        reward = float(nxt.get("reward"))
        term = _flag(nxt, "terminated")
        trunc = _flag(nxt, "truncated")
        done = bool(nxt.get("done"))
        terminated = bool(term) if term is not None else done
        truncated = bool(trunc) if trunc is not None else False
        info = codec.info(nxt)
        self._td = self.env._step_mdp(td)
        return obs, reward, terminated, truncated, info

    def render(self) -> Any:
        if not self._codec.pixels or not self._started:
            return None
        td = self._td
        if self._on_rows:
            assert self._rows is not None
            td = self._rows.current
        assert td is not None
        return td.get("pixels").cpu().numpy()

    def close(self) -> None:
        if not self.env.is_closed:
            self.runner.run(self.env.aclose)


#: the bridge's function name: ``to_gymnasium(env, ...)`` builds the gymnasium env
to_gymnasium = AenvGymnasiumEnv
