"""ChatEnv and ToolEnv: prompts from reset inputs, scorers, parsers, and every tool failure
as an error message (never a raise), calls of one message run concurrently."""

from __future__ import annotations

import json
import time
from functools import partial

import anyio
import pytest
from tensordict import NonTensorData, NonTensorStack, TensorDict

from aenv import AsyncEnvPool
from aenv.llm import (
    ChatEnv,
    FunctionTool,
    JSONBlockParser,
    Limiter,
    Message,
    OpenAIToolCallParser,
    ToolCall,
    ToolEnv,
    XMLTagParser,
    dispatch_tool_calls,
    get_data,
    tool,
    tool_schema,
)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def explode(reason: str) -> str:
    raise RuntimeError(f"kaboom: {reason}")


async def hang() -> str:
    await anyio.sleep_forever()
    return ""


def block(seconds: float) -> str:
    time.sleep(seconds)  # a blocking tool runs in a thread: the loop goes on
    return "slept"


TOOLS = [FunctionTool(add), FunctionTool(explode), FunctionTool(hang), FunctionTool(block)]


def xml(name, args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


async def step(env, td, response):
    td["response"] = NonTensorData(response)
    out = await env.step(td)
    return out, get_data(out["next"], "history")


def test_function_tool_schema():
    t = FunctionTool(add)
    assert tool_schema(t) == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }

    @tool(name="greet")
    def hello(who: str = "you") -> str:
        return f"hi {who}"

    assert hello.name == "greet" and hello.parameters["required"] == []


async def test_chat_env_prompt_from_reset_input_and_async_scorer():
    async def exact(history, answer):
        await anyio.sleep(0)
        return float(history[-1].content.strip() == answer)

    env = ChatEnv(system_prompt="answer tersely", scorer=exact)
    td = await env.reset(TensorDict(prompt=NonTensorData("2+2?"), answer=NonTensorData("4")))
    assert [m.role for m in get_data(td, "history")] == ["system", "user"]
    out, hist = await step(env, td, " 4 ")
    assert out["next", "reward"].item() == 1.0 and out["next", "terminated"].item()
    assert hist[-1] == Message("assistant", " 4 ")
    with pytest.raises(ValueError, match="'prompt' entry"):
        await ChatEnv().reset()
    td = await env.reset(TensorDict(prompt=NonTensorData("x")))
    td["response"] = NonTensorData(3)
    with pytest.raises(TypeError, match="'response' must hold a str"):
        await env.step(td)


@pytest.mark.timeout(60)
async def test_pool_of_chat_envs_takes_one_prompt_per_env():
    scorer = partial(lambda h, answer: float(h[-1].content == answer))
    async with AsyncEnvPool([partial(ChatEnv, scorer=scorer)] * 4) as pool:
        td = await pool.reset(
            TensorDict(
                prompt=NonTensorStack.from_list([f"q{i}" for i in range(4)]),
                answer=NonTensorStack.from_list(["a", "b", "c", "d"]),
                batch_size=[4],
            )
        )
        td["response"] = NonTensorStack.from_list(["a", "x", "c", "x"])
        out = await pool.step(td)
    assert out["next", "reward"].squeeze(-1).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert [h[0].content for h in get_data(out["next"], "history")] == ["q0", "q1", "q2", "q3"]


