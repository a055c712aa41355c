"""ChessEnv: chess on the ``chess`` package (python-chess), an optional dependency."""

from __future__ import annotations

import functools
import io
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.exceptions import BackendUnavailableError, SpecViolationError
from aenv.specs import Bounded, Categorical, Composite, NonTensor, Unbounded

__all__ = ["ChessEnv"]

# the most legal moves any chess position has: the padded length of "legal_moves"
MAX_LEGAL_MOVES = 218


def _chess() -> Any:
    try:
        import chess
        import chess.pgn
    except ImportError:
        raise BackendUnavailableError(
            "ChessEnv needs the chess package: pip install chess (or aenv[chess])"
        ) from None
    return chess


@functools.cache
def uci_moves() -> tuple[str, ...]:
    """Every move a piece could ever make, in UCI (``"e2e4"``, ``"e7e8q"``): the action
    space of :class:`ChessEnv`, sorted, built once from the board geometry."""
    chess = _chess()
    moves = set()
    for src in chess.SQUARES:
        f0, r0 = chess.square_file(src), chess.square_rank(src)
        for dst in chess.SQUARES:
            f1, r1 = chess.square_file(dst), chess.square_rank(dst)
            df, dr = abs(f1 - f0), abs(r1 - r0)
            if src == dst:
                continue
            if df == 0 or dr == 0 or df == dr or {df, dr} == {1, 2}:  # queen lines, knights
                moves.add(chess.square_name(src) + chess.square_name(dst))
            # pawn promotions: one rank forward onto the last rank, straight or capturing
            if df <= 1 and ((r0, r1) in ((6, 7), (1, 0))):
                for piece in "qrbn":
                    moves.add(chess.square_name(src) + chess.square_name(dst) + piece)
    return tuple(sorted(moves))


@functools.cache
def _move_index() -> dict[str, int]:
    return {m: i for i, m in enumerate(uci_moves())}


