"""An immutable, append-only chat history.

A :class:`History` is a tuple of frozen :class:`Message` s; appending gives a new history
and leaves the old one as it was. That is what makes histories safe to keep in TensorDicts:
a rollout stacks the history of every step, and an env handing out its own history cannot
rewrite the earlier steps later (a shared, growing list would).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

__all__ = ["ROLES", "History", "Message", "ToolCall", "render_plain"]

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool asked for by the assistant.

    The arguments are kept as canonical JSON text, so a call can never be changed after
    the fact; :attr:`arguments` parses a fresh dict on each read.

    Example:
        >>> from aenv.llm import ToolCall
        >>> call = ToolCall.create("add", {"a": 1, "b": 2}, id="c1")
        >>> call.arguments, call.arguments_json
        ({'a': 1, 'b': 2}, '{"a": 1, "b": 2}')
    """

    name: str
    arguments_json: str = "{}"
    id: str = ""

    @classmethod
    def create(cls, name: str, arguments: Mapping[str, Any], *, id: str = "") -> ToolCall:
        """A call from a mapping of arguments (which must be JSON-serialisable)."""
        if not isinstance(arguments, Mapping):
            raise TypeError(
                f"tool call arguments must be a mapping, got {type(arguments).__name__}"
            )
        return cls(name=name, arguments_json=json.dumps(dict(arguments), sort_keys=True), id=id)

    @property
    def arguments(self) -> dict[str, Any]:
        """The arguments, parsed into a new dict on each read."""
        return json.loads(self.arguments_json)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI chat-completions form of the call."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments_json},
        }