@pytest.mark.timeout(60)
async def test_every_tool_failure_is_an_error_message():
    env = ToolEnv(TOOLS, prompt="go", per_call_timeout=0.5, max_turns=4)
    td = await env.reset()
    reply = "".join(
        [
            xml("add", {"a": 1, "b": 2}),  # fine
            "<tool_call>{not json}</tool_call>",  # unreadable
            xml("nope", {}),  # unknown tool
            xml("add", {"a": 1}),  # missing argument
            xml("add", {"a": "1", "b": 2}),  # wrong type
            xml("explode", {"reason": "r"}),  # raises
            xml("hang", {}),  # never returns
            xml("block", {"seconds": 0.01}),  # a blocking tool, fine
        ]
    )
    out, hist = await step(env, td, reply)
    results = hist[2:]  # after the prompt and the reply
    assert [m.role for m in results] == ["tool"] * 8
    assert [m.is_error for m in results] == [False, True, True, True, True, True, True, False]
    assert results[0].content == "3" and results[7].content == "slept"
    assert "not valid JSON" in results[1].content or "invalid JSON" in results[1].content
    assert "unknown tool 'nope'" in results[2].content
    assert "missing required argument" in results[3].content
    assert "'a' must be integer" in results[4].content
    assert "RuntimeError: kaboom: r" in results[5].content
    assert "timed out after 0.5 s" in results[6].content
    assert len({m.tool_call_id for m in results}) == 8
    assert not out["next", "done"].item() and out["next", "reward"].item() == 0.0
    out, hist = await step(env, out["next"].clone(), "the answer is 3")
    assert out["next", "terminated"].item()  # no call: the final answer


@pytest.mark.timeout(30)
async def test_calls_of_one_message_run_concurrently():
    arrived = [anyio.Event(), anyio.Event()]

    def waiter(me: int):
        async def meet() -> str:
            arrived[me].set()
            await arrived[1 - me].wait()  # only returns if the other call runs meanwhile
            return f"met {me}"

        return FunctionTool(meet, name=f"meet{me}")

    env = ToolEnv([waiter(0), waiter(1)], prompt="go", per_call_timeout=10)
    td = await env.reset()
    with anyio.fail_after(10):
        _, hist = await step(env, td, xml("meet0", {}) + xml("meet1", {}))
    assert [m.content for m in hist[-2:]] == ["met 0", "met 1"]


async def test_parsers():
    msg = Message(
        "assistant",
        'first\n```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```\n'
        '```tool_call\n[{"name": "f", "arguments": "{\\"x\\": 1}"}, {"oops": 1}]\n```\n'
        "```json\n{broken\n```",
    )
    parsed = JSONBlockParser()(msg)
    assert [p.call.name if p.call else None for p in parsed] == ["add", "f", None, None]
    assert parsed[1].call.arguments == {"x": 1}
    assert "name" in parsed[2].error and "invalid JSON" in parsed[3].error
    cut = XMLTagParser()(Message("assistant", xml("add", {"a": 1, "b": 1}) + '<tool_call>{"na'))
    assert cut[0].call is not None and "never closed" in cut[1].error
    structured = Message(
        "assistant",
        "",
        tool_calls=(ToolCall("add", '{"a": 1, "b": 5}', "x1"), ToolCall("add", "{bad", "x2")),
    )
    parsed = OpenAIToolCallParser()(structured)
    assert parsed[0].error is None and parsed[1].error is not None
    msgs = await dispatch_tool_calls(parsed, TOOLS)
    assert [(m.tool_call_id, m.is_error) for m in msgs] == [("x1", False), ("x2", True)]
    assert msgs[0].content == "6"


async def test_structured_tool_calls_and_truncation():
    env = ToolEnv(TOOLS, prompt="go", max_turns=2)
    td = await env.reset()
    call = Message("assistant", "", tool_calls=(ToolCall.create("add", {"a": 2, "b": 2}, id="k"),))
    td["response"] = NonTensorData(call)
    out = await env.step(td)
    hist = get_data(out["next"], "history")
    assert hist[-1] == Message("tool", "4", tool_call_id="k", name="add")
    out, _ = await step(env, out["next"].clone(), xml("add", {"a": 1, "b": 1}))
    assert out["next", "truncated"].item() and not out["next", "terminated"].item()


async def test_tool_calls_hold_limiter_slots():
    lim = Limiter(1)
    running, peak = 0, 0

    async def slow() -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.01)
        running -= 1
        return "ok"

    env = ToolEnv([FunctionTool(slow)], prompt="go", limiter=lim)
    td = await env.reset()
    _, hist = await step(env, td, xml("slow", {}) * 3)
    assert [m.content for m in hist[-3:]] == ["ok"] * 3 and peak == 1 and lim.active == 0
