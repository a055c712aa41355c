"""Built-in envs from the seeds: TicTacToeEnv, ChessEnv, FinancialRegimeEnv (sync and async)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from aenv import (
    AsyncEnvPool,
    FinancialRegimeEnv,
    SerialEnv,
    SpecViolationError,
    SyncEnv,
    TicTacToeEnv,
    acheck_env_specs,
    check_env_specs,
)

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- tic-tac-toe
def _play(env, td, cell):
    td["action"] = torch.tensor(cell)
    return env.step(td)


def test_tictactoe_scripted_game_sync():
    env = SyncEnv(TicTacToeEnv())
    check_env_specs(env)
    td = env.reset()
    assert td["board"].eq(-1).all() and td["mask"].all() and td["turn"].item() == 0
    # player 0 takes the top row (0, 1, 2); player 1 plays 3 and 4
    for cell in (0, 3, 1, 4):
        td = env._step_mdp(_play(env, td, cell))
        assert not td["done"].any()
    # the board is seen by the player to move: player 0 again, its stones are 1
    assert td["board"][0].tolist() == [1, 1, -1] and td["board"][1].tolist() == [0, 0, -1]
    out = _play(env, td, 2)
    assert out["next", "done"].item() and out["next", "terminated"].item()
    assert out["next", "player0", "reward"].item() == 1.0
    assert out["next", "player1", "reward"].item() == 0.0
    assert out["next", "turn"].item() == 1
    with pytest.raises(SpecViolationError, match="occupied"):
        _play(env, env._step_mdp(out), 0)


async def test_tictactoe_batched_random_games_async():
    env = TicTacToeEnv()
    await acheck_env_specs(env, tensordict=TensorDict({}, [8]))
    td = await env.reset(TensorDict({}, [8]))
    r = await env.rollout(9, tensordict=td, auto_reset=False, break_when_all_done=True)
    # every game ends within 9 moves, and random moves are always legal
    assert r["next", "done"].any(-2).all()
    played = r["action"]
    for game in range(8):
        steps = int(r["next", "done"][game].squeeze(-1).int().argmax()) + 1
        cells = played[game, :steps].tolist()
        assert len(set(cells)) == len(cells)  # no cell played twice
    winners = r["next", "player0", "reward"].sum() + r["next", "player1", "reward"].sum()
    assert winners <= 8


async def test_tictactoe_single_player_answers_in_the_same_step():
    env = TicTacToeEnv(single_player=True)
    td = await env.reset(TensorDict({}, [16]))
    td["action"] = torch.full((16,), 4)
    out = await env.step(td)
    # player 1 answered at random: two stones on every board, player 0 to move again
    assert (out["next", "board"] != -1).sum((-1, -2)).eq(2).all()
    assert out["next", "turn"].eq(0).all()
    await acheck_env_specs(env)


# ---------------------------------------------------------------- financial regime
async def test_financial_regime_env_async_and_rewards():
    env = FinancialRegimeEnv(seed=0, window_size=10)
    await acheck_env_specs(env, tensordict=TensorDict({}, [3]))
    td = await env.reset()
    assert td["price_history"].shape == (10,) and not td["current_holdings"].item()
    td["action"] = torch.tensor([1])  # buy at the last price, paying the cost
    td = await env.step(td)
    price = td["price_history"][-1]
    assert td["next", "entry_price"].item() == pytest.approx(price.item())
    assert td["next", "current_holdings"].item()
    nxt = env._step_mdp(td)
    shaping = 0.1 * (nxt["price_history"][-1] - price) / price
    assert td["next", "reward"].item() == pytest.approx((-0.001 * price + shaping).item(), 1e-5)
    nxt["action"] = torch.tensor([2])  # sell: the trade's return minus the cost
    out = await env.step(nxt)
    sell_price = nxt["price_history"][-1]
    expected = (sell_price - price) / price - 0.001 * sell_price
    assert out["next", "reward"].item() == pytest.approx(expected.item(), 1e-5)
    assert not out["next", "current_holdings"].item()


def test_financial_regime_env_truncates_and_is_seeded_sync():
    params = FinancialRegimeEnv.gen_params(max_steps=5, switch_prob=1.0)
    with SerialEnv(2, lambda: FinancialRegimeEnv(params, seed=3)) as env:
        env.set_seed(7)
        r1 = env.rollout(20, break_when_any_done=False)
        env.set_seed(7)
        r2 = env.rollout(20, break_when_any_done=False)
    assert torch.equal(r1["next", "price_history"], r2["next", "price_history"])
    assert r1["next", "truncated"][0].squeeze(-1).nonzero().squeeze(-1).tolist() == [4, 9, 14, 19]
    assert not r1["next", "terminated"].any()
    # switch_prob=1: the regime flips every step
    assert r1["next", "regime"][0, :4].tolist() == [1, 0, 1, 0]
    with pytest.raises(ValueError, match="unknown"):
        FinancialRegimeEnv.gen_params(volatilty=0.3)


# ---------------------------------------------------------------- chess
chess = pytest.importorskip("chess")


def test_chess_scholars_mate_sync():
    from aenv import ChessEnv
    from aenv.envs._chess import uci_moves

    index = {m: i for i, m in enumerate(uci_moves())}
    env = SyncEnv(ChessEnv(include_san=True, include_fen=True, include_legal_moves=True))
    check_env_specs(env)
    td = env.reset()
    assert td["turn"].item() and td["san"] == "<start>"
    assert int(td["action_mask"].sum()) == 20 and int((td["legal_moves"] < 1968).sum()) == 20
    for move in ("e2e4", "e7e5", "f1c4", "b8c6", "d1h5", "g8f6"):
        td["action"] = torch.tensor(index[move])
        td = env._step_mdp(env.step(td))
        assert not td["done"].item()
    td["action"] = torch.tensor(index["h5f7"])
    out = env.step(td)
    assert out["next", "san"] == "Qxf7#"
    assert out["next", "reward"].item() == 1.0 and out["next", "done"].item()
    assert not out["next", "turn"].item()  # black to move, mated
    td = env.reset()
    td["action"] = torch.tensor(index["e2e5"])
    with pytest.raises(SpecViolationError, match="illegal"):
        env.step(td)


async def test_chess_stateless_from_a_fen_async():
    from aenv import ChessEnv

    env = ChessEnv(stateful=False, include_fen=True)
    # the game starts from the given position (queen and king against king)
    fen = "7k/5Q2/6K1/8/8/8/8/8 w - - 0 1"
    td = await env.reset(TensorDict({"fen": fen}, []))
    assert td["fen"] == fen and td["turn"].item()
    r = await env.rollout(30, tensordict=td, auto_reset=False)
    assert all(legal for legal in r["action_mask"].gather(-1, r["action"].unsqueeze(-1)))
    await acheck_env_specs(env)


async def test_chess_in_a_pool_async():
    from aenv import ChessEnv

    async with AsyncEnvPool([ChessEnv] * 2, backend="thread") as pool:
        td = await pool.reset()
        td["action"] = td["action_mask"].float().multinomial(1).squeeze(-1)
        out = await pool.step(td)
        assert out["next", "turn"].tolist() == [False, False]
