"""The episode runner: groups, budgets, errors, refills, batched policies, the sync facade."""

from __future__ import annotations

import collections
from functools import partial

import anyio
import pytest
import torch

from aenv.agents import (
    BatchedPolicy,
    Episode,
    Group,
    PromptSource,
    collect_episodes,
    run_episodes,
)
from aenv.pool import AsyncEnvPool
from aenv.testing import FailingEnv, GuessTextEnv

pytestmark = pytest.mark.timeout(90)  # includes a process pool's start on a loaded machine

PROMPTS = [{"prompt": f"{a} + {a} =", "target": str(2 * a)} for a in range(5)]


def answer_on_turn(td) -> int:
    """Which turn the test policy answers right on: depends on the prompt and the history."""
    return int(td["target"]) % 3


async def policy(td):
    turns = td["text"].count("\n> ")
    td["action"] = td["target"] if turns >= answer_on_turn(td) else "no idea"
    return td


async def collect(stream):
    episodes, groups = [], []
    async for item in stream:
        (groups if isinstance(item, Group) else episodes).append(item)
    return episodes, groups


async def test_each_prompt_runs_group_size_times(backend):
    pool = AsyncEnvPool([partial(GuessTextEnv, max_steps=4)] * 4, backend=backend)
    async with pool, run_episodes(pool, policy, PROMPTS, group_size=3, epochs=2) as stream:
        episodes, groups = await collect(stream)
    counts = collections.Counter((ep.epoch, ep.prompt["prompt"]) for ep in episodes)
    assert counts == {(e, p["prompt"]): 3 for e in range(2) for p in PROMPTS}
    assert len(groups) == 10 and all(len(g.episodes) == 3 for g in groups)
    for g in groups:
        assert {ep.group for ep in g.episodes} == {g.group}
        assert {ep.prompt_index for ep in g.episodes} == {g.prompt_index}
    for ep in episodes:
        right_on = int(ep.prompt["target"]) % 3
        assert len(ep) == right_on + 1 and ep.done_reason == "terminated"
        assert ep.total_reward == 1.0 and ep.turns[-1].terminated
        assert ep.turns[-1].action == {"action": ep.prompt["target"]}
        assert ep.turns[0].observation["text"] == ep.prompt["prompt"]  # its own prompt
        assert ep.final_observation["text"].endswith("right")
    assert {ep.env_index for ep in episodes} == {0, 1, 2, 3}  # freed envs were refilled


async def test_first_group_arrives_before_the_slowest_episode_ends():
    first_group = anyio.Event()

    async def gated(td):
        if td["prompt"] == "slow":
            await first_group.wait()  # only the fast group's arrival lets it go on
        td["action"] = "x"
        return td

    prompts = [{"prompt": "fast", "target": "x"}, {"prompt": "slow", "target": "x"}]
    pool = AsyncEnvPool([GuessTextEnv] * 4)
    order = []
    async with pool, run_episodes(pool, gated, prompts, group_size=2) as stream:
        async for item in stream:
            if isinstance(item, Group):
                order.append(("group", item.prompt["prompt"]))
                first_group.set()
            else:
                order.append(("episode", item.prompt["prompt"]))
    assert order.index(("group", "fast")) < order.index(("episode", "slow"))
    assert order[-1] == ("group", "slow")


async def test_max_turns_and_timeout_budgets(backend):
    async def stubborn(td):
        if td["prompt"] == "hang" and td["text"].count("\n> ") == 1:
            await anyio.sleep_forever()
        td["action"] = "wrong"
        return td

    prompts = [{"prompt": "loop", "target": "x"}, {"prompt": "hang", "target": "x"}]
    pool = AsyncEnvPool([partial(GuessTextEnv, max_steps=100)], backend=backend)
    async with pool:
        stream = run_episodes(pool, stubborn, prompts, max_turns=3, episode_timeout=0.5)
        async with stream:
            episodes, _ = await collect(stream)
    by_prompt = {ep.prompt["prompt"]: ep for ep in episodes}
    loop, hang = by_prompt["loop"], by_prompt["hang"]
    assert loop.done_reason == "max_turns" and len(loop) == 3 and loop.turns[-1].truncated
    assert hang.done_reason == "timeout" and len(hang) == 1 and hang.turns[-1].truncated
    assert pool._tickets[0] is None  # the env is free


