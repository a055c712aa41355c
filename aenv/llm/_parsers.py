"""Reading tool calls out of an assistant message.

Three formats, one interface (``parser(message) -> list[ParsedCall]``):

- :class:`JSONBlockParser`: fenced blocks (```` ```json ```` or ```` ```tool_call ````) holding
  ``{"name": ..., "arguments": {...}}`` or a list of such objects;
- :class:`XMLTagParser`: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  (the Hermes / Qwen form; the tag is configurable);
- :class:`OpenAIToolCallParser`: the structured ``tool_calls`` of an OpenAI-style message.

A call whose text cannot be read comes back as a :class:`ParsedCall` with an ``error``, so
the env can answer it with an error message instead of raising.
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

from aenv.llm._history import Message, ToolCall
from aenv.llm._tools import ParsedCall

__all__ = ["JSONBlockParser", "OpenAIToolCallParser", "ToolCallParser", "XMLTagParser"]


class ToolCallParser(Protocol):
    """Reads the tool calls of one assistant message."""

    def __call__(self, message: Message) -> list[ParsedCall]: ...


def _from_json_text(text: str, raw: str, index: int) -> list[ParsedCall]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        return [ParsedCall(None, f"invalid JSON ({exc}) in {raw[:200]!r}", raw)]
    items = data if isinstance(data, list) else [data]
    out = []
    for k, item in enumerate(items):
        out.append(_from_object(item, raw, f"call_{index}_{k}"))
    return out


def _from_object(item: Any, raw: str, default_id: str) -> ParsedCall:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return ParsedCall(None, f'a tool call is an object with a "name": {raw[:200]!r}', raw)
    args = item.get("arguments", item.get("parameters", {}))
    if isinstance(args, str):  # arguments given as JSON text, as OpenAI does
        args_json = args
    else:
        args_json = json.dumps(args, sort_keys=True)
    return ParsedCall(ToolCall(item["name"], args_json, str(item.get("id") or default_id)), raw=raw)


class JSONBlockParser:
    """Tool calls in fenced code blocks tagged ``json`` or ``tool_call`` (configurable).

    Example:
        >>> from aenv.llm import JSONBlockParser, Message
        >>> text = 'Let me add.\\n```json\\n{"name": "add", "arguments": {"a": 1}}\\n```'
        >>> [p.call.name for p in JSONBlockParser()(Message("assistant", text))]
        ['add']
    """

    def __init__(self, tags: tuple[str, ...] = ("json", "tool_call")) -> None:
        alts = "|".join(re.escape(t) for t in tags)
        self._pattern = re.compile(rf"```(?:{alts})[ \t]*\n(.*?)```", re.DOTALL)

    def __call__(self, message: Message) -> list[ParsedCall]:
        out: list[ParsedCall] = []
        for i, m in enumerate(self._pattern.finditer(message.content)):
            out.extend(_from_json_text(m.group(1), m.group(0), i))
        return out


class XMLTagParser:
    """Tool calls in ``<tool_call>...</tool_call>`` tags (the tag name is configurable).

    Example:
        >>> from aenv.llm import Message, XMLTagParser
        >>> text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
        >>> [p.call.name for p in XMLTagParser()(Message("assistant", text))]
        ['f']
    """

    def __init__(self, tag: str = "tool_call") -> None:
        t = re.escape(tag)
        self._pattern = re.compile(rf"<{t}>(.*?)</{t}>", re.DOTALL)
        self._unclosed = re.compile(rf"<{t}>(?!.*</{t}>)", re.DOTALL)
        self.tag = tag

    def __call__(self, message: Message) -> list[ParsedCall]:
        out: list[ParsedCall] = []
        text = message.content
        for i, m in enumerate(self._pattern.finditer(text)):
            out.extend(_from_json_text(m.group(1).strip(), m.group(0), i))
        tail = self._unclosed.search(text)
        if tail is not None:  # a call cut off (e.g. by max_tokens): tell the model
            raw = text[tail.start() :]
            out.append(ParsedCall(None, f"<{self.tag}> is never closed: {raw[:200]!r}", raw))
        return out


class OpenAIToolCallParser:
    """The structured ``tool_calls`` of the message (as an OpenAI-compatible server returns
    them); arguments that are not a JSON object come back as errors.

    Example:
        >>> from aenv.llm import Message, OpenAIToolCallParser, ToolCall
        >>> msg = Message("assistant", "", tool_calls=(ToolCall("f", '{"x": 1}', "c0"),))
        >>> [p.call.arguments for p in OpenAIToolCallParser()(msg)]
        [{'x': 1}]
    """

    def __call__(self, message: Message) -> list[ParsedCall]:
        out = []
        for call in message.tool_calls:
            try:
                args = json.loads(call.arguments_json)
            except ValueError as exc:
                out.append(
                    ParsedCall(
                        call,
                        f"arguments of {call.name!r} are not valid JSON ({exc}): "
                        f"{call.arguments_json[:200]!r}",
                        call.arguments_json,
                    )
                )
                continue
            if not isinstance(args, dict):
                out.append(ParsedCall(call, f"arguments of {call.name!r} are not an object"))
                continue
            out.append(ParsedCall(call, raw=call.arguments_json))
        return out
