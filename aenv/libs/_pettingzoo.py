"""PettingZoo (parallel and AEC) as aenv multi-agent envs, agents in nested groups."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.envs._marl import MarlGroupMapType, check_marl_grouping
from aenv.exceptions import SpecViolationError
from aenv.libs._flags import done_flags, flag, require
from aenv.specs import (
    Binary,
    Bounded,
    Composite,
    TensorSpec,
    Unbounded,
    from_gym_space,
)
from aenv.specs._numpy import from_numpy_fn, to_numpy_fn

__all__ = ["PettingZooEnv", "PettingZooWrapper"]


def _pettingzoo() -> Any:
    return require(
        "pettingzoo", "PettingZooWrapper needs PettingZoo: pip install 'aenv[pettingzoo]'"
    )


class _Group:
    """One group's agents, its per-agent specs and converters."""

    def __init__(self, name: str, agents: list[str], env: Any, categorical: bool) -> None:
        self.name, self.agents, self.n = name, agents, len(agents)
        obs_space, act_space = env.observation_space(agents[0]), env.action_space(agents[0])
        for agent in agents[1:]:
            if env.observation_space(agent) != obs_space or env.action_space(agent) != act_space:
                raise ValueError(
                    f"group {name!r}: agent {agent!r} has other spaces than {agents[0]!r}; "
                    "a group stacks agents of one observation and action space (use "
                    "MarlGroupMapType.ONE_GROUP_PER_AGENT or a group_map that separates them)"
                )
        obs = from_gym_space(obs_space, categorical_action_encoding=categorical)
        obs_leaves: dict[str, TensorSpec] = (
            dict(obs.items()) if isinstance(obs, Composite) else {"observation": obs}
        )
        # PettingZoo's legal-move masks (0/1 int8 boxes) become booleans, ActionMask's input
        self.has_mask = "action_mask" in obs_leaves
        if self.has_mask:
            obs_leaves["action_mask"] = Binary(
                shape=obs_leaves["action_mask"].shape, dtype=torch.bool
            )
        self.obs_spec = obs_leaves
        self.obs_reader = (
            from_numpy_fn(Composite(obs_leaves))
            if isinstance(obs, Composite)
            else (from_numpy_fn(obs))
        )
        self.dict_obs = isinstance(obs, Composite)
        self.act_spec = from_gym_space(act_space, categorical_action_encoding=categorical)
        self.act_writer = to_numpy_fn(self.act_spec, act_space)

    def read_obs(self, values: list[Any]) -> dict[str, torch.Tensor]:
        per_agent = [self.obs_reader(v) for v in values]
        if not self.dict_obs:
            return {"observation": torch.stack(per_agent)}  # type: ignore[arg-type]
        out = {}
        for key in self.obs_spec:
            stacked = torch.stack([td[key] for td in per_agent])  # type: ignore[index]
            out[key] = stacked.to(torch.bool) if key == "action_mask" else stacked
        return out


