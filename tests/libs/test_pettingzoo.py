"""PettingZooWrapper / PettingZooEnv over PettingZoo's own envs (parallel and AEC)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pettingzoo = pytest.importorskip(
    "pettingzoo", reason="PettingZoo is not installed (pip install 'aenv[pettingzoo]')"
)

from gymnasium import spaces  # noqa: E402
from pettingzoo.classic import tictactoe_v3  # noqa: E402

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
from aenv.libs.pettingzoo import PettingZooEnv, PettingZooWrapper  # noqa: E402

pytestmark = pytest.mark.timeout(120)


class NoisyWalk(pettingzoo.ParallelEnv):
    """Two walkers whose start and steps are drawn from the env's seeded generator: the
    observations show whether seeding reaches PettingZoo."""

    metadata = {"name": "noisy_walk_v0", "render_modes": []}

    def __init__(self) -> None:
        self.possible_agents = ["walker_0", "walker_1"]
        self.agents = list(self.possible_agents)

    def observation_space(self, agent):
        return spaces.Box(-100.0, 100.0, shape=(2,), dtype=np.float32)

    def action_space(self, agent):
        return spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        if seed is not None or not hasattr(self, "rng"):
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.pos = {a: self.rng.uniform(-1, 1, 2).astype(np.float32) for a in self.agents}
        self.t = 0
        return {a: p.copy() for a, p in self.pos.items()}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        for a, act in actions.items():
            noise = self.rng.normal(0, 0.1, 2).astype(np.float32)
            self.pos[a] = self.pos[a] + (int(act) - 1) + noise
        obs = {a: p.copy() for a, p in self.pos.items()}
        rew = {a: -float(abs(p).sum()) for a, p in self.pos.items()}
        term = {a: bool(abs(p).max() > 5) for a, p in self.pos.items()}
        trunc = {a: self.t >= 6 for a in self.agents}
        return obs, rew, term, trunc, {a: {} for a in self.agents}


def _walk_env() -> PettingZooWrapper:
    return PettingZooWrapper(NoisyWalk())


def _walk_policy(td):
    obs = td["agents", "observation"]
    td["agents", "action"] = (obs[..., 0] < 0).long() * 2  # walk back towards 0
    return td


def _walk_library_loop(seed: int, steps: int) -> list[dict]:
    env = NoisyWalk()
    obs, _ = env.reset(seed=seed)
    seen = [obs]
    for _ in range(steps):
        actions = {a: int(o[0] < 0) * 2 for a, o in obs.items()}
        obs, _, term, trunc, _ = env.step(actions)
        seen.append(obs)
        if any(term.values()) or any(trunc.values()):
            break
    return seen


def test_available_libraries_lists_pettingzoo():
    assert get_available_libraries()["pettingzoo"] is True


async def test_parallel_seeded_rollout_matches_library_loop():
    env = PettingZooWrapper(NoisyWalk())
    await acheck_env_specs(env)
    assert env.group_map == {"agents": ["walker_0", "walker_1"]}
    assert env.full_action_spec["agents", "action"].shape == (2,)
    await env.set_seed(4)
    ours = await env.rollout(10, _walk_policy)
    ref = _walk_library_loop(4, 10)
    assert ours.batch_size[0] == len(ref) - 1  # stopped at the same step
    for t, obs in enumerate(ref[:-1]):
        want = torch.as_tensor(np.stack([obs["walker_0"], obs["walker_1"]]))
        assert torch.equal(ours["agents", "observation"][t], want), t
    last = torch.as_tensor(np.stack([ref[-1]["walker_0"], ref[-1]["walker_1"]]))
    assert torch.equal(ours["next", "agents", "observation"][-1], last)
    # another seed, other observations; the same seed again, the same ones
    other = await env.reset(seed=5)
    again = await env.reset(seed=4)
    assert not torch.equal(other["agents", "observation"], again["agents", "observation"])
    assert torch.equal(again["agents", "observation"], ours["agents", "observation"][0])


def test_parallel_rps_sync_and_group_per_agent():
    env = SyncEnv(PettingZooEnv("classic.rps_v2", group_map=MarlGroupMapType.ONE_GROUP_PER_AGENT))
    check_env_specs(env)
    assert set(env.group_map) == {"player_0", "player_1"}
    td = env.reset()
    td["player_0", "action"] = torch.tensor([0])  # rock
    td["player_1", "action"] = torch.tensor([2])  # scissors
    out = env.step(td)
    assert out["next", "player_0", "reward"].item() == 1.0
    assert out["next", "player_1", "reward"].item() == -1.0
    # each player observes the other's last move
    assert out["next", "player_0", "observation"].item() == 2
    assert out["next", "player_1", "observation"].item() == 0
    env.close()


def _first_legal(td):
    mask = td["agents", "action_mask"] & td["agents", "mask"].unsqueeze(-1)
    td["agents", "action"] = mask.long().argmax(-1)
    return td


async def test_aec_tictactoe_matches_library_loop():
    env = PettingZooEnv("classic.tictactoe_v3", parallel=False)
    await acheck_env_specs(env)
    assert env.observation_spec["agents", "action_mask"].dtype == torch.bool
    await env.set_seed(0)
    ours = await env.rollout(20, _first_legal)
    # PettingZoo's own loop: each agent plays its first legal square
    ref_env = tictactoe_v3.env()
    ref_env.reset(seed=0)
    turns = []
    for agent in ref_env.agent_iter():
        obs, _, term, trunc, _ = ref_env.last()
        if term or trunc:
            ref_env.step(None)
            continue
        turns.append((agent, obs))
        ref_env.step(int(np.flatnonzero(obs["action_mask"])[0]))
    assert ours.batch_size[0] == len(turns) == 7  # player_1 wins on its 4th move
    for t, (agent, obs) in enumerate(turns):
        i = env.group_map["agents"].index(agent)
        assert ours["agents", "mask"][t].tolist() == [j == i for j in range(2)]
        assert torch.equal(ours["agents", "observation"][t, i], torch.as_tensor(obs["observation"]))
        assert torch.equal(
            ours["agents", "action_mask"][t, i], torch.as_tensor(obs["action_mask"]).bool()
        )
    final = ours["next"][-1]
    assert final["done"].item() and final["agents", "terminated"].all()
    assert final["agents", "reward"].squeeze(-1).tolist() == [1.0, -1.0]


async def test_aec_action_mask_transform_gives_legal_random_games():
    env = TransformedEnv(
        PettingZooEnv("classic.tictactoe_v3", parallel=False),
        ActionMask(("agents", "action"), ("agents", "action_mask")),
    )
    for seed in range(5):
        await env.set_seed(seed)
        out = await env.rollout(20)  # random, legal moves only: PettingZoo would end the game
        assert out["next", "done"][-1].item() and out.batch_size[0] <= 9
        # an illegal move ends a PettingZoo tictactoe game with -1 for the mover; a legal
        # game's rewards are a win (+1/-1) or a draw (0/0)
        assert out["next", "agents", "reward"][-1].sum().item() == 0.0
    await env.aclose()


@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_in_a_pool_matches_a_single_env(backend):
    fns = [_walk_env] * 2  # a new PettingZoo env per sub-env
    async with AsyncEnvPool(fns, backend=backend) as pool:
        await pool.set_seed(7)  # env i: seed 7 + i
        out = await pool.rollout(5, _walk_policy, break_when_any_done=False)
    assert out.batch_size == (2, 5)
    for i in range(2):
        single = PettingZooWrapper(NoisyWalk())
        await single.set_seed(7 + i)
        ref = await single.rollout(5, _walk_policy, break_when_any_done=False)
        assert torch.equal(out["agents", "observation"][i], ref["agents", "observation"])
        assert torch.equal(out["next", "agents", "reward"][i], ref["next", "agents", "reward"])


async def test_pixels_from_render():
    env = PettingZooEnv(
        "classic.tictactoe_v3", parallel=False, render_mode="rgb_array", from_pixels=True
    )
    td = await env.reset(seed=0)
    assert td["pixels"].dtype == torch.uint8 and td["pixels"].ndim == 3
    td = await env.step(_first_legal(td))
    # a mark was drawn on the board
    assert not torch.equal(td["next", "pixels"], td["pixels"])
    await env.aclose()


def test_bad_inputs_are_named():
    with pytest.raises(TypeError, match="ParallelEnv or AECEnv, got str"):
        PettingZooWrapper("rps")
    with pytest.raises(ValueError, match="unknown agents"):
        PettingZooWrapper(NoisyWalk(), group_map={"a": ["walker_0", "walker_1", "ghost"]})
    with pytest.raises(
        ValueError, match=r"unknown or uninstalled PettingZoo task 'classic\.nope_v0'"
    ):
        PettingZooEnv("classic.nope_v0")
    with pytest.raises(ValueError, match="render_mode='rgb_array'"):
        PettingZooEnv("classic.rps_v2", from_pixels=True)
