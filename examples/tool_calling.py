"""Tool-calling episodes: a model client, a ToolEnv and one coroutine per episode.

A small deterministic fake model serves the OpenAI chat-completions API on 127.0.0.1 (swap
its URL for a vLLM / SGLang / llama.cpp / Ollama server to run a real one). Each episode
asks an arithmetic question; the model answers it with tool calls (two at once on the
first turn, run concurrently by the env), reads the results, and gives its answer, which
the scorer checks. Some questions ask for a tool that does not exist: the env answers
with an error message instead of raising, and the model gives up on them.

Run: ``python examples/tool_calling.py``
"""

from __future__ import annotations

import asyncio
import json
import re

import anyio
from tensordict import NonTensorData, NonTensorStack, TensorDict

from aenv import AsyncEnvPool, step_mdp
from aenv.llm import ChatClient, FakeChatServer, FunctionTool, ToolEnv, get_data

N_EPISODES = 16


# ---------------------------------------------------------------- tools
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


async def add(a: int, b: int) -> int:
    """Add two integers (a remote service: it takes a while)."""
    await asyncio.sleep(0.01)
    return a + b


TOOLS = [FunctionTool(multiply), FunctionTool(add)]


# ---------------------------------------------------------------- the fake model
def fake_model(request: dict, index: int) -> dict:
    """Turn 1: ask for a*b and c+0 at once; turn 2: add them; turn 3: answer."""
    msgs = request["messages"]
    question = next(m["content"] for m in msgs if m["role"] == "user")
    a, b, c = map(int, re.findall(r"\d+", question)[:3])
    results = [m for m in msgs if m["role"] == "tool"]
    if "cube root" in question and not results:
        return _calls(("cube_root", {"x": a}))
    if results and results[-1]["content"].startswith("unknown tool"):
        return {"content": "I cannot answer that."}
    if not results:
        return _calls(("multiply", {"a": a, "b": b}), ("add", {"a": c, "b": 0}))
    if len(results) == 2:
        return _calls(("add", {"a": int(results[0]["content"]), "b": int(results[1]["content"])}))
    return {"content": f"The answer is {results[-1]['content']}."}


def _calls(*calls: tuple[str, dict]) -> dict:
    return {
        "content": "",
        "tool_calls": [
            {"id": f"call_{name}_{k}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}
            for k, (name, args) in enumerate(calls)
        ],
    }  # fmt: skip


def score(history, answer) -> float:
    found = re.search(r"The answer is (-?\d+)", history[-1].content)
    return float(found is not None and int(found.group(1)) == answer)


# ---------------------------------------------------------------- episodes
class StepRouter:
    """Hands each env's streamed step result to the coroutine of its episode."""

    def __init__(self, pool: AsyncEnvPool) -> None:
        self.pool = pool
        self.waiting: dict[int, asyncio.Future] = {}
        self.sent = asyncio.Event()

    async def step(self, i: int, td: TensorDict) -> TensorDict:
        fut = asyncio.get_running_loop().create_future()
        self.waiting[i] = fut
        self.pool.async_step_send(td.unsqueeze(0), env_index=[i])
        self.sent.set()
        return await fut

    async def run(self) -> None:
        while True:
            if not self.waiting:  # nothing in flight: the pool would refuse to wait
                self.sent.clear()
                await self.sent.wait()
            out = await self.pool.async_step_recv(min_get=1)
            for i, row in zip(out["env_index"].tolist(), out.unbind(0)):
                self.waiting.pop(i).set_result(row)


async def episode(i: int, td: TensorDict, client: ChatClient, router: StepRouter) -> dict:
    turns = 0
    while True:
        history = get_data(td, "history")
        reply = await client.chat(history, tools=TOOLS)
        if not reply.ok:
            return {"episode": i, "error": reply.error}
        out = await router.step(i, td.set("response", NonTensorData(reply.message)))
        turns += 1
        # the next input: "next" moved up, state (the task's answer) kept, as in a rollout
        td = step_mdp(out, action_keys=("response",)).exclude("env_index")
        if bool(td["done"]):
            history = get_data(td, "history")
            errors = sum(m.is_error for m in history)
            reward = float(out["next", "reward"])
            return {"episode": i, "turns": turns, "reward": reward, "errors": errors}


async def main() -> None:
    questions, answers = [], []
    for i in range(N_EPISODES):
        a, b, c = 3 + i, 7 + 2 * i, 100 + i
        if i % 4 == 3:
            questions.append(f"What is the cube root of {a * a * a} (then {b}, {c})?")
            answers.append(a)
        else:
            questions.append(f"What is {a} * {b} + {c}?")
            answers.append(a * b + c)
    async with FakeChatServer(fake_model, latency_s=0.02) as server:
        async with ChatClient(server.url, model="fake", max_concurrency=8) as client:
            envs = [lambda: ToolEnv(TOOLS, scorer=score, per_call_timeout=5.0, max_turns=4)]
            async with AsyncEnvPool(envs * N_EPISODES) as pool:
                td = await pool.reset(
                    TensorDict(
                        prompt=NonTensorStack.from_list(questions),
                        answer=NonTensorStack.from_list(answers),
                        batch_size=[N_EPISODES],
                    )
                )
                router = StepRouter(pool)
                results: list[dict] = [{} for _ in range(N_EPISODES)]

                async def run_one(i: int) -> None:
                    results[i] = await episode(i, td[i], client, router)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(router.run)
                    async with anyio.create_task_group() as episodes:
                        for i in range(N_EPISODES):
                            episodes.start_soon(run_one, i)
                    tg.cancel_scope.cancel()  # every episode is done: stop routing
        for r in results[:4]:
            print(r)
        solved = sum(r.get("reward", 0.0) for r in results)
        print(
            f"{N_EPISODES} episodes, {solved:.0f} solved, "
            f"{sum(r.get('errors', 0) for r in results)} tool errors turned into messages, "
            f"{server.completions} model calls, at most {server.max_in_flight} in flight"
        )
        assert solved == N_EPISODES - N_EPISODES // 4  # the cube-root questions fail


if __name__ == "__main__":
    asyncio.run(main())
