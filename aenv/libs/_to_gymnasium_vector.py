"""A batched aenv env (or a pool) as a gymnasium ``VectorEnv``: ``to_gymnasium_vector``.

gymnasium's vector API on aenv's done / ``"_reset"`` semantics:

* autoreset ``NEXT_STEP`` (default): gymnasium sees a finished sub-env's last observation on
  the step that ends its episode, and the first one of its next episode on the following
  step (reward 0, not done, its action ignored: the sub-env sits that step out through a
  ``"_step"`` mask). A pool resets it within the step that ends the episode (one
  ``step_and_maybe_reset``); other envs, and pools whose observations or infos hold
  non-tensor data, reset it after the step it sits out.
* ``SAME_STEP``: the step that ends an episode returns the next episode's first observation
  and puts the last one in ``info["final_obs"]`` (its info in ``info["final_info"]``).
* ``DISABLED``: plain steps; a finished sub-env waits for ``reset(options={"reset_mask": m})``
  (stepping it first raises ``ResetNeeded``).

``reset(seed=[...])`` seeds each sub-env with its own seed (``int``: ``seed + i``), and a
``reset_mask`` resets only the flagged sub-envs (a partial reset through ``"_reset"``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_differing_spaces, batch_space
from tensordict import TensorDictBase

from aenv.envs._common import EnvBase
from aenv.exceptions import (
    AenvError,
    BatchSizeError,
    EnvStepError,
    PoolError,
    SpaceMismatchError,
)
from aenv.libs._gym_batch import (
    _is_array_space,
    at,
    cause,
    has_non_tensor,
    is_pool,
    leading_sizes,
    put,
    reset_mask,
)
from aenv.libs._gym_vector import DISABLED, NEXT_STEP, SAME_STEP, normalize_autoreset_mode
from aenv.libs._to_gymnasium import Codec, fresh, unwrap_facade
from aenv.specs import to_gym_space
from aenv.sync import Runner, get_runner

__all__ = ["AenvGymnasiumVectorEnv", "to_gymnasium_vector"]

_MODES = {
    NEXT_STEP: AutoresetMode.NEXT_STEP,
    SAME_STEP: AutoresetMode.SAME_STEP,
    DISABLED: AutoresetMode.DISABLED,
}


class AenvGymnasiumVectorEnv(VectorEnv):  # type: ignore[type-arg]
    """A batched aenv env or pool (batch size ``(n,)``), or a sync facade over one
    (``SerialEnv``, ``ParallelEnv``), as a gymnasium ``VectorEnv``.

    Args:
        env: the env.
        runner: the loop runner (default: the facade's, else the process-wide one).
        autoreset_mode: gymnasium's ``AutoresetMode`` (or its name): ``NEXT_STEP`` (default),
            ``SAME_STEP`` or ``DISABLED``; see :mod:`aenv.libs._to_gymnasium_vector`.
        observation_mode: ``"same"`` (the sub-envs' observation spaces must be equal) or
            ``"different"`` (spaces with equal shapes and dtypes, batched as they are).
        info_key: the non-tensor entry holding each sub-env's info dict (see
            :class:`~aenv.libs.gym.InfoAsEntry`); its dicts come back aggregated as
            gymnasium's vector envs give them (``info[k]`` an array, ``info["_k"]`` its mask).

    Example:
        >>> venv = to_gymnasium_vector(GymEnv("CartPole-v1", num_envs=4))
        >>> obs, info = venv.reset(seed=0)
        >>> obs, rewards, terms, truncs, info = venv.step(venv.action_space.sample())
    """

    def __init__(
        self,
        env: EnvBase,
        *,
        runner: Runner | None = None,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        observation_mode: str | tuple[Any, Any] = "same",
        info_key: str = "info",
    ) -> None:
        env, runner = unwrap_facade(env, runner)
        if len(env.batch_size) != 1:
            raise BatchSizeError(
                f"to_gymnasium_vector needs an env with one batch dim, got {tuple(env.batch_size)}"
            )
        self.env = env
        self._runner = runner
        self._mode = normalize_autoreset_mode(autoreset_mode)
        self.autoreset_mode = _MODES[self._mode]
        self.num_envs = n = int(env.batch_size[0])
        codec = self._codec = Codec(env, 1, info_key, lambda space: batch_space(space, n))
        self.single_observation_space = codec.obs_space
        self.single_action_space = codec.action_space
        if is_pool(env):
            self._sub_env_spaces()
        self.observation_mode = observation_mode
        self.observation_space = self._batched_obs_space(observation_mode)
        actions = [to_gym_space(codec.action_spec[i]) for i in range(n)]
        if any(a != codec.action_space for a in actions):
            raise SpaceMismatchError(
                "the sub-envs' action spaces differ; a vector env needs one action space, "
                f"got {actions}"
            )
        self.action_space = batch_space(self.single_action_space, n)
        self.metadata = {"autoreset_mode": self.autoreset_mode}
        self.render_mode = self._sub_render_mode()
        # a valid action per sub-env, put in place of those a NEXT_STEP autoreset ignores
        self._neutral = codec.action_to_np(codec.action_spec.zero())
        # a pool resets a finished sub-env in the step that ends its episode (one operation);
        # other envs reset it after that step (NEXT_STEP: after the next one), as do pools
        # with non-tensor observations or infos, which a pool's merged resets do not carry
        # (an env that cannot leave live sub-envs out of a step, a wrapped gymnasium vector
        # env, needs the reset after the step)
        self._eager = is_pool(env) and not has_non_tensor(env.full_observation_spec)
        self._td: TensorDictBase | None = None
        # one numpy array holds a batch of actions (checked by its first dim alone)
        self._array_actions = _is_array_space(self.single_action_space)
        self._autoreset = np.zeros(n, dtype=np.bool_)
        self._dones = np.zeros(n, dtype=np.bool_)

    def _batched_obs_space(self, mode: Any) -> gymnasium.Space:  # type: ignore[type-arg]
        n, single = self.num_envs, self.single_observation_space
        if isinstance(mode, tuple) and len(mode) == 2:
            # gymnasium's custom mode: (batched space, single space) given as they are
            batched, self.single_observation_space = mode
            return batched  # type: ignore[no-any-return]
        if mode not in ("same", "different"):
            raise ValueError(
                "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single "
                f"and batch observation space, actual got {mode}"
            )
        per_env = [to_gym_space(self._codec.obs_spec[i]) for i in range(n)]
        if mode == "different":
            return batch_differing_spaces(per_env)
        for space in per_env:
            if space != single:
                raise SpaceMismatchError(
                    f"{type(self).__name__}(..., observation_mode='same') however the "
                    "sub-environments observation spaces are not equivalent. "
                    f"single_observation_space={single}, sub-environment observation_space="
                    f"{space}. If this is intentional, use `observation_mode='different'` "
                    "instead."
                )
        return batch_space(single, n)

    def _sub_env_spaces(self) -> None:
        """A pool of wrapped gymnasium envs: use sub-env 0's own space objects (equal to the
        spec's), so that the batched spaces sample with its random generator, as gymnasium's
        vector envs do (the same seeds give the same action samples)."""
        try:
            obs, act = (self.get_attr(name)[0] for name in ("observation_space", "action_space"))
        except (AttributeError, PoolError):
            return
        if obs == self.single_observation_space:
            self.single_observation_space = obs
        if act == self.single_action_space:
            self.single_action_space = act

    def _sub_render_mode(self) -> str | None:
        if self._codec.pixels:
            return "rgb_array"
        if not is_pool(self.env):
            return getattr(self.env, "render_mode", None)
        try:
            modes = self.get_attr("render_mode")
        except (AttributeError, PoolError):
            return None
        return modes[0] if modes else None

    @property
    def runner(self) -> Runner:
        return self._runner if self._runner is not None else get_runner()

    # ------------------------------------------------------------------ reset
    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        self._check_open()
        n = self.num_envs
        if seed is None:
            seeds: list[int | None] = [None] * n
        elif isinstance(seed, int | np.integer):
            seeds = [int(seed) + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(
                    f"reset got {len(seeds)} seeds for {n} sub-envs; pass one seed per sub-env"
                )
        options = dict(options or {})
        mask = reset_mask(options.pop("reset_mask", None), n)
        if self._td is None:
            mask = None  # nothing to keep yet: every sub-env starts
        td = self._run_envs(self._areset, seed, seeds, mask, options or None)
        self._td = td
        started = slice(None) if mask is None else mask
        self._autoreset[started] = False
        self._dones[started] = False
        infos: dict[str, Any] = {}
        per_env = self._codec.infos(td, n)
        for i in range(n) if mask is None else np.flatnonzero(mask):
            infos = self._add_info(infos, per_env[int(i)], int(i))
        return self._codec.obs(td), infos

    async def _areset(
        self,
        seed: Any,
        seeds: list[int | None],
        mask: np.ndarray | None,
        options: dict[str, Any] | None,
    ) -> TensorDictBase:
        env = self.env
        kwargs: dict[str, Any] = {} if options is None else {"options": options}
        if mask is None:
            if isinstance(seed, int | np.integer) or (
                seeds[0] is not None and seeds == [seeds[0] + i for i in range(len(seeds))]
            ):
                # seed + i for sub-env i: what set_seed does on pools and vector envs
                await env.set_seed(int(seeds[0]))  # type: ignore[arg-type]
            elif any(s is not None for s in seeds):
                await self._seed_each(seeds, kwargs)
            return await env.reset(**kwargs)
        if any(s is not None for s in seeds):
            await self._seed_each([s if m else None for s, m in zip(seeds, mask)], kwargs)
        assert self._td is not None
        td = self._td.clone()
        shape = env.full_done_spec["done"].shape
        td.set("_reset", torch.from_numpy(mask.copy()).reshape(shape).to(td.device))
        return await env.reset(td, **kwargs)

    async def _seed_each(self, seeds: list[int | None], kwargs: dict[str, Any]) -> None:
        """Seed sub-envs one by one (a pool's envs where they live); an env that is not a pool
        takes the list as its reset's ``seed`` (a wrapped gymnasium vector env does)."""
        env = self.env
        if is_pool(env):
            for i, s in enumerate(seeds):
                if s is not None:
                    await env.call("set_seed", int(s), env_indices=[i])  # type: ignore[attr-defined]
            return
        kwargs["seed"] = seeds

    def _check_open(self) -> None:
        if self.closed or self.env.is_closed:
            raise gymnasium.error.ClosedEnvironmentError(
                f"{type(self).__name__} is closed: make a new one"
            )

    # ------------------------------------------------------------------ step
    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        self._check_open()
        td = self._td
        if td is None:
            raise gymnasium.error.ResetNeeded("call reset() before step()")
        n, codec = self.num_envs, self._codec
        if not (self._array_actions and type(actions) is np.ndarray and actions.shape[:1] == (n,)):
            sizes = leading_sizes(self.single_action_space, actions)
            if any(s is None for s in sizes):
                raise TypeError(
                    f"step needs a batch of {n} actions (one per sub-env), got {actions!r}"
                )
            if any(s != n for s in sizes):
                raise ValueError(f"step needs {n} actions (one per sub-env), got {sizes[0]}")
        if self._mode == DISABLED and self._dones.any():
            raise gymnasium.error.ResetNeeded(
                f"sub-envs {np.flatnonzero(self._dones).tolist()} finished with autoreset "
                "disabled; reset them with reset(options={'reset_mask': ...}) first"
            )
        pending = self._autoreset.copy()
        any_pending = bool(pending.any())
        if any_pending:
            for i in np.flatnonzero(pending):
                # this sub-env restarts instead: its action is ignored (and may be invalid)
                space = self.single_action_space
                actions = put(space, actions, int(i), at(space, self._neutral, int(i)))
        td.set(codec.action_key, codec.action_from_np(actions))
        nxt, next_input = self._run_envs(self._astep, td, pending)
        reward = _flags(nxt, "reward", n, np.float64)
        done = _flags(nxt, "done", n)
        assert reward is not None and done is not None  # (every env's step gives them)
        term_or_none = _flags(nxt, "terminated", n)
        term = done.copy() if term_or_none is None else term_or_none
        trunc_or_none = _flags(nxt, "truncated", n)
        trunc = np.zeros_like(done) if trunc_or_none is None else trunc_or_none
        if any_pending:
            reward[pending] = 0.0
            term[pending] = trunc[pending] = done[pending] = False
        infos: dict[str, Any] = {}
        step_infos = codec.infos(nxt, n)
        if self._mode == SAME_STEP:
            obs = codec.obs(next_input)
            if done.any():
                final = codec.obs(nxt)
                reset_infos = codec.infos(next_input, n)
                infos = self._same_step_infos(step_infos, reset_infos, final, done)
            else:
                infos = self._merge_infos(step_infos)
        else:
            obs = codec.obs(nxt)
            if any_pending:
                # the sub-envs that restarted show their first observation and reset info:
                # a pool reset them in the last step (their start is this step's input),
                # another env just now
                starts = td if self._eager else next_input
                start_obs, start_infos = codec.obs(starts), codec.infos(starts, n)
                space = self.single_observation_space
                for i in np.flatnonzero(pending):
                    obs = put(space, obs, int(i), at(space, start_obs, int(i)))
                    step_infos[int(i)] = start_infos[int(i)]
            infos = self._merge_infos(step_infos)
        self._td = next_input
        if self._mode == NEXT_STEP:
            self._autoreset = done
        elif self._mode == DISABLED:
            self._dones |= done
        return obs, reward, term, trunc, infos

    async def _astep(
        self, td: TensorDictBase, pending: np.ndarray
    ) -> tuple[TensorDictBase, TensorDictBase]:
        env = self.env
        if self._mode == DISABLED:
            td = await env.step(td)
            return td.get("next"), env._step_mdp(td)
        if pending.any():
            td.set("_step", torch.from_numpy(~pending).to(td.device))
        if self._eager:
            stepped, next_input = await env.step_and_maybe_reset(td)
            stepped.pop("_step", None)
            next_input.pop("_step", None)
            return stepped.get("next"), next_input
        td = await env.step(td)
        td.pop("_step", None)
        next_input = env._step_mdp(td)
        # NEXT_STEP: the sub-envs that sat the step out start anew after it; SAME_STEP: those
        # that finished in it
        restart = pending
        if self._mode == SAME_STEP:
            restart = td.get("next").get("done").reshape(self.num_envs).cpu().numpy()
        if restart.any():
            shape = env.full_done_spec["done"].shape
            next_input.set("_reset", torch.from_numpy(restart).reshape(shape).to(td.device))
            next_input = await env.reset(next_input)
        return td.get("next"), next_input

    def _merge_infos(self, per_env: list[dict[str, Any]]) -> dict[str, Any]:
        infos: dict[str, Any] = {}
        if self._codec.info_key is None:
            return infos  # (no sub-env keeps infos: every one is empty)
        for i, info in enumerate(per_env):
            infos = self._add_info(infos, info, i)
        return infos

    def _same_step_infos(
        self,
        step_infos: list[dict[str, Any]],
        reset_infos: list[dict[str, Any]],
        final: Any,
        done: np.ndarray,
    ) -> dict[str, Any]:
        infos: dict[str, Any] = {}
        for i in range(self.num_envs):
            if done[i]:
                obs_i = fresh(at(self.single_observation_space, final, i))
                last = {"final_obs": obs_i, "final_info": step_infos[i]}
                infos = self._add_info(infos, last, i)
                infos = self._add_info(infos, reset_infos[i], i)
            else:
                infos = self._add_info(infos, step_infos[i], i)
        return infos

    def _run_envs(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` on the runner; a sub-env's own error comes out as it was raised.

        gymnasium's vector envs re-raise a sub-env's exception itself (a ``ValueError`` stays
        a ``ValueError``), so code written for them catches it by its type. Of a pool's
        failing sub-envs, the first one's exception is raised, the ``PoolError`` (every env's
        error, the others' results) its ``__context__``; a failure with no sub-env exception
        behind it (a worker lost, a timeout) or an aenv error stays a ``PoolError``.
        """
        try:
            return self.runner.run(fn, *args)
        except PoolError as exc:
            first = exc.errors[min(exc.errors)] if exc.errors else None
            # the exception the sub-env raised: the one an EnvStepError wraps
            original = first.__cause__ if isinstance(first, EnvStepError) else None
            if not isinstance(original, Exception) or isinstance(original, AenvError):
                raise
            original.add_note(f"(sub-env error, raised from the bridge's pool: {exc})")
            raise original  # noqa: B904 - the PoolError becomes its __context__

    # ------------------------------------------------------------------ sub-env access
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every sub-env (or read it, when it is not callable)."""
        env = self.env
        if not is_pool(env):
            fn = getattr(env, "call", None)
            if fn is None:
                raise AttributeError(f"{type(env).__name__} has no sub-envs to call {name!r} on")
            return tuple(fn(name, *args, **kwargs))
        try:
            return tuple(self.runner.run(env.call, name, *args, **kwargs))  # type: ignore[attr-defined]
        except PoolError as exc:
            if all(isinstance(cause(e), TypeError) for e in exc.errors.values()):
                return self.get_attr(name)  # an attribute, not a method
            raise

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every sub-env."""
        env = self.env
        if not is_pool(env):
            fn = getattr(env, "get_attr", None)
            if fn is None:
                return (getattr(env, name),) * self.num_envs
            return tuple(fn(name))
        try:
            return tuple(self.runner.run(env.get_attr, name))  # type: ignore[attr-defined]
        except PoolError as exc:
            if all(isinstance(cause(e), AttributeError) for e in exc.errors.values()):
                raise AttributeError(f"the sub-envs have no attribute {name!r}") from exc
            raise

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set attribute ``name`` of every sub-env: one value each (a list or tuple of
        ``num_envs``) or the same value for all."""
        n = self.num_envs
        if not isinstance(values, list | tuple):
            values = [values] * n
        if len(values) != n:
            raise ValueError(f"set_attr needs {n} values (one per sub-env), got {len(values)}")
        env = self.env
        if not is_pool(env):
            fn = getattr(env, "set_attr", None)
            if fn is None:
                raise AttributeError(f"{type(env).__name__} has no sub-envs to set {name!r} on")
            fn(name, list(values))
            return
        self.runner.run(self._aset_attr, name, list(values))

    async def _aset_attr(self, name: str, values: list[Any]) -> None:
        pool: Any = self.env
        for i, value in enumerate(values):
            try:
                # a wrapped gymnasium env: set it on the env itself, through its wrappers
                await pool.call("set_wrapper_attr", name, value, env_indices=[i])
            except PoolError:
                await pool.call("__setattr__", name, value, env_indices=[i])

    def render(self) -> tuple[Any, ...] | None:
        """The sub-envs' frames: ``"pixels"`` observations, else their own ``render()``."""
        if self._codec.pixels:
            if self._td is None:
                return None
            return tuple(self._td.get("pixels").cpu().numpy())
        if self.render_mode is None:
            return None
        return self.call("render")

    @property
    def np_random_seed(self) -> tuple[Any, ...]:  # type: ignore[override]
        """The sub-envs' seeds (their ``np_random_seed``)."""
        return self.get_attr("np_random_seed")

    def close_extras(self, **kwargs: Any) -> None:
        if not self.env.is_closed:
            self.runner.run(self.env.aclose)


def _flags(td: TensorDictBase, key: str, n: int, dtype: Any = None) -> np.ndarray | None:
    """Entry ``key`` of ``td`` (``n`` one-element values) as a fresh numpy array of ``n``
    (None when absent)."""
    value = td.get(key, None)
    if value is None:
        return None
    out = value.detach().reshape(n).cpu().numpy()
    return out.astype(dtype) if dtype is not None else out.copy()


#: the bridge's function name: ``to_gymnasium_vector(env, ...)`` builds the vector env
to_gymnasium_vector = AenvGymnasiumVectorEnv