async def test_env_timeout_frees_env_for_the_next_episode(backend):
    async def policy_(td):
        td["action"] = "wrong"
        return td

    prompts = [{"prompt": str(i), "target": "x"} for i in range(3)]
    env = partial(GuessTextEnv, max_steps=100, median=30.0)  # each step takes 30 s
    pool = AsyncEnvPool([env], backend=backend)
    async with pool, run_episodes(pool, policy_, prompts, episode_timeout=0.3) as stream:
        episodes, _ = await collect(stream)
    assert [ep.done_reason for ep in episodes] == ["timeout"] * 3
    assert all(len(ep) == 0 for ep in episodes)


async def test_observed_env_error_ends_the_episode_with_its_traceback(backend):
    async def policy_(td):
        td["action"] = torch.ones(1, dtype=torch.int64)
        return td

    pool = AsyncEnvPool(
        [partial(FailingEnv, fail_after=2, message="kaboom")], backend=backend, on_error="observe"
    )
    async with pool, run_episodes(pool, policy_, [{}], emit="episodes") as stream:
        (ep,) = [item async for item in stream]
    assert len(ep) == 3 and ep.done_reason == "error"
    assert ep.turns[-1].truncated and not ep.turns[1].truncated
    assert ep.error is not None and ep.error.type == "RuntimeError"
    assert ep.error.message == "kaboom" and "_step" in ep.error.traceback


async def test_raised_env_error_is_kept_too():
    async def policy_(td):
        td["action"] = torch.ones(1, dtype=torch.int64)
        return td

    pool = AsyncEnvPool([partial(FailingEnv, fail_after=1, message="kaboom")])
    async with pool, run_episodes(pool, policy_, [{}, {}], emit="episodes") as stream:
        episodes = [item async for item in stream]
    assert [ep.done_reason for ep in episodes] == ["error", "error"]
    assert "kaboom" in episodes[0].error.traceback


async def test_batched_policy_serves_many_episodes_per_call():
    calls = []

    async def generate(td):
        calls.append(td.batch_size[0])
        await anyio.sleep(0.01)
        td["action"] = [str(2 * int(t.split()[0])) for t in td["prompt"]]
        return td

    policy_ = BatchedPolicy(generate, max_batch_size=8, max_delay=0.05)
    pool = AsyncEnvPool([GuessTextEnv] * 8)
    async with pool, run_episodes(pool, policy_, PROMPTS, group_size=4) as stream:
        episodes, _ = await collect(stream)
    assert len(episodes) == 20 and all(ep.total_reward == 1.0 for ep in episodes)
    assert max(calls) > 1 and sum(calls) == 20


def test_collect_episodes_sync_facade():
    pool = AsyncEnvPool([GuessTextEnv] * 3)
    source = PromptSource(PROMPTS[:2], group_size=2)
    out = collect_episodes(pool, policy, source)
    assert len(out.episodes) == 4 and len(out.groups) == 2
    assert all(isinstance(ep, Episode) for ep in out.episodes)
    from aenv.sync import get_runner

    get_runner().run(pool.aclose)


def test_prompt_source_counts_and_checks():
    source = PromptSource(PROMPTS, group_size=2, epochs=3, shuffle=True, seed=0)
    specs = list(source)
    counts = collections.Counter((s.epoch, s.prompt_index) for s in specs)
    assert set(counts.values()) == {2} and len(counts) == 15
    assert len({s.group for s in specs}) == 15
    with pytest.raises(ValueError, match="sequence"):
        PromptSource(iter(PROMPTS), epochs=2)
    with pytest.raises(TypeError, match="prompt 0"):
        list(PromptSource(["not a dict"]))


async def test_leaving_early_cancels_the_rest_and_frees_every_env(backend):
    async def policy_(td):
        td["action"] = td["target"]
        return td

    # the first episode's step is instant; the others' take 30 s in the env
    prompts = [
        dict(p, latencies=torch.tensor([0.0 if i == 0 else 30.0])) for i, p in enumerate(PROMPTS)
    ]
    pool = AsyncEnvPool([partial(GuessTextEnv, max_steps=4)] * 3, backend=backend)
    async with pool:
        async with run_episodes(pool, policy_, prompts) as stream:
            async for item in stream:
                assert isinstance(item, Episode) and item.prompt["prompt"] == "0 + 0 ="
                break
        assert all(t is None for t in pool._tickets)  # the 30 s steps were cancelled
        with anyio.fail_after(10):
            assert (await pool.reset_one(2))["text"] == ""  # usable at once


class _Abort(BaseException):
    """Not an Exception: the runner does not keep it as the episode's error."""


