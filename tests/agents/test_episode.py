"""Episode storage: padded tensordicts with masks, lossless JSONL, group advantages."""

from __future__ import annotations

import pytest
import torch

from aenv.agents import (
    Episode,
    ErrorInfo,
    Group,
    Turn,
    group_advantages,
    load_episodes,
    save_episodes,
    stack_episodes,
)


def _episode(n: int, tag: str) -> Episode:
    turns = [
        Turn(
            observation={"text": f"{tag} obs {t}", "vec": torch.arange(3, dtype=torch.float32) + t},
            action={
                "action": f"{tag} act {t}",
                "logp": torch.tensor([0.1 * t], dtype=torch.float64),
            },
            reward={"reward": torch.tensor([float(t == n - 1)])},
            terminated=t == n - 1,
            policy_s=0.123456789 * t,
            env_s=1e-7,
        )
        for t in range(n)
    ]
    return Episode(
        prompt={"prompt": f"{tag} prompt", "ids": torch.tensor([1, 2, 3], dtype=torch.int32)},
        turns=turns,
        final_observation={"text": f"{tag} final", "vec": torch.full((3,), 9.0)},
        done_reason="terminated",
        prompt_index=4,
        epoch=1,
        group=7,
        env_index=2,
        started_at=1700000000.123456,
        ended_at=1700000001.654321,
    )


def assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert type(a) is type(b) and a == b


def test_jsonl_round_trip_is_lossless(tmp_path):
    episodes = [_episode(3, "a"), _episode(1, "b")]
    episodes[1].error = ErrorInfo("ValueError", "bad\nthing", "Traceback ...\n  ✓ unicode")
    episodes[1].turns[0].reward["bf16"] = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    path = tmp_path / "episodes.jsonl"
    assert save_episodes(episodes, path) == 2
    back = load_episodes(path)
    assert len(back) == 2
    for a, b in zip(episodes, back):
        assert_same(a.to_dict(), b.to_dict())
        assert_same(a.prompt, b.prompt)
        assert a.error == b.error and a.started_at == b.started_at
        for ta, tb in zip(a.turns, b.turns):
            assert_same(ta.observation, tb.observation)
            assert_same(ta.action, tb.action)
            assert_same(ta.reward, tb.reward)
            assert (ta.policy_s, ta.env_s, ta.terminated) == (tb.policy_s, tb.env_s, tb.terminated)


def test_to_tensordict_pads_with_masks_and_empty_strings():
    ep = _episode(3, "a")
    td = ep.to_tensordict(pad_to=5)
    assert td.batch_size == torch.Size([5])
    assert td["mask"].tolist() == [True, True, True, False, False]
    assert td["text"] == ["a obs 0", "a obs 1", "a obs 2", "", ""]  # never another step's text
    assert td["next", "text"] == ["a obs 1", "a obs 2", "a final", "", ""]
    assert td["action"] == ["a act 0", "a act 1", "a act 2", "", ""]
    assert td["vec"][3:].abs().sum() == 0 and td["vec"][2].tolist() == [2.0, 3.0, 4.0]
    assert td["next", "reward"].squeeze(-1).tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert td["next", "done"].squeeze(-1).tolist() == [False, False, True, False, False]
    assert td["logp"].dtype == torch.float64
    with pytest.raises(ValueError, match="shorter"):
        ep.to_tensordict(pad_to=2)


def test_stack_episodes_of_different_lengths():
    td = stack_episodes([_episode(3, "a"), _episode(1, "b")])
    assert td.batch_size == torch.Size([2, 3])
    assert td["mask"].tolist() == [[True, True, True], [True, False, False]]
    assert td[1]["text"] == ["b obs 0", "", ""]


def test_an_episode_without_turns_pads_to_all_masked():
    ep = Episode(prompt={"prompt": "p"}, final_observation={"text": "p"}, done_reason="timeout")
    td = ep.to_tensordict(pad_to=2)
    assert td["mask"].tolist() == [False, False]
    assert not td["next", "done"].any()
    assert Episode.from_json(ep.to_json()) == ep


def test_group_advantages_zero_mean_and_std():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0], [0.0, 3.0, 0.0, 0.0]])
    adv = group_advantages(rewards)
    assert torch.allclose(adv.mean(1), torch.zeros(3), atol=1e-6)
    assert adv[0].tolist() == [0.5, -0.5, -0.5, 0.5]
    norm = group_advantages(rewards, normalize_std=True)
    assert torch.allclose(norm.mean(1), torch.zeros(3), atol=1e-6)
    assert torch.allclose(norm[[0, 2]].std(1), torch.ones(2), atol=1e-4)
    assert norm[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # a uniform group: zeros, not NaN
    group = Group(0, 0, 0, {}, [_episode(2, "a"), _episode(1, "b"), _episode(3, "c")])
    group.episodes[1].turns[0].reward["reward"] = torch.tensor([0.0])
    assert group.rewards.tolist() == [1.0, 0.0, 1.0]
    assert torch.allclose(group.advantages(), torch.tensor([1 / 3, -2 / 3, 1 / 3]))
    assert torch.equal(group_advantages([group])[0], group.advantages())
