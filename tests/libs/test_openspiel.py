"""OpenSpielWrapper / OpenSpielEnv over OpenSpiel's games: turns, masks, chance, rewards."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

pyspiel = pytest.importorskip(
    "pyspiel", reason="OpenSpiel is not installed (pip install 'aenv[openspiel]')"
)

from aenv import (  # noqa: E402
    ActionMask,
    AsyncEnvPool,
    MarlGroupMapType,
    SyncEnv,
    TransformedEnv,
    acheck_env_specs,
    check_env_specs,
    get_available_libraries,
)
from aenv.exceptions import SpecViolationError  # noqa: E402
from aenv.libs.openspiel import OpenSpielEnv, OpenSpielWrapper  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _masked(env):
    return TransformedEnv(env, ActionMask(("agents", "action"), ("agents", "action_mask")))


def _highest_legal(td):
    """Every player picks its highest legal action (the ones who do not act are ignored)."""
    mask = td["agents", "action_mask"]
    td["agents", "action"] = (mask.long() * torch.arange(1, mask.shape[-1] + 1)).argmax(-1)
    return td


def _library_loop(game_string: str, seed: int, max_steps: int = 1000) -> list[dict]:
    """OpenSpiel's own loop: chance outcomes drawn with ``rng.choice`` from a generator seeded
    alike (the documented contract), each player its highest legal action. One record per
    decision: every player's observation, who acts, and the rewards of the move."""
    game = pyspiel.load_game(game_string)
    rng = np.random.default_rng(seed)
    state = game.new_initial_state()

    def resolve():
        while state.is_chance_node():
            outcomes, probs = zip(*state.chance_outcomes())
            p = np.asarray(probs)
            state.apply_action(int(rng.choice(np.asarray(outcomes), p=p / p.sum())))

    resolve()
    records = []
    while not state.is_terminal() and len(records) < max_steps:
        seen = {
            "obs": np.array([state.observation_tensor(p) for p in range(game.num_players())]),
            "player": state.current_player(),
        }
        if state.is_simultaneous_node():
            state.apply_actions([max(state.legal_actions(p)) for p in range(game.num_players())])
        else:
            state.apply_action(max(state.legal_actions()))
        seen["rewards"] = np.array(state.rewards())  # the move's reward
        resolve()
        records.append(seen)
    records.append(
        {"obs": np.array([state.observation_tensor(p) for p in range(game.num_players())])}
    )
    return records


def _check_against(ours, records) -> None:
    steps = len(records) - 1
    assert ours.batch_size == (steps,)
    for t, rec in enumerate(records[:-1]):
        obs = torch.as_tensor(rec["obs"], dtype=torch.float32)
        assert torch.equal(ours["agents", "observation"][t].flatten(1), obs), t
        assert ours["current_player"][t].item() == rec["player"], t
        want = torch.as_tensor(rec["rewards"], dtype=torch.float32)
        assert torch.equal(ours["next", "agents", "reward"][t].squeeze(-1), want), t
    last = torch.as_tensor(records[-1]["obs"], dtype=torch.float32)
    assert torch.equal(ours["next", "agents", "observation"][-1].flatten(1), last)


def test_available_libraries_lists_openspiel():
    assert get_available_libraries()["pyspiel"] is True


async def test_tic_tac_toe_turns_and_masks_match_the_library_loop():
    env = OpenSpielEnv("tic_tac_toe")
    await acheck_env_specs(_masked(env))
    assert env.observation_spec["agents", "observation"].shape == (2, 3, 3, 3)
    ours = await env.rollout(20, _highest_legal)
    records = _library_loop("tic_tac_toe", 0)
    _check_against(ours, records)
    assert ours.batch_size == (7,)  # x takes 8, 6, 4 (a diagonal) while o takes 7, 5, 3
    # turns alternate; the mover's mask is its legal squares, the waiting player's all True
    assert ours["current_player"].squeeze(-1).tolist() == [0, 1, 0, 1, 0, 1, 0]
    assert ours["agents", "mask"][:2].tolist() == [[True, False], [False, True]]
    assert ours["agents", "action_mask"][1, 1].sum().item() == 8  # one square taken
    assert ours["agents", "action_mask"][1, 0].all()
    final = ours["next"][-1]
    assert final["done"].item() and final["agents", "terminated"].all()
    assert final["current_player"].item() == pyspiel.PlayerId.TERMINAL
    assert final["agents", "reward"].squeeze(-1).tolist() == [1.0, -1.0]


async def test_chance_nodes_follow_the_seed():
    env = OpenSpielEnv("leduc_poker")
    await env.set_seed(11)
    ours = await env.rollout(50, _highest_legal)
    _check_against(ours, _library_loop("leduc_poker", 11))
    # another seed deals other cards; the same seed, the same ones
    deals = set()
    for seed in (11, 12, 13, 11):
        td = await env.reset(seed=seed)
        deals.add((seed, tuple(td["agents", "observation"].flatten().tolist())))
    assert len({d for s, d in deals if s == 11}) == 1 and len({d for _, d in deals}) > 1
    # OpenSpielEnv(seed=) seeds the first reset alike
    first = await OpenSpielEnv("leduc_poker", seed=11).reset()
    assert torch.equal(first["agents", "observation"], ours["agents", "observation"][0])