class PettingZooWrapper(EnvBase):
    """A PettingZoo env (``ParallelEnv`` or ``AECEnv``) as an aenv multi-agent env.

    Agents live in nested groups (``group_map``; default: one ``"agents"`` group when all
    agents share their spaces, else one group per agent): each group has
    ``(group, "observation")`` (or the keys of a Dict observation space), ``(group,
    "action")``, ``(group, "reward")`` and ``(group, "done" / "terminated" /
    "truncated")``, stacked along an agent dim. Legal-move masks (``"action_mask"`` in the
    observation) come as booleans: ``TransformedEnv(env, ActionMask((g, "action"), (g,
    "action_mask")))`` makes random actions legal. The root ``"done"`` is any agent's done
    for parallel envs and every agent's for AEC envs (``done_on_any`` overrides it).

    AEC envs (turn-based): one agent acts per step, the one PettingZoo's
    ``agent_selection`` names; ``(group, "mask")`` flags it, the other agents' actions are
    ignored, and agents already done are stepped with ``None`` as PettingZoo requires.
    The reward is each agent's reward of that step.

    Seeding: ``await env.set_seed(s)`` seeds the next reset (``reset(seed=s)``; later resets
    continue PettingZoo's stream), as does ``await env.reset(seed=s)``. With
    ``from_pixels=True`` (an env made with ``render_mode="rgb_array"``), ``"pixels"`` holds
    ``env.render()``.

    Args:
        env: the PettingZoo env.
        group_map: a :class:`~aenv.MarlGroupMapType` or ``{group: [agents]}``.
        categorical_actions: Discrete actions as indices (True) or one-hot.
        done_on_any: how the root done flags gather the agents' (see above).
        from_pixels: add ``"pixels"`` from ``env.render()``.
        device: device of the output tensors.

    Example:
        >>> from pettingzoo.classic import rps_v2
        >>> env = PettingZooWrapper(rps_v2.parallel_env())
        >>> td = await env.rollout(3)
        >>> td["agents", "observation"].shape
        torch.Size([3, 2])
    """

    def __init__(
        self,
        env: Any,
        *,
        group_map: MarlGroupMapType | Mapping[str, Sequence[str]] | None = None,
        categorical_actions: bool = True,
        done_on_any: bool | None = None,
        from_pixels: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        pz = _pettingzoo()
        if isinstance(env, pz.ParallelEnv):
            self.parallel = True
        elif isinstance(env, pz.AECEnv):
            self.parallel = False
        else:
            raise TypeError(
                f"PettingZooWrapper wraps a pettingzoo ParallelEnv or AECEnv, got {type(env).__name__}"
            )
        super().__init__(device=device)
        self._env = env
        self.possible_agents = list(env.possible_agents)
        if group_map is None:
            same = all(
                env.observation_space(a) == env.observation_space(self.possible_agents[0])
                and env.action_space(a) == env.action_space(self.possible_agents[0])
                for a in self.possible_agents
            )
            group_map = (
                MarlGroupMapType.ALL_IN_ONE_GROUP if same else MarlGroupMapType.ONE_GROUP_PER_AGENT
            )
        if isinstance(group_map, MarlGroupMapType):
            group_map = group_map.get_group_map(self.possible_agents)
        check_marl_grouping(group_map, self.possible_agents)
        self.group_map = {g: list(a) for g, a in group_map.items()}
        self.done_on_any = self.parallel if done_on_any is None else done_on_any
        self.from_pixels = from_pixels
        self._groups = [
            _Group(g, agents, env, categorical_actions) for g, agents in self.group_map.items()
        ]
        self._pending_seed: int | None = None
        self._build_specs()

    def _build_specs(self) -> None:
        obs: dict[str, Any] = {}
        act: dict[str, Any] = {}
        rew: dict[str, Any] = {}
        done: dict[str, Any] = {}
        for g in self._groups:
            n = g.n
            leaves = {k: v.expand(n, *v.shape) for k, v in g.obs_spec.items()}
            if not self.parallel:
                leaves["mask"] = flag((n,))
            obs[g.name] = Composite(leaves, shape=(n,))
            act[g.name] = Composite(action=g.act_spec.expand(n, *g.act_spec.shape), shape=(n,))
            rew[g.name] = Composite(reward=Unbounded((n, 1)), shape=(n,))
            flags = done_flags((n, 1))
            done[g.name] = Composite(flags, shape=(n,))
        if self.from_pixels:
            frame = self._first_frame()
            obs["pixels"] = Bounded(0, 255, frame.shape, dtype=torch.uint8)
        done.update(done_flags((1,)))
        self.full_observation_spec = Composite(obs)
        self.full_action_spec = Composite(act)
        self.full_reward_spec = Composite(rew)
        self.full_done_spec = Composite(done)

    def _first_frame(self) -> np.ndarray:
        """A frame of ``render()`` (after a reset, so there is one), for the pixels spec."""
        if getattr(self._env, "render_mode", None) != "rgb_array":
            raise ValueError(
                "from_pixels=True needs a PettingZoo env made with render_mode='rgb_array'"
            )
        self._env.reset()
        return np.asarray(self._env.render())

    # ------------------------------------------------------------------ reading
    def _read(
        self,
        observations: Mapping[str, Any],
        rewards: Mapping[str, float] | None,
        terminations: Mapping[str, bool],
        truncations: Mapping[str, bool],
    ) -> TensorDictBase:
        out = TensorDict({}, batch_size=(), device=self.device)
        all_term, all_trunc = [], []
        for g in self._groups:
            zero = self.full_observation_spec[g.name].zero()
            values = [observations.get(a) for a in g.agents]
            if all(v is not None for v in values):
                group = TensorDict(g.read_obs(values), batch_size=(g.n,))
            else:  # agents gone from a parallel env: their last values are zeros
                group = zero
                for i, v in enumerate(values):
                    if v is not None:
                        group[i] = TensorDict(g.read_obs([v]), batch_size=(1,))[0]
            if not self.parallel:
                sel = self._env.agent_selection
                group["mask"] = torch.tensor([a == sel for a in g.agents])
            if g.has_mask:
                # a mask allowing nothing (an idle AEC agent, a finished game) allows
                # everything instead: that action is ignored, and a spec mask needs a value
                masks = group["action_mask"]
                masks[~masks.any(-1)] = True
            term = torch.tensor([[bool(terminations.get(a, True))] for a in g.agents])
            trunc = torch.tensor([[bool(truncations.get(a, False))] for a in g.agents])
            group["terminated"], group["truncated"], group["done"] = term, trunc, term | trunc
            if rewards is not None:
                group["reward"] = torch.tensor(
                    [[float(rewards.get(a, 0.0))] for a in g.agents], dtype=torch.float32
                )
            out[g.name] = group
            all_term.append(term)
            all_trunc.append(trunc)
        term, trunc = torch.cat(all_term), torch.cat(all_trunc)
        gather = torch.any if self.done_on_any else torch.all
        out["terminated"] = gather(term).reshape(1)
        out["truncated"] = gather(trunc).reshape(1) & ~out["terminated"]
        out["done"] = gather(term | trunc).reshape(1)
        if self.from_pixels:
            out["pixels"] = torch.as_tensor(np.asarray(self._env.render()).copy())
        return out.to(self.device) if self.device is not None else out

    def _aec_state(self) -> tuple[dict[str, Any], dict[str, bool], dict[str, bool]]:
        env = self._env
        obs = {a: env.observe(a) for a in env.agents}
        return obs, dict(env.terminations), dict(env.truncations)

    # ------------------------------------------------------------------ env API
    def _set_seed(self, seed: int | None) -> None:
        self._pending_seed = seed

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        seed = kwargs.pop("seed", None)
        if seed is None:
            seed, self._pending_seed = self._pending_seed, None
        if self.parallel:
            obs, _ = self._env.reset(seed=seed, **kwargs)
            return self._read(obs, None, {a: False for a in obs}, {})
        self._env.reset(seed=seed, **kwargs)
        obs, term, trunc = self._aec_state()
        return self._read(obs, None, term, trunc)

    def _actions(self, tensordict: TensorDictBase) -> dict[str, Any]:
        actions: dict[str, Any] = {}
        for g in self._groups:
            values = tensordict.get((g.name, "action"))
            for i, agent in enumerate(g.agents):
                actions[agent] = g.act_writer(values[i])
        return actions

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        actions = self._actions(tensordict)
        env = self._env
        if self.parallel:
            live = {a: actions[a] for a in env.agents}
            obs, rew, term, trunc, _ = env.step(live)
            return self._read(obs, rew, term, trunc)
        agent = env.agent_selection
        if env.terminations[agent] or env.truncations[agent]:
            raise SpecViolationError(
                f"the AEC env's agent {agent!r} is done: reset the env (its root 'done' was set)",
                key="done",
            )
        env.step(actions[agent])
        rewards = dict(env.rewards)
        # agents that are done but not yet removed must be stepped with None (PettingZoo's
        # rule) unless the whole game is over
        while env.agents and not all(env.terminations[a] or env.truncations[a] for a in env.agents):
            sel = env.agent_selection
            if not (env.terminations[sel] or env.truncations[sel]):
                break
            env.step(None)
        obs, term, trunc = self._aec_state()
        return self._read(obs, rewards, term, trunc)

    async def _aclose(self) -> None:
        self._env.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._env}, group_map={self.group_map})"


