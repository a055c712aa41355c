"""GRPO-style groups of code-execution episodes: sample G programs per task from a model,
run each against the task's tests in a sandbox, and turn rewards into group advantages.

A deterministic fake model serves the OpenAI chat-completions API on 127.0.0.1; its
samples are sometimes right, sometimes off by one, and sometimes never end (the sandbox
kills those at their wall time, process group and all). A process-wide Limiter keeps at
most 4 sandboxes alive at once, however many episodes run.

``aenv.agents.run_episodes`` runs each episode as one coroutine (ask the model, step the
env) and streams each group as soon as its episodes have ended.

Run: ``python examples/code_exec_grpo.py``
"""

from __future__ import annotations

import asyncio
import re

from tensordict import NonTensorData

from aenv import AsyncEnvPool
from aenv.agents import run_episodes
from aenv.llm import ChatClient, CodeExecEnv, FakeChatServer, Limiter, SandboxLimits, get_data

TASKS = [(k, f"Write a Python function f(x) that returns x * {k}.") for k in (2, 3, 5, 7, 11, 13)]
GROUP = 4  # samples per task
SANDBOXES = Limiter.named("sandbox", 4)


def make_model():
    """Deterministic samples: the c-th request for a task gets variant (k + c) % 4, so each
    group of 4 holds one of each."""
    seen: dict[int, int] = {}

    def model(request: dict, index: int) -> dict:
        prompt = next(m["content"] for m in request["messages"] if m["role"] == "user")
        k = int(re.search(r"x \* (\d+)", prompt).group(1))
        variant = (k + seen.setdefault(k, 0)) % 4
        seen[k] += 1
        body = {
            0: f"def f(x):\n    return x * {k}",
            1: f"def f(x):\n    return x * {k} + 1",  # off by one
            2: f"def f(x):\n    return sum(x for _ in range({k}))",  # right, the long way
            3: "def f(x):\n    while True:\n        pass",  # never ends
        }[variant]
        return {"content": f"Here you go:\n```python\n{body}\n```"}

    return model


def make_env() -> CodeExecEnv:
    limits = SandboxLimits(wall_time_s=1.0, memory_bytes=1 << 30)
    return CodeExecEnv(limits=limits, limiter=SANDBOXES)


async def main() -> None:
    prompts = [
        {"prompt": p, "tests": f"assert f(3) == {3 * k}\nassert f(0) == 0"} for k, p in TASKS
    ]
    async with FakeChatServer(make_model(), latency_s=0.02) as server:
        async with ChatClient(server.url, model="fake") as client:

            async def policy(td):
                reply = await client.chat(get_data(td, "history"))
                if not reply.ok:
                    raise RuntimeError(reply.error)
                return td.set("response", NonTensorData(reply.message))

            groups = []
            async with AsyncEnvPool([make_env] * 12) as pool:  # 12 envs serve 24 episodes
                async with run_episodes(
                    pool, policy, prompts, group_size=GROUP, emit="groups"
                ) as stream:
                    async for group in stream:  # each group as soon as its 4 episodes ended
                        groups.append(group)
    groups.sort(key=lambda g: g.prompt_index)
    print(f"{'task':>5} {'rewards':>22} {'advantages':>30}")
    for g in groups:
        k = TASKS[g.prompt_index][0]
        rewards = g.rewards.tolist()
        adv = g.advantages(normalize_std=True).tolist()
        print(f"x*{k:<3} {rewards!s:>22} {', '.join(f'{a:+.2f}' for a in adv):>30}")
    n = sum(len(g.episodes) for g in groups)
    passed = sum(ep.total_reward for g in groups for ep in g.episodes)
    killed = sum(bool(ep.final_observation["timed_out"]) for g in groups for ep in g.episodes)
    print(
        f"{n} episodes: {passed:.0f} passed, {killed} runaway programs killed at their wall "
        f"time; at most {SANDBOXES.peak} sandboxes alive at once"
    )
    assert SANDBOXES.peak <= 4 and passed == n // 2 and killed == n // 4


if __name__ == "__main__":
    asyncio.run(main())