@dataclass(frozen=True)
class Message:
    """One chat message.

    ``role`` is one of ``"system"``, ``"user"``, ``"assistant"``, ``"tool"``. An assistant
    message may carry ``tool_calls``; a tool message answers one call (``tool_call_id``,
    ``name``) and says with ``is_error`` whether the call failed.

    Example:
        >>> from aenv.llm import Message
        >>> Message("user", "hi").to_dict()
        {'role': 'user', 'content': 'hi'}
    """

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"message role must be one of {ROLES}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise TypeError(f"message content must be a str, got {type(self.content).__name__}")
        if not isinstance(self.tool_calls, tuple):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        for call in self.tool_calls:
            if not isinstance(call, ToolCall):
                raise TypeError(f"tool_calls must hold ToolCall, got {type(call).__name__}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict holding only the fields that are set."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": c.arguments_json} for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if self.is_error:
            out["is_error"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        """The inverse of :meth:`to_dict`; also reads OpenAI's ``tool_calls`` form."""
        calls = []
        for c in data.get("tool_calls") or ():
            fn = c.get("function", c)
            args = fn.get("arguments", "{}")
            if not isinstance(args, str):
                args = json.dumps(args, sort_keys=True)
            calls.append(ToolCall(name=fn["name"], arguments_json=args, id=c.get("id") or ""))
        return cls(
            role=data["role"],
            content=data.get("content") or "",
            tool_calls=tuple(calls),
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
            is_error=bool(data.get("is_error", False)),
        )

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI chat-completions form (``is_error`` has no field there)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            out["name"] = self.name
        return out


@dataclass(frozen=True)
class History(Sequence[Message]):
    """An immutable, append-only sequence of :class:`Message` s.

    Example:
        >>> from aenv.llm import History
        >>> h0 = History().add("system", "be brief").add("user", "2 + 2?")
        >>> h1 = h0.add("assistant", "4")
        >>> len(h0), len(h1), h1[-1].content
        (2, 3, '4')
        >>> History.from_json(h1.to_json()) == h1
        True
    """

    messages: tuple[Message, ...] = field(default=())

    def __post_init__(self) -> None:
        msgs = tuple(self.messages)
        for m in msgs:
            if not isinstance(m, Message):
                raise TypeError(f"a History holds Message objects, got {type(m).__name__}")
        object.__setattr__(self, "messages", msgs)

    # -------------------------------------------------------------- sequence protocol
    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> History: ...

    def __getitem__(self, index: int | slice) -> Message | History:
        if isinstance(index, slice):
            return History(self.messages[index])
        return self.messages[index]

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    def __repr__(self) -> str:
        roles = ", ".join(m.role for m in self.messages[-4:])
        more = "..., " if len(self.messages) > 4 else ""
        return f"History({len(self.messages)} messages: {more}{roles})"

    # -------------------------------------------------------------- growing
    def append(self, message: Message) -> History:
        """A new history with ``message`` at the end (this one is unchanged)."""
        if not isinstance(message, Message):
            raise TypeError(f"append takes a Message, got {type(message).__name__}")
        return History((*self.messages, message))

    def extend(self, messages: Iterable[Message]) -> History:
        """A new history with ``messages`` at the end."""
        return History((*self.messages, *messages))

    def add(self, role: str, content: str = "", **fields: Any) -> History:
        """``append(Message(role, content, **fields))``."""
        return self.append(Message(role, content, **fields))

    @property
    def last(self) -> Message | None:
        """The last message, or None for an empty history."""
        return self.messages[-1] if self.messages else None

    # -------------------------------------------------------------- serialisation
    def to_list(self) -> list[dict[str, Any]]:
        """Plain dicts, one per message (see :meth:`Message.to_dict`)."""
        return [m.to_dict() for m in self.messages]

    def to_json(self) -> str:
        """JSON text that :meth:`from_json` reads back into an equal history."""
        return json.dumps(self.to_list())

    @classmethod
    def from_list(cls, data: Iterable[Mapping[str, Any]]) -> History:
        """A history from dicts (aenv's or OpenAI's message form)."""
        return cls(tuple(Message.from_dict(d) for d in data))

    @classmethod
    def from_json(cls, text: str) -> History:
        """The inverse of :meth:`to_json`."""
        data = json.loads(text)
        if not isinstance(data, list):
            raise ValueError(f"a History's JSON is a list of messages, got {type(data).__name__}")
        return cls.from_list(data)

    def to_openai(self) -> list[dict[str, Any]]:
        """The ``messages`` list of an OpenAI chat-completions request."""
        return [m.to_openai() for m in self.messages]

    # -------------------------------------------------------------- rendering
    def render(self, tokenizer: Any = None, *, add_generation_prompt: bool = True) -> str:
        """The history as one prompt string.

        With ``tokenizer`` (a ``transformers`` tokenizer or anything with
        ``apply_chat_template``), its chat template renders it; without, the plain template
        of :func:`render_plain`.
        """
        if tokenizer is None:
            return render_plain(self, add_generation_prompt=add_generation_prompt)
        apply = getattr(tokenizer, "apply_chat_template", None)
        if apply is None:
            raise TypeError(
                f"{type(tokenizer).__name__} has no apply_chat_template: pass a transformers "
                "tokenizer, or None for the plain template"
            )
        return apply(self.to_openai(), tokenize=False, add_generation_prompt=add_generation_prompt)


def render_plain(history: History, *, add_generation_prompt: bool = True) -> str:
    """A model-agnostic chat template: ``<|role|>`` headers, tool calls as JSON in
    ``<tool_call>`` tags, and an open ``<|assistant|>`` header when a reply is wanted.

    Example:
        >>> from aenv.llm import History, render_plain
        >>> print(render_plain(History().add("user", "hi")))
        <|user|>
        hi
        <|assistant|>
        <BLANKLINE>
    """
    parts = []
    for m in history:
        header = f"<|{m.role}|>" if m.role != "tool" else f"<|tool|> {m.name or ''}".rstrip()
        if m.is_error:
            header += " (error)"
        body = m.content
        for c in m.tool_calls:
            call = json.dumps({"name": c.name, "arguments": c.arguments})
            body += f"\n<tool_call>{call}</tool_call>"
        parts.append(f"{header}\n{body}\n")
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)
