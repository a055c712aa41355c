"""LLM envs: text data, chat histories, tools, a code sandbox, limiters and a model client.

- text in TensorDicts: :func:`Text` (a spec), :func:`get_text` / :func:`get_data` (one
  accessor for every path: single env, pool rows, process backends, rollouts);
- :class:`History`: an immutable, append-only chat history;
- :class:`ChatEnv`, :class:`ToolEnv`, :class:`CodeExecEnv` and the text games;
- tools: :class:`Tool`, :class:`FunctionTool`, the parsers, :func:`dispatch_tool_calls`;
- :class:`SubprocessSandbox`: programs in subprocesses with limits and nothing left behind;
- :class:`Limiter`: per-resource caps shared by the envs and pools of a process;
  :class:`SharedLimiter`: a concurrency cap shared by the processes of a machine (a
  process pool's workers);
- :class:`ChatClient`: an async client of OpenAI-compatible chat-completions servers
  (needs ``httpx``: ``pip install aenv[llm]``).
"""

from __future__ import annotations

from typing import Any

from aenv.llm._chat import ChatEnv, Scorer, ToolEnv
from aenv.llm._code_env import CodeExecEnv, extract_code
from aenv.llm._games import GuessNumberEnv, LLMHashingEnv
from aenv.llm._history import ROLES, History, Message, ToolCall, render_plain
from aenv.llm._limiter import Limiter
from aenv.llm._parsers import (
    JSONBlockParser,
    OpenAIToolCallParser,
    ToolCallParser,
    XMLTagParser,
)
from aenv.llm._sandbox import SandboxLimits, SandboxResult, SubprocessSandbox, live_sandboxes
from aenv.llm._shared_limiter import SharedLimiter
from aenv.llm._text import Text, get_data, get_text
from aenv.llm._tools import FunctionTool, ParsedCall, Tool, dispatch_tool_calls, tool, tool_schema

__all__ = [
    "ROLES",
    "ChatClient",
    "ChatEnv",
    "ChatResult",
    "CodeExecEnv",
    "FakeChatServer",
    "FunctionTool",
    "GuessNumberEnv",
    "History",
    "JSONBlockParser",
    "LLMHashingEnv",
    "Limiter",
    "Message",
    "OpenAIToolCallParser",
    "ParsedCall",
    "SandboxLimits",
    "SandboxResult",
    "Scorer",
    "SharedLimiter",
    "SubprocessSandbox",
    "Text",
    "Tool",
    "ToolCall",
    "ToolCallParser",
    "ToolEnv",
    "XMLTagParser",
    "dispatch_tool_calls",
    "extract_code",
    "get_data",
    "get_text",
    "live_sandboxes",
    "render_plain",
    "tool",
    "tool_schema",
]


def __getattr__(name: str) -> Any:
    # the client needs httpx (the ``llm`` extra): imported on first use only
    if name in ("ChatClient", "ChatResult"):
        from aenv.llm import _client

        return getattr(_client, name)
    if name == "FakeChatServer":
        from aenv.llm._fake_server import FakeChatServer

        return FakeChatServer
    raise AttributeError(f"module 'aenv.llm' has no attribute {name!r}")
