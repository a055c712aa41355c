"""TicTacToeEnv: a stateless, batch-unlocked two-player board game (the seeds' built-in env)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.exceptions import SpecViolationError
from aenv.specs import Categorical, Composite, Unbounded

__all__ = ["TicTacToeEnv"]

# the eight lines of three cells, as flat cell indices
_LINES = torch.tensor(
    [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 3, 6], [1, 4, 7], [2, 5, 8], [0, 4, 8], [2, 4, 6]]
)


class TicTacToeEnv(EnvBase):
    """Tic-tac-toe for two players, with TorchRL's keys and conventions.

    The env keeps no state: ``"board"`` (3x3 int32), ``"turn"`` (whose move: 0 or 1) and
    ``"mask"`` (the 9 free cells) travel in the tensordict, so one env serves any batch
    (``batch_locked = False``). The board is seen by the player to move: ``1`` marks that
    player's stones, ``0`` the opponent's and ``-1`` an empty cell. The action is a cell
    index in ``[0, 9)``; the winner's reward (``("player0", "reward")`` or
    ``("player1", "reward")``) is 1 on the winning move; a win or a full board terminates.
    ``rand_action`` draws among the free cells. With ``single_player=True`` player 1 plays
    uniformly at random right after player 0, inside the same step.

    Playing an occupied cell raises :class:`~aenv.exceptions.SpecViolationError`.

    Args:
        single_player: player 1 is a random player run by the env.
        device: device of the tensors.

    Example:
        >>> env = TicTacToeEnv()
        >>> r = await env.rollout(10)
        >>> int(r.shape[0]) <= 9 and bool(r["next", "done"][-1])
        True
    """

    _batch_locked = False

    def __init__(self, *, single_player: bool = False, device: Any = None) -> None:
        super().__init__(device=device)
        self.single_player = single_player
        self.action_spec = Categorical(9, shape=(), device=device)
        self.observation_spec = Composite(
            board=Unbounded((3, 3), dtype=torch.int32, device=device),
            turn=Categorical(2, shape=(1,), dtype=torch.int32, device=device),
            mask=Categorical(2, shape=(9,), dtype=torch.bool, device=device),
            device=device,
        )
        self.state_spec = self.observation_spec.clone()
        self.full_reward_spec = Composite(
            player0=Composite(reward=Unbounded((1,), device=device)),
            player1=Composite(reward=Unbounded((1,), device=device)),
            device=device,
        )
        flag = Categorical(2, shape=(1,), dtype=torch.bool, device=device)
        self.full_done_spec = Composite(
            done=flag, terminated=flag.clone(), truncated=flag.clone(), device=device
        )
        self._lines = _LINES.to(device) if device is not None else _LINES

    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            torch.manual_seed(seed)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        shape = tensordict.batch_size if tensordict is not None else torch.Size()
        dev = self.device
        return TensorDict(
            {
                "board": torch.full((*shape, 3, 3), -1, dtype=torch.int32, device=dev),
                "turn": torch.zeros((*shape, 1), dtype=torch.int32, device=dev),
                "mask": torch.ones((*shape, 9), dtype=torch.bool, device=dev),
                "done": torch.zeros((*shape, 1), dtype=torch.bool, device=dev),
                "terminated": torch.zeros((*shape, 1), dtype=torch.bool, device=dev),
                "truncated": torch.zeros((*shape, 1), dtype=torch.bool, device=dev),
            },
            batch_size=shape,
            device=dev,
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = self._play(tensordict)
        if self.single_player:
            # player 1's random reply where the game goes on after player 0's move
            reply = (~out["done"] & (tensordict["turn"] == 0)).squeeze(-1)
            if not bool(reply.any()):
                return out
            if not out.batch_dims:
                return self._reply(out)
            out[reply] = self._reply(out[reply])
        return out

    def _reply(self, td: TensorDictBase) -> TensorDictBase:
        answered = self._play(self.rand_action(td.clone()))
        answered["player0", "reward"] = td["player0", "reward"]
        return answered

    def _play(self, td: TensorDictBase) -> TensorDictBase:
        board = td["board"].flatten(-2, -1)
        action = td["action"].reshape(td.batch_size).to(torch.int64)
        free = td["mask"].gather(-1, action.unsqueeze(-1)).squeeze(-1)
        if not bool(free.all()):
            bad = (~free).nonzero()[0].tolist()
            raise SpecViolationError(
                f"TicTacToeEnv: action {int(action[tuple(bad)] if bad else action)} plays an "
                f"occupied cell (batch index {tuple(bad)}); allowed cells are those of 'mask'",
                key="action",
            )
        board = board.scatter(-1, action.unsqueeze(-1), 1)
        mine = (board == 1).to(torch.int32)
        wins = (mine[..., self._lines].sum(-1) == 3).any(-1, keepdim=True)
        mask = board == -1
        done = wins | ~mask.any(-1, keepdim=True)
        turn = td["turn"]
        # the next player sees the board from their side: stones swap owner, empties stay
        flipped = torch.where(board == -1, board, 1 - board).reshape(*td.batch_size, 3, 3)
        return TensorDict(
            {
                "board": flipped,
                "turn": 1 - turn,
                "mask": mask,
                ("player0", "reward"): (wins & (turn == 0)).to(torch.float32),
                ("player1", "reward"): (wins & (turn == 1)).to(torch.float32),
                "done": done,
                "terminated": done.clone(),
                "truncated": torch.zeros_like(done),
            },
            batch_size=td.batch_size,
            device=td.device,
        )

    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """A random free cell (uniform among ``"mask"``, any cell when there is no mask)."""
        if tensordict is None:
            tensordict = TensorDict({}, batch_size=self.batch_size, device=self.device)
        mask = tensordict.get("mask", None)
        shape = tensordict.batch_size
        if mask is None:
            action = torch.randint(0, 9, shape, device=self.device)
        else:
            weights = mask.reshape(-1, 9).to(torch.float32)
            empty = weights.sum(-1) == 0
            weights[empty] = 1.0  # a finished board: any cell (it is never played)
            action = torch.multinomial(weights, 1).reshape(shape)
        tensordict.set("action", action)
        return tensordict