async def test_rewards_are_per_step_not_running_returns():
    # 2048 scores each move (and its chance node, the new tile, repeats that reward: a sum
    # of rewards() over the step would count it twice)
    env = OpenSpielEnv("2048", seed=3)
    ours = await env.rollout(60, _highest_legal)
    records = _library_loop("2048", 3, max_steps=60)
    _check_against(ours, records)
    rewards = ours["next", "agents", "reward"].flatten()
    assert rewards.sum().item() == env.state.returns()[0] > 0
    assert (rewards == 0).any() and not bool((rewards.diff() >= 0).all())  # not cumulative
    await env.aclose()


async def test_simultaneous_moves():
    env = OpenSpielEnv("goofspiel", game_kwargs={"num_cards": 3})
    await acheck_env_specs(_masked(env))
    td = await env.reset(seed=0)
    assert td["current_player"].item() == pyspiel.PlayerId.SIMULTANEOUS
    assert td["agents", "mask"].all()  # both players bid
    td["agents", "action"] = torch.tensor([2, 0])  # bid 3 against 1: player 0 wins the prize
    out = (await env.step(td))["next"]
    assert out["agents", "action_mask"][:, 2].tolist() == [False, True]  # card 3 spent by 0
    await env.set_seed(0)  # the prize order is a chance node
    ours = await env.rollout(10, _highest_legal)
    _check_against(ours, _library_loop("goofspiel(num_cards=3)", 0))
    await env.aclose()


@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_in_a_pool_matches_the_library_loop(backend):
    make = functools.partial(OpenSpielEnv, "leduc_poker")
    async with AsyncEnvPool([make] * 2, backend=backend) as pool:
        await pool.set_seed(7)  # env i: seed 7 + i
        td = await pool.reset()
        for i in range(2):
            records = _library_loop("leduc_poker", 7 + i)
            obs = torch.as_tensor(records[0]["obs"], dtype=torch.float32)
            assert torch.equal(td["agents", "observation"][i], obs)
        td = await pool.step(_highest_legal(td))
        for i in range(2):
            records = _library_loop("leduc_poker", 7 + i)
            obs = torch.as_tensor(records[1]["obs"], dtype=torch.float32)
            assert torch.equal(td["next", "agents", "observation"][i], obs)


def test_sync_random_legal_games_with_action_mask():
    env = SyncEnv(_masked(OpenSpielEnv("tic_tac_toe", group_map=None)))
    check_env_specs(env)
    for seed in range(5):
        env.set_seed(seed)
        out = env.rollout(20)  # random legal moves: an illegal one would raise
        assert out["next", "done"][-1].item() and 5 <= out.batch_size[0] <= 9
        assert out["next", "agents", "reward"][-1].sum().item() == 0.0  # zero-sum
    env.close()


async def test_group_per_player_and_a_start_state():
    game = pyspiel.load_game("tic_tac_toe")
    start = game.new_initial_state()
    start.apply_action(4)  # x in the centre: episodes start here, o to move
    env = OpenSpielWrapper(start, group_map=MarlGroupMapType.ONE_GROUP_PER_AGENT)
    masks = [ActionMask((g, "action"), (g, "action_mask")) for g in ("player_0", "player_1")]
    await acheck_env_specs(TransformedEnv(TransformedEnv(env, masks[0]), masks[1]))
    assert set(env.group_map) == {"player_0", "player_1"}
    td = await env.reset()
    assert td["current_player"].item() == 1 and td["player_1", "mask"].tolist() == [True]
    assert not td["player_1", "action_mask"][0, 4].item()
    td["player_0", "action"] = torch.tensor([0])
    td["player_1", "action"] = torch.tensor([8])
    td = (await env.step(td))["next"]
    assert env.state.history() == [4, 8] and td["current_player"].item() == 0
    assert start.history() == [4]  # the start state is cloned, never played on


async def test_bad_inputs_are_named_and_change_nothing():
    env = OpenSpielEnv("tic_tac_toe")
    td = await env.reset()
    td["agents", "action"] = torch.tensor([4, 0])
    td = (await env.step(td))["next"]
    td["agents", "action"] = torch.tensor([0, 4])  # player 1 takes the taken centre
    with pytest.raises(SpecViolationError, match=r"player_1 \(row 1\) is 4, not a legal action"):
        await env.step(td)
    assert env.state.history() == [4]  # nothing was played
    with pytest.raises(TypeError, match=r"pyspiel\.Game or pyspiel\.State, got str"):
        OpenSpielWrapper("tic_tac_toe")
    with pytest.raises(ValueError, match=r"cannot load the game 'nope'.*Unknown game"):
        OpenSpielEnv("nope")
    with pytest.raises(ValueError, match="Unknown parameter 'nope'"):
        OpenSpielEnv("goofspiel", game_kwargs={"nope": 3})
    with pytest.raises(TypeError, match="mean-field"):
        OpenSpielEnv("mfg_crowd_modelling")
    with pytest.raises(ValueError, match="no information-state tensor"):
        OpenSpielEnv("tic_tac_toe", information_state=True)
    poker = OpenSpielEnv("kuhn_poker", information_state=True, seed=0)
    assert poker.observation_spec["agents", "observation"].shape == (2, 11)
    # a finished game: stepping again is refused until a reset
    over = await env.rollout(20, _highest_legal)
    last = over["next"][-1]
    last["agents", "action"] = torch.tensor([0, 0])
    with pytest.raises(SpecViolationError, match="game is over"):
        await env.step(last)
