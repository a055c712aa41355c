"""GRPO-style groups of code-execution episodes: sample G programs per task from a model,
run each against the task's tests in a sandbox, and turn rewards into group advantages.

A deterministic fake model serves the OpenAI chat-completions API on 127.0.0.1; its
samples are sometimes right, sometimes off by one, and sometimes never end (the sandbox
kills those at their wall time, process group and all). A process-wide Limiter keeps at
most 4 sandboxes alive at once, however many episodes run.

Each episode is one coroutine: it asks the model, then sends its step to the pool; the
main coroutine takes results as they stream in (fast programs first).

Run: ``python examples/code_exec_grpo.py``
"""

from __future__ import annotations

import asyncio
import re
import statistics

import anyio
from tensordict import NonTensorData, NonTensorStack, TensorDict

from aenv import AsyncEnvPool
from aenv.llm import ChatClient, CodeExecEnv, FakeChatServer, Limiter, SandboxLimits, get_data

TASKS = [(k, f"Write a Python function f(x) that returns x * {k}.") for k in (2, 3, 5, 7, 11, 13)]
GROUP = 4  # samples per task
SANDBOXES = Limiter.named("sandbox", 4)


def fake_model(request: dict, index: int) -> dict:
    """Deterministic samples: which one depends on the task and the sample's seed."""
    prompt = next(m["content"] for m in request["messages"] if m["role"] == "user")
    k = int(re.search(r"x \* (\d+)", prompt).group(1))
    variant = (k + int(request.get("seed", 0))) % 4
    body = {
        0: f"def f(x):\n    return x * {k}",
        1: f"def f(x):\n    return x * {k} + 1",  # off by one
        2: f"def f(x):\n    return sum(x for _ in range({k}))",  # right, the long way
        3: "def f(x):\n    while True:\n        pass",  # never ends
    }[variant]
    return {"content": f"Here you go:\n```python\n{body}\n```"}


def make_env() -> CodeExecEnv:
    return CodeExecEnv(
        limits=SandboxLimits(wall_time_s=1.0, memory_bytes=1 << 30), limiter=SANDBOXES
    )


async def main() -> None:
    n = len(TASKS) * GROUP
    prompts = [prompt for _, prompt in TASKS for _ in range(GROUP)]
    tests = [f"assert f(3) == {3 * k}\nassert f(0) == 0" for k, _ in TASKS for _ in range(GROUP)]
    async with FakeChatServer(fake_model, latency_s=0.02) as server:
        async with (
            ChatClient(server.url, model="fake") as client,
            AsyncEnvPool([make_env] * n) as pool,
        ):
            td = await pool.reset(
                TensorDict(
                    prompt=NonTensorStack.from_list(prompts),
                    tests=NonTensorStack.from_list(tests),
                    batch_size=[n],
                )
            )

            rewards = [0.0] * n
            in_flight, sent = 0, asyncio.Event()

            async def episode(i: int) -> None:
                nonlocal in_flight
                reply = await client.chat(get_data(td[i], "history"), seed=i % GROUP)
                if not reply.ok:
                    raise RuntimeError(reply.error)
                row = td[i].set("response", NonTensorData(reply.message))
                pool.async_step_send(row.unsqueeze(0), env_index=[i])
                in_flight += 1
                sent.set()

            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(episode, i)
                received = 0
                while received < n:  # results stream in as each sandbox finishes
                    if in_flight == 0:  # the pool waits only for steps already sent
                        sent.clear()
                        await sent.wait()
                        continue
                    out = await pool.async_step_recv(min_get=1)
                    in_flight -= len(out)
                    received += len(out)
                    for i, r in zip(
                        out["env_index"].tolist(), out["next", "reward"].flatten().tolist()
                    ):
                        rewards[i] = r
            results = await pool.get_attr("last_result")
    print(f"{'task':>5} {'rewards':>22} {'advantages':>30}")
    for t, (k, _) in enumerate(TASKS):
        group = rewards[t * GROUP : (t + 1) * GROUP]
        mean, std = statistics.fmean(group), statistics.pstdev(group)
        adv = [(r - mean) / (std + 1e-6) for r in group]
        print(f"x*{k:<3} {group!s:>22} {', '.join(f'{a:+.2f}' for a in adv):>30}")
    timed_out = sum(r.timed_out for r in results)
    print(
        f"{n} episodes: {sum(rewards):.0f} passed, {timed_out} runaway programs killed at their "
        f"wall time; at most {SANDBOXES.peak} sandboxes alive at once"
    )
    assert SANDBOXES.peak <= 4 and timed_out == n // 4 and sum(rewards) == n // 2


if __name__ == "__main__":
    asyncio.run(main())