class PettingZooEnv(PettingZooWrapper):
    """A PettingZoo env built by name, e.g. ``PettingZooEnv("classic.tictactoe_v3")``.

    ``task`` is ``"<family>.<module>"`` under ``pettingzoo`` (``"classic.rps_v2"``,
    ``"butterfly.pistonball_v6"``) or a full module path (``"mpe2.simple_spread_v3"``);
    ``parallel`` picks the module's ``parallel_env`` (True) or ``env`` (False, AEC).

    Args:
        task: the env module.
        parallel: build the parallel API (True) or the AEC one (False).
        seed: seed of the first reset.
        render_mode: passed to the constructor (``"rgb_array"`` for ``from_pixels``).
        make_kwargs: other constructor arguments.
        **kwargs: see :class:`PettingZooWrapper`.

    Example:
        >>> env = PettingZooEnv("classic.tictactoe_v3", parallel=False)
        >>> env.group_map
        {'agents': ['player_1', 'player_2']}
    """

    def __init__(
        self,
        task: str,
        *,
        parallel: bool = True,
        seed: int | None = None,
        render_mode: str | None = None,
        make_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        _pettingzoo()
        name = task if "." in task and task.split(".")[0] not in _FAMILIES else f"pettingzoo.{task}"
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ValueError(
                f"unknown or uninstalled PettingZoo task {task!r} (import of {name!r} failed: {exc})"
            ) from exc
        maker = getattr(module, "parallel_env" if parallel else "env", None)
        if maker is None:
            raise ValueError(f"{name} has no {'parallel_env' if parallel else 'env'} constructor")
        self.task = task
        extra = dict(make_kwargs or {})
        if render_mode is not None:
            extra["render_mode"] = render_mode
        super().__init__(maker(**extra), **kwargs)
        if seed is not None:
            self._pending_seed = seed


_FAMILIES = frozenset({"atari", "butterfly", "classic", "mpe", "sisl"})
