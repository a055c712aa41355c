"""OpenSpiel games (``pyspiel``) as aenv multi-agent envs: players in nested groups, legal
actions as masks in the data, chance outcomes drawn from a seeded generator."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.envs._marl import MarlGroupMapType, check_marl_grouping
from aenv.exceptions import SpecViolationError
from aenv.libs._flags import done_flags, flag, require
from aenv.specs import Binary, Categorical, Composite, Unbounded

__all__ = ["OpenSpielEnv", "OpenSpielWrapper", "sample_chance"]


def _pyspiel() -> Any:
    return require("pyspiel", "OpenSpielWrapper needs OpenSpiel: pip install 'aenv[openspiel]'")


def sample_chance(state: Any, rng: np.random.Generator) -> int:
    """One outcome of a chance node, drawn from ``state.chance_outcomes()`` with ``rng``
    (``rng.choice`` over the outcomes, their probabilities normalised)."""
    outcomes, probs = zip(*state.chance_outcomes())
    p = np.asarray(probs, dtype=np.float64)
    return int(rng.choice(np.asarray(outcomes), p=p / p.sum()))


class OpenSpielWrapper(EnvBase):
    """An OpenSpiel game (a ``pyspiel.Game``, or a ``pyspiel.State`` to start every episode
    from) as an aenv multi-agent env.

    Players are ``"player_0"``, ``"player_1"``... in nested groups (``group_map``; default
    one ``"agents"`` group): ``(group, "observation")`` (float32, the game's observation
    tensor, or its information-state tensor with ``information_state=True``), ``(group,
    "action_mask")`` (bool, the player's legal actions), ``(group, "mask")`` (the players
    who act now), ``(group, "action")`` (an action index), ``(group, "reward")`` and the
    per-player done flags, each stacked along a player dim. The root has the done flags
    and ``"current_player"`` (OpenSpiel's id: a player, -2 for a simultaneous move, -4 once
    the game is over).

    Turns: in a sequential game one player acts per step, the others' actions are ignored;
    in a simultaneous node every player with legal actions acts. An action that is not
    legal raises :class:`~aenv.exceptions.SpecViolationError` and changes nothing. The
    masks are in the data, so ``TransformedEnv(env, ActionMask((g, "action"), (g,
    "action_mask")))`` makes random actions legal; players who do not act get a mask
    allowing every action (their action is ignored, and a spec mask needs an allowed value).

    Rewards: each player's reward of that step, not the running return: what OpenSpiel's
    ``returns()`` gained over the move and the chance nodes after it (their sum over an
    episode is ``returns()``).

    Chance: chance nodes are resolved inside ``reset`` and ``step`` with a numpy generator
    (:func:`sample_chance`). ``await env.set_seed(s)`` makes it ``default_rng(s)``, as does
    ``reset(seed=s)``; unseeded, it draws fresh entropy.

    Args:
        game: the ``pyspiel.Game`` (or a ``pyspiel.State``: episodes start from its clone).
        group_map: a :class:`~aenv.MarlGroupMapType` or ``{group: [players]}``.
        information_state: observe the information-state tensor (perfect recall) instead of
            the observation tensor.
        device: device of the output tensors.

    Example:
        >>> import pyspiel
        >>> env = OpenSpielWrapper(pyspiel.load_game("tic_tac_toe"))
        >>> td = await env.reset()
        >>> td["agents", "action_mask"].shape, td["current_player"].item()
        (torch.Size([2, 9]), 0)
    """

    def __init__(
        self,
        game: Any,
        *,
        group_map: MarlGroupMapType | Mapping[str, Sequence[str]] | None = None,
        information_state: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        pyspiel = _pyspiel()
        self._start: Any = None
        if isinstance(game, pyspiel.State):
            self._start, game = game.clone(), game.get_game()
        elif not isinstance(game, pyspiel.Game):
            raise TypeError(
                f"OpenSpielWrapper wraps a pyspiel.Game or pyspiel.State, got {type(game).__name__}"
            )
        kind = game.get_type()
        if kind.dynamics == pyspiel.GameType.Dynamics.MEAN_FIELD:
            raise TypeError(f"OpenSpielWrapper cannot play mean-field games ({kind.short_name})")
        provides = (
            kind.provides_information_state_tensor
            if information_state
            else kind.provides_observation_tensor
        )
        if not provides:
            what = "information-state" if information_state else "observation"
            raise ValueError(f"the game {kind.short_name!r} has no {what} tensor")
        super().__init__(device=device)
        self.game = game
        self.information_state = information_state
        self.num_players = game.num_players()
        self.num_actions = game.num_distinct_actions()
        self.possible_agents = [f"player_{i}" for i in range(self.num_players)]
        if group_map is None:
            group_map = MarlGroupMapType.ALL_IN_ONE_GROUP
        if isinstance(group_map, MarlGroupMapType):
            group_map = group_map.get_group_map(self.possible_agents)
        check_marl_grouping(group_map, self.possible_agents)
        self.group_map = {g: list(a) for g, a in group_map.items()}
        # (group, player ids) in group order: the rows of each group's tensors
        self._groups = [
            (g, [self.possible_agents.index(a) for a in agents])
            for g, agents in self.group_map.items()
        ]
        self._obs_shape = tuple(
            game.information_state_tensor_shape()
            if information_state
            else game.observation_tensor_shape()
        )
        self._rng = np.random.default_rng()
        self._state: Any = None
        self._returns = np.zeros(self.num_players)
        self._build_specs()

    def _build_specs(self) -> None:
        obs: dict[str, Any] = {}
        act: dict[str, Any] = {}
        rew: dict[str, Any] = {}
        done: dict[str, Any] = {}
        a = self.num_actions
        for g, players in self._groups:
            n = len(players)
            obs[g] = Composite(
                observation=Unbounded((n, *self._obs_shape)),
                action_mask=Binary(shape=(n, a), dtype=torch.bool),
                mask=flag((n,)),
                shape=(n,),
            )
            act[g] = Composite(action=Categorical(a, shape=(n,)), shape=(n,))
            rew[g] = Composite(reward=Unbounded((n, 1)), shape=(n,))
            flags = done_flags((n, 1))
            done[g] = Composite(flags, shape=(n,))
        obs["current_player"] = Unbounded((1,), dtype=torch.int64)
        done.update(done_flags((1,)))
        self.full_observation_spec = Composite(obs)
        self.full_action_spec = Composite(act)
        self.full_reward_spec = Composite(rew)
        self.full_done_spec = Composite(done)

    # ------------------------------------------------------------------ reading
    def _resolve_chance(self) -> None:
        state = self._state
        while state.is_chance_node():
            state.apply_action(sample_chance(state, self._rng))

    def _view(self, player: int) -> list[float]:
        state = self._state
        if self.information_state:
            return state.information_state_tensor(player)
        return state.observation_tensor(player)

    def _read(self, rewards: np.ndarray | None) -> TensorDictBase:
        state = self._state
        over = state.is_terminal()
        out = TensorDict({}, batch_size=(), device=None)
        for g, players in self._groups:
            n = len(players)
            views = np.asarray([self._view(p) for p in players], dtype=np.float32)
            masks = np.ones((n, self.num_actions), dtype=bool)
            acting = np.zeros(n, dtype=bool)
            if not over:
                for i, p in enumerate(players):
                    legal = state.legal_actions(p)
                    if legal:
                        acting[i] = True
                        masks[i] = False
                        masks[i, legal] = True
            flags = torch.full((n, 1), over)
            group = {
                "observation": torch.from_numpy(views.reshape(n, *self._obs_shape)),
                "action_mask": torch.from_numpy(masks),
                "mask": torch.from_numpy(acting),
                "terminated": flags,
                "truncated": torch.zeros((n, 1), dtype=torch.bool),
                "done": flags.clone(),
            }
            if rewards is not None:
                group["reward"] = torch.from_numpy(rewards[players].astype(np.float32)[:, None])
            out[g] = TensorDict(group, batch_size=(n,))
        out["current_player"] = torch.tensor([state.current_player()])
        out["terminated"] = torch.tensor([over])
        out["truncated"] = torch.tensor([False])
        out["done"] = torch.tensor([over])
        return out.to(self.device) if self.device is not None else out

    # ------------------------------------------------------------------ env API
    @property
    def state(self) -> Any:
        """The current ``pyspiel.State`` (None before the first reset)."""
        return self._state

    def _set_seed(self, seed: int | None) -> None:
        self._rng = np.random.default_rng(seed)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        if "seed" in kwargs:
            self._set_seed(kwargs.pop("seed"))
        if kwargs:
            raise TypeError(f"OpenSpielWrapper.reset got unexpected arguments {sorted(kwargs)}")
        self._state = (
            self._start.clone() if self._start is not None else self.game.new_initial_state()
        )
        self._resolve_chance()
        self._returns = np.asarray(self._state.returns(), dtype=np.float64)
        return self._read(None)

    def _chosen(self, tensordict: TensorDictBase, players: list[int]) -> dict[int, int]:
        """The actions of ``players``, checked against their legal actions."""
        state = self._state
        chosen: dict[int, int] = {}
        for g, members in self._groups:
            values = tensordict.get((g, "action"))
            for i, p in enumerate(members):
                if p not in players:
                    continue
                action, legal = int(values[i]), state.legal_actions(p)
                if action not in legal:
                    raise SpecViolationError(
                        f"({g!r}, 'action') of {self.possible_agents[p]} (row {i}) is "
                        f"{action}, not a legal action; legal now: {legal}",
                        key=(g, "action"),
                    )
                chosen[p] = action
        return chosen

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        state = self._state
        if state is None or state.is_terminal():
            raise SpecViolationError(
                "the OpenSpiel game is over (or was never reset): reset the env (its root "
                "'done' was set)",
                key="done",
            )
        if state.is_simultaneous_node():
            pyspiel = _pyspiel()
            acting = [p for p in range(self.num_players) if state.legal_actions(p)]
            chosen = self._chosen(tensordict, acting)
            state.apply_actions(
                [chosen.get(p, pyspiel.INVALID_ACTION) for p in range(self.num_players)]
            )
        else:
            player = state.current_player()
            state.apply_action(self._chosen(tensordict, [player])[player])
        self._resolve_chance()
        # the step's reward is what the returns gained over the move and the chance nodes
        # after it: rewards() of a chance node may repeat the move's (2048 does)
        returns = np.asarray(state.returns(), dtype=np.float64)
        rewards, self._returns = returns - self._returns, returns
        return self._read(rewards)

    async def _aclose(self) -> None:
        self._state = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.game}, group_map={self.group_map})"


class OpenSpielEnv(OpenSpielWrapper):
    """An OpenSpiel game loaded by name: ``OpenSpielEnv("leduc_poker")``,
    ``OpenSpielEnv("goofspiel", game_kwargs={"num_cards": 4})`` or
    ``OpenSpielEnv("goofspiel(num_cards=4)")``.

    Args:
        game_string: the game (``pyspiel.load_game``'s string).
        game_kwargs: the game's parameters.
        seed: seed of the chance generator (see :class:`OpenSpielWrapper`).
        **kwargs: see :class:`OpenSpielWrapper`.

    Example:
        >>> env = OpenSpielEnv("kuhn_poker", seed=0)
        >>> env.group_map
        {'agents': ['player_0', 'player_1']}
    """

    def __init__(
        self,
        game_string: str,
        *,
        game_kwargs: Mapping[str, Any] | None = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        pyspiel = _pyspiel()
        try:
            game = (
                pyspiel.load_game(game_string, dict(game_kwargs))
                if game_kwargs
                else pyspiel.load_game(game_string)
            )
        except pyspiel.SpielError as exc:
            raise ValueError(
                f"OpenSpiel cannot load the game {game_string!r} with {dict(game_kwargs or {})}: "
                f"{str(exc).strip().splitlines()[0]} (pyspiel.registered_names() lists the games)"
            ) from exc
        self.game_string = game_string
        super().__init__(game, **kwargs)
        if seed is not None:
            self._set_seed(seed)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.game_string!r}, group_map={self.group_map})"