async def test_an_error_escaping_an_episode_stops_every_episode_and_frees_every_env():
    calls = 0

    async def policy_(td):
        nonlocal calls
        calls += 1
        if calls == 3:
            raise _Abort("stop")
        await anyio.sleep(0 if calls < 3 else 30)  # the others wait in the policy
        return "no idea"

    pool = AsyncEnvPool([partial(GuessTextEnv, max_steps=4)] * 3)
    async with pool:
        with anyio.fail_after(10), pytest.raises(BaseExceptionGroup) as info:
            async with run_episodes(pool, policy_, PROMPTS) as stream:
                await collect(stream)
        # the slots' group, inside the stream's own
        inner = info.value.exceptions[0]
        assert isinstance(inner, BaseExceptionGroup)
        assert [type(e) for e in inner.exceptions] == [_Abort]
        assert all(t is None for t in pool._tickets)
        with anyio.fail_after(10):
            assert (await pool.reset_one(1))["text"] == ""  # usable at once


async def test_policy_may_return_its_action():
    """A policy returns the action (the runner writes it) or sets it itself: same episodes."""

    async def returns(td):
        turns = td["text"].count("\n> ")
        return td["target"] if turns >= answer_on_turn(td) else "no idea"

    async def returns_dict(td):
        return {"action": await returns(td)}

    runs = []
    for p in (policy, returns, returns_dict):
        pool = AsyncEnvPool([partial(GuessTextEnv, max_steps=4)] * 3)
        async with pool, run_episodes(pool, p, PROMPTS, emit="episodes") as stream:
            episodes = sorted([ep async for ep in stream], key=lambda ep: ep.prompt_index)
        runs.append([(ep.done_reason, [t.action for t in ep.turns]) for ep in episodes])
    assert runs[0] == runs[1] == runs[2]
    assert runs[0][1] == ("terminated", [{"action": "no idea"}] * 2 + [{"action": "2"}])


async def test_policy_returning_tensor_actions():
    from aenv import MarlGroupMapType
    from aenv.testing import MultiAgentCountingEnv, NestedCountingEnv

    half = torch.full((2, 1), 0.5)
    pool = AsyncEnvPool([NestedCountingEnv] * 2)  # one action, nested: ("agents", "action")
    async with pool, run_episodes(pool, lambda td: half, [{}], emit="episodes") as stream:
        (ep,) = [item async for item in stream]
    assert ep.done_reason == "terminated" and len(ep) == 5
    assert torch.equal(ep.turns[0].action["agents.action"], half)

    env = partial(MultiAgentCountingEnv, 2, MarlGroupMapType.ONE_GROUP_PER_AGENT, max_steps=2)
    one = torch.ones(1, 1, dtype=torch.int64)
    by_key = {("agent_0", "action"): one, ("agent_1", "action"): one}
    pool = AsyncEnvPool([env])
    async with pool, run_episodes(pool, lambda td: by_key, [{}], emit="episodes") as stream:
        (ep,) = [item async for item in stream]
    assert ep.done_reason == "terminated" and ep.turns[0].action["agent_1.action"].item() == 1
    # several action keys and one value: which one is meant? the episode ends in error
    pool = AsyncEnvPool([env])
    async with pool, run_episodes(pool, lambda td: one, [{}], emit="episodes") as stream:
        (ep,) = [item async for item in stream]
    assert ep.done_reason == "error" and ep.error.type == "TypeError"
    assert "dict of actions by key" in ep.error.message


async def test_turn_flags_read_done_first_and_every_flag_without_it():
    """A completed step's done is its terminated or truncated: when it is not set the other
    flags are not read; a step without a done flag has every flag read."""
    pool = AsyncEnvPool([partial(GuessTextEnv, max_steps=2)])
    async with pool:
        stream = run_episodes(pool, policy, PROMPTS)
        no, yes = torch.zeros(1, dtype=torch.bool), torch.ones(1, dtype=torch.bool)
        read: list[str] = []

        def reader(entries):
            def get(key):
                read.append(key)
                return entries.get(key)

            return get

        assert stream._flags(reader({"done": no, "terminated": no, "truncated": no})) == [
            False,
            False,
            False,
        ]
        assert read == ["done"]
        flags = stream._flags(reader({"done": yes, "terminated": no, "truncated": yes}))
        assert flags == [True, False, True]
        read.clear()
        assert stream._flags(reader({"truncated": yes})) == [False, False, True]
        assert sorted(read) == ["done", "done", "terminated", "truncated"]
