"""Tools an LLM calls: the ``Tool`` protocol, a wrapper for plain functions, and the
concurrent dispatch of the calls of one assistant message.

Every way a call can fail (arguments that are not JSON, an unknown tool, arguments the
schema refuses, a tool that raises, a tool past ``per_call_timeout``) comes back as a tool
message with ``is_error=True``: the model sees the failure and may try again, and the env
never raises for it. Only cancellation of the whole dispatch propagates.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import anyio

from aenv.llm._history import Message, ToolCall

__all__ = ["FunctionTool", "ParsedCall", "Tool", "dispatch_tool_calls", "tool", "tool_schema"]

_JSON_TYPES: dict[Any, str] = {
    int: "integer",
    float: "number",
    str: "string",
    bool: "boolean",
    list: "array",
    dict: "object",
    "int": "integer",
    "float": "number",
    "str": "string",
    "bool": "boolean",
    "list": "array",
    "dict": "object",
}
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


@runtime_checkable
class Tool(Protocol):
    """What a tool env needs of a tool: a name, a description, a JSON schema of its
    parameters, and an async call taking the parsed arguments.

    The result may be a ``str`` (used as is) or anything JSON-serialisable.
    """

    name: str
    description: str
    parameters: dict[str, Any]

    async def call(self, arguments: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class ParsedCall:
    """One tool call read out of an assistant message, or why it could not be read."""

    call: ToolCall | None
    error: str | None = None
    raw: str = ""


class FunctionTool:
    """A :class:`Tool` made of a plain or ``async`` function.

    The parameter schema comes from the signature (annotations ``int``, ``float``, ``str``,
    ``bool``, ``list``, ``dict``; parameters without a default are required) unless given.
    A plain function runs in a worker thread, so a blocking tool never stalls the loop.

    Example:
        >>> import asyncio
        >>> from aenv.llm import FunctionTool
        >>> def add(a: int, b: int) -> int:
        ...     "Add two integers."
        ...     return a + b
        >>> t = FunctionTool(add)
        >>> t.name, t.parameters["required"], asyncio.run(t.call({"a": 1, "b": 2}))
        ('add', ['a', 'b'], 3)
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        self.description = description if description is not None else inspect.getdoc(fn) or ""
        self.parameters = parameters if parameters is not None else _schema_from_signature(fn)
        self._is_async = inspect.iscoroutinefunction(fn)

    async def call(self, arguments: dict[str, Any]) -> Any:
        if self._is_async:
            return await self.fn(**arguments)
        # abandon_on_cancel: a timed-out blocking tool cannot be stopped, only left behind
        return await anyio.to_thread.run_sync(
            functools.partial(self.fn, **arguments), abandon_on_cancel=True
        )

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r})"


def tool(
    fn: Callable[..., Any] | None = None, *, name: str | None = None
) -> Any:  # decorator form of FunctionTool
    """Decorator: ``@tool`` turns a function into a :class:`FunctionTool`."""
    if fn is None:
        return functools.partial(tool, name=name)
    return FunctionTool(fn, name=name)


def _schema_from_signature(fn: Callable[..., Any]) -> dict[str, Any]:
    props: dict[str, Any] = {}
    required = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = p.annotation
        prop: dict[str, Any] = {}
        if ann in _JSON_TYPES:
            prop["type"] = _JSON_TYPES[ann]
        props[p.name] = prop
        if p.default is p.empty:
            required.append(p.name)
    return {"type": "object", "properties": props, "required": required}


def tool_schema(t: Tool) -> dict[str, Any]:
    """The OpenAI ``tools`` entry of a tool."""
    return {
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    }


def _check_arguments(schema: Mapping[str, Any], args: Any) -> str | None:
    """The first way ``args`` breaks the (top-level) schema, or None."""
    if not isinstance(args, dict):
        return f"arguments must be a JSON object, got {type(args).__name__}"
    props = schema.get("properties") or {}
    missing = [k for k in schema.get("required") or () if k not in args]
    if missing:
        return f"missing required argument(s) {missing}"
    if schema.get("additionalProperties") is False:
        extra = sorted(set(args) - set(props))
        if extra:
            return f"unexpected argument(s) {extra}"
    for key, value in args.items():
        want = (props.get(key) or {}).get("type")
        if want in _PY_TYPES:
            ok = isinstance(value, _PY_TYPES[want]) and not (
                want in ("integer", "number") and isinstance(value, bool)
            )
            if not ok:
                return f"argument {key!r} must be {want}, got {type(value).__name__}"
    return None


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return repr(result)


async def _run_one(
    parsed: ParsedCall,
    tools: Mapping[str, Tool],
    per_call_timeout: float | None,
    fallback_id: str,
) -> Message:
    call = parsed.call
    if call is None or parsed.error is not None:
        return Message(
            "tool",
            f"could not parse a tool call: {parsed.error}",
            tool_call_id=(call.id if call is not None else "") or fallback_id,
            name=call.name if call is not None else None,
            is_error=True,
        )
    cid = call.id or fallback_id

    def error(text: str) -> Message:
        return Message("tool", text, tool_call_id=cid, name=call.name, is_error=True)

    t = tools.get(call.name)
    if t is None:
        return error(f"unknown tool {call.name!r}; available: {sorted(tools)}")
    try:
        args = json.loads(call.arguments_json)
    except ValueError as exc:
        return error(f"arguments of {call.name!r} are not valid JSON: {exc}")
    problem = _check_arguments(t.parameters, args)
    if problem is not None:
        return error(f"bad arguments for {call.name!r}: {problem}")
    try:
        with anyio.fail_after(per_call_timeout):
            result = await t.call(args)
    except TimeoutError:
        return error(f"tool {call.name!r} timed out after {per_call_timeout} s")
    except Exception as exc:  # the tool's failure is the model's to see, not the env's
        return error(f"tool {call.name!r} raised {type(exc).__name__}: {exc}")
    return Message("tool", _as_text(result), tool_call_id=cid, name=call.name)


async def dispatch_tool_calls(
    calls: Sequence[ParsedCall | ToolCall],
    tools: Mapping[str, Tool] | Sequence[Tool],
    *,
    per_call_timeout: float | None = None,
    id_prefix: str = "call",
    limit: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
) -> list[Message]:
    """Run ``calls`` concurrently; one tool message per call, in the calls' order.

    ``limit`` (e.g. ``limiter.slot``) is entered around each call when given.

    Example:
        >>> import asyncio
        >>> from aenv.llm import FunctionTool, ToolCall, dispatch_tool_calls
        >>> def add(a: int, b: int) -> int:
        ...     return a + b
        >>> calls = [ToolCall.create("add", {"a": 1, "b": 2}), ToolCall.create("nope", {})]
        >>> [(m.content, m.is_error) for m in asyncio.run(dispatch_tool_calls(calls, [FunctionTool(add)]))][0]
        ('3', False)
    """
    table = dict(tools) if isinstance(tools, Mapping) else {t.name: t for t in tools}
    parsed = [c if isinstance(c, ParsedCall) else ParsedCall(c) for c in calls]
    out: list[Message | None] = [None] * len(parsed)

    async def one(i: int, p: ParsedCall) -> None:
        if limit is None:
            out[i] = await _run_one(p, table, per_call_timeout, f"{id_prefix}_{i}")
            return
        async with limit():
            out[i] = await _run_one(p, table, per_call_timeout, f"{id_prefix}_{i}")

    async with anyio.create_task_group() as tg:
        for i, p in enumerate(parsed):
            tg.start_soon(one, i, p)
    return [m for m in out if m is not None]