class ChessEnv(EnvBase):
    """Chess (the seeds' ``ChessEnv``), on python-chess.

    The action is the index of a move in :func:`uci_moves` (every move a piece could ever
    make, in UCI notation; TorchRL indexes a list of SAN strings instead, which it ships as
    a data file). ``"turn"`` is True when white is to move; the reward of a move is 1 when it
    checkmates, 0.5 when it ends the game otherwise (stalemate, insufficient material, the
    75-move or fivefold-repetition rules, or a claimable fifty-move draw), else 0; the game's
    end terminates the episode. ``"action_mask"`` (``mask_actions=True``) flags the legal
    moves, and :meth:`rand_action` draws among them; an illegal move raises
    :class:`~aenv.exceptions.SpecViolationError`.

    ``stateful=False`` keeps no board between calls: the position travels in the tensordict
    as ``"fen"`` (or ``"pgn"``), so ``reset`` can also start from a given position.

    Args:
        stateful: keep the board in the env (default) or read it from ``"fen"``/``"pgn"``.
        include_san: the last move in SAN (``"<start>"`` after a reset) as ``"san"``.
        include_fen: the position as ``"fen"``.
        include_pgn: the game so far as ``"pgn"``.
        include_legal_moves: the legal moves' indices as ``"legal_moves"``, padded to 218
            with ``len(uci_moves())``.
        mask_actions: add ``"action_mask"``.

    Example:
        >>> env = ChessEnv(include_fen=True, include_san=True)
        >>> td = await env.rand_step(await env.reset())
        >>> td["next", "turn"]  # black to move
        tensor(False)
    """

    _PGN_START = '[Event "?"]\n[Site "?"]\n[Date "????.??.??"]\n[Round "?"]\n[White "?"]\n[Black "?"]\n[Result "*"]\n\n*'

    def __init__(
        self,
        *,
        stateful: bool = True,
        include_san: bool = False,
        include_fen: bool = False,
        include_pgn: bool = False,
        include_legal_moves: bool = False,
        mask_actions: bool = True,
        device: Any = None,
    ) -> None:
        chess = _chess()
        if not stateful and not (include_fen or include_pgn):
            raise ValueError("ChessEnv(stateful=False) needs include_fen or include_pgn")
        super().__init__(device=device)
        self.stateful = stateful
        self.include_san = include_san
        self.include_fen = include_fen
        self.include_pgn = include_pgn
        self.include_legal_moves = include_legal_moves
        self.mask_actions = mask_actions
        n = len(uci_moves())
        obs = Composite(turn=Categorical(2, shape=(), dtype=torch.bool))
        if include_legal_moves:
            obs["legal_moves"] = Bounded(0, n, shape=(MAX_LEGAL_MOVES,), dtype=torch.int64)
        if mask_actions:
            obs["action_mask"] = Categorical(2, shape=(n,), dtype=torch.bool)
        if include_san:
            obs["san"] = NonTensor(shape=(), example_data="e4")
        if include_fen:
            obs["fen"] = NonTensor(shape=(), example_data=chess.STARTING_FEN)
        if include_pgn:
            obs["pgn"] = NonTensor(shape=(), example_data=self._PGN_START)
        self.observation_spec = obs
        if not stateful:
            self.state_spec = Composite(
                {k: obs[k].clone() for k in ("fen", "pgn") if k in obs.keys()}
            )
        self.action_spec = Categorical(n, shape=(), dtype=torch.int64)
        self.reward_spec = Unbounded((1,))
        self.board = chess.Board()

    # ------------------------------------------------------------------ positions
    def _board_from(self, td: TensorDictBase | None) -> Any:
        chess = _chess()
        if self.stateful or td is None:
            return self.board
        fen = td.get("fen", None) if self.include_fen else None
        if fen is not None:
            return chess.Board(_text(fen))
        pgn = td.get("pgn", None) if self.include_pgn else None
        if pgn is not None:
            game = chess.pgn.read_game(io.StringIO(_text(pgn)))
            return game.end().board()
        raise KeyError("ChessEnv(stateful=False): the input has no 'fen' or 'pgn' entry")

    def legal_indices(self, board: Any) -> torch.Tensor:
        """Indices (into :func:`uci_moves`) of the legal moves of ``board``."""
        index = _move_index()
        return torch.tensor([index[m.uci()] for m in board.legal_moves], dtype=torch.int64)

    def _observe(self, board: Any, san: str, dest: TensorDict) -> TensorDict:
        dest.set("turn", torch.tensor(bool(board.turn)))
        legal = self.legal_indices(board)
        if self.include_legal_moves:
            pad = torch.full((MAX_LEGAL_MOVES,), len(uci_moves()), dtype=torch.int64)
            pad[: legal.numel()] = legal
            dest.set("legal_moves", pad)
        if self.mask_actions:
            mask = torch.zeros(len(uci_moves()), dtype=torch.bool)
            mask[legal] = True
            dest.set("action_mask", mask)
        if self.include_san:
            dest.set_non_tensor("san", san)
        if self.include_fen:
            dest.set_non_tensor("fen", board.fen())
        if self.include_pgn:
            dest.set_non_tensor("pgn", str(_chess().pgn.Game.from_board(board)))
        return dest

    # ------------------------------------------------------------------ env API
    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            torch.manual_seed(seed)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        chess = _chess()
        start = None
        if tensordict is not None and not self.stateful:
            has = (self.include_fen and "fen" in tensordict.keys()) or (
                self.include_pgn and "pgn" in tensordict.keys()
            )
            if has:
                start = self._board_from(tensordict)
                if start.is_game_over(claim_draw=True):
                    raise ValueError(f"ChessEnv cannot reset to a finished game: {start.fen()}")
        board = start if start is not None else chess.Board()
        if self.stateful:
            self.board = board
        san = "<start>"
        if board.move_stack:
            last = board.pop()
            san = board.san(last)
            board.push(last)
        return self._observe(board, san, TensorDict({}, batch_size=()))

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        board = self._board_from(tensordict)
        index = int(tensordict["action"])
        moves = uci_moves()
        if not 0 <= index < len(moves):
            raise SpecViolationError(
                f"ChessEnv: action {index} is outside [0, {len(moves)})", key="action"
            )
        move = _chess().Move.from_uci(moves[index])
        if move not in board.legal_moves:
            raise SpecViolationError(
                f"ChessEnv: action {index} ({moves[index]}) is illegal in {board.fen()}",
                key="action",
            )
        san = board.san(move)
        board.push(move)
        done = board.is_game_over(claim_draw=True)
        reward = 1.0 if board.is_checkmate() else (0.5 if done else 0.0)
        out = self._observe(board, san, TensorDict({}, batch_size=()))
        out.set("reward", torch.tensor([reward]))
        out.set("done", torch.tensor([done]))
        out.set("terminated", torch.tensor([done]))
        return out

    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """A uniformly drawn legal move (of the env's board, or of the input's position)."""
        if tensordict is None:
            tensordict = TensorDict({}, batch_size=())
        mask = tensordict.get("action_mask", None)
        if mask is not None:
            legal = mask.nonzero().squeeze(-1)
        else:
            legal = self.legal_indices(self._board_from(tensordict))
        pick = legal[torch.randint(0, legal.numel(), ())]
        tensordict.set("action", pick.clone())
        return tensordict


def _text(value: Any) -> str:
    data = getattr(value, "data", value)
    if isinstance(data, (list, tuple)):
        data = data[0]
    return str(data)
