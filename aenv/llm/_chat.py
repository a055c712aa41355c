"""``ChatEnv``: an env whose observation is a chat :class:`History` and whose action is the
assistant's reply; and ``ToolEnv``, which runs the tool calls in the replies.

Keys: observation ``"history"`` (a :class:`History`) and ``"prompt"`` (the episode's
prompt, ``str``); action ``"response"`` (a ``str``, or a :class:`Message` such as the model
client returns, with structured tool calls); ``"reward"``, ``"done"``, ``"terminated"``,
``"truncated"``. A reset input may carry ``"prompt"`` (or a whole ``"history"``) and an
``"answer"`` handed to the scorer; without them the env's own ``prompt=`` is used.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp import put
from aenv._mdp_tree import NO_DIMS, non_tensor
from aenv.envs import EnvBase
from aenv.llm._history import History, Message
from aenv.llm._limiter import Limiter
from aenv.llm._parsers import OpenAIToolCallParser, ToolCallParser, XMLTagParser
from aenv.llm._text import Text, get_data, get_text
from aenv.llm._tools import Tool, dispatch_tool_calls
from aenv.specs import Composite, NonTensor, Unbounded

__all__ = ["ChatEnv", "Scorer", "ToolEnv"]

#: ``scorer(history, answer)`` -> reward; may be ``async``. ``answer`` is the reset
#: input's ``"answer"`` (None when there was none).
Scorer = Callable[[History, Any], "float | Awaitable[float]"]


def _entry(td: TensorDictBase | None, key: str) -> Any:
    if td is None or key not in td.keys():
        return None
    return get_data(td, key)


class ChatEnv(EnvBase):
    """A chat episode: reset gives the prompt as a user message, each step appends the
    assistant's reply and scores it with ``scorer``.

    Args:
        prompt: the default prompt (a reset input's ``"prompt"`` overrides it).
        system_prompt: a system message put first in every episode.
        scorer: reward of an answered episode (see :data:`Scorer`); None: reward 0.
        max_turns: assistant turns before the episode is truncated (subclasses that answer
            the assistant, such as :class:`ToolEnv`, use more than one).
        mode: ``"text"`` (the action is ``"response"``: text or a Message) or ``"tokens"``
            (the action is ``"response_tokens"``, token ids the ``tokenizer`` decodes; the
            observation adds ``"prompt_tokens"``, the history rendered by the tokenizer's
            chat template and encoded).
        tokenizer: a ``transformers`` tokenizer (token mode).

    Example:
        >>> import asyncio
        >>> from tensordict import NonTensorData, TensorDict
        >>> from aenv.llm import ChatEnv, get_text
        >>> env = ChatEnv(scorer=lambda h, answer: float(h[-1].content == answer))
        >>> async def main():
        ...     td = await env.reset(TensorDict(prompt=NonTensorData("2+2?"), answer=NonTensorData("4")))
        ...     td["response"] = NonTensorData("4")
        ...     out = await env.step(td)
        ...     return out["next", "reward"].item(), len(get_data(out["next"], "history"))
        >>> from aenv.llm import get_data
        >>> asyncio.run(main())
        (1.0, 2)
    """

    #: reset-input entries the env reads (declared in its state spec)
    reset_inputs: tuple[str, ...] = ("prompt", "history", "answer")

    def __init__(
        self,
        *,
        prompt: str | None = None,
        system_prompt: str | None = None,
        scorer: Scorer | None = None,
        max_turns: int = 1,
        mode: str = "text",
        tokenizer: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if mode not in ("text", "tokens"):
            raise ValueError(f"mode must be 'text' or 'tokens', got {mode!r}")
        if mode == "tokens" and not all(
            hasattr(tokenizer, a) for a in ("apply_chat_template", "encode", "decode")
        ):
            raise TypeError(
                "mode='tokens' needs a tokenizer with apply_chat_template, encode and decode "
                f"(a transformers tokenizer), got {type(tokenizer).__name__}"
            )
        self.prompt = prompt
        self.system_prompt = system_prompt
        self.scorer = scorer
        self.max_turns = max_turns
        self.mode = mode
        self.tokenizer = tokenizer
        obs = Composite(history=NonTensor(shape=()), prompt=Text())
        if mode == "tokens":  # the rendered history's token ids (a tuple of ints)
            obs["prompt_tokens"] = NonTensor(shape=())
        self.observation_spec = obs
        # what a reset may take (a pool hands its sub-envs only their state keys)
        self.state_spec = Composite({key: NonTensor(shape=()) for key in self.reset_inputs})
        if mode == "tokens":
            self.full_action_spec = Composite(response_tokens=NonTensor(shape=()))
        else:
            self.full_action_spec = Composite(response=Text())
        self.reward_spec = Unbounded((1,))
        self.add_truncated_keys()
        self.history = History()
        self.answer: Any = None
        self.turns = 0
        self._prompt_text = ""

    def _set_seed(self, seed: int | None) -> None:
        self.seed = seed

    # ------------------------------------------------------------------ reset
    def _first_history(self, td: TensorDictBase | None) -> tuple[History, str]:
        given = _entry(td, "history")
        if given is not None:
            if not isinstance(given, History):
                raise TypeError(
                    f"{type(self).__name__}.reset: 'history' must hold a History, got "
                    f"{type(given).__name__}"
                )
            first_user = next((m.content for m in given if m.role == "user"), "")
            return given, first_user
        prompt = get_text(td, "prompt") if td is not None and "prompt" in td.keys() else None
        prompt = prompt if prompt is not None else self.prompt
        if prompt is None:
            keys = sorted(map(str, td.keys())) if td is not None else []
            raise ValueError(
                f"{type(self).__name__}.reset needs a prompt: a 'prompt' entry (str) in the "
                f"reset input or prompt= on the env; the reset input had keys {keys}"
            )
        h = History()
        if self.system_prompt:
            h = h.add("system", self.system_prompt)
        return h.add("user", prompt), prompt

    async def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        history, prompt = self._first_history(tensordict)
        self.answer = _entry(tensordict, "answer")
        self.history = history
        self._prompt_text = prompt
        self.turns = 0
        await self._on_reset(tensordict)
        return self._observation(history)

    async def _on_reset(self, tensordict: TensorDictBase | None) -> None:
        """Hook: per-episode set-up of subclasses (after the history is built)."""

    def _observation(self, history: History) -> TensorDict:
        entries: dict[str, Any] = {
            "history": non_tensor(history),
            "prompt": non_tensor(self._prompt_text),
        }
        if self.mode == "tokens":
            text = history.render(self.tokenizer)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            entries["prompt_tokens"] = non_tensor(tuple(int(i) for i in ids))
        # (entries made to fit an unbatched TensorDict: no checks, every step of thousands
        # of episodes)
        return TensorDict._new_unsafe(entries, NO_DIMS, None, nested=False)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ step
    def _reply(self, td: TensorDictBase) -> Message:
        if self.mode == "tokens":
            ids = _entry(td, "response_tokens")
            if isinstance(ids, torch.Tensor):
                ids = ids.tolist()
            if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) for i in ids):
                raise TypeError(
                    f"{type(self).__name__}.step: 'response_tokens' must hold token ids (a "
                    f"sequence of int or a 1-D tensor), got {type(ids).__name__}"
                )
            return Message("assistant", self.tokenizer.decode(ids, skip_special_tokens=True))
        value = _entry(td, "response")
        if isinstance(value, Message):
            if value.role != "assistant":
                raise ValueError(f"'response' must be an assistant message, got {value.role!r}")
            return value
        if isinstance(value, str):
            return Message("assistant", value)
        raise TypeError(
            f"{type(self).__name__}.step: 'response' must hold a str or an assistant Message, "
            f"got {type(value).__name__}"
        )

    async def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        message = self._reply(tensordict)
        self.turns += 1
        history, reward, terminated = await self._respond(self.history.append(message), message)
        truncated = not terminated and self.turns >= self.max_turns
        self.history = history
        out = self._observation(history)
        put(out, "reward", torch.full((1,), float(reward)))
        put(out, "terminated", torch.full((1,), terminated))
        put(out, "truncated", torch.full((1,), truncated))
        put(out, "done", torch.full((1,), terminated or truncated))
        return out

    async def _respond(self, history: History, message: Message) -> tuple[History, float, bool]:
        """What follows the assistant's ``message`` (already last in ``history``): the new
        history, the step's reward, and whether the episode ended. The default scores the
        reply and ends the episode."""
        return history, await self.score(history), True

    async def score(self, history: History) -> float:
        """The scorer's reward for ``history`` (0.0 without a scorer)."""
        if self.scorer is None:
            return 0.0
        value = self.scorer(history, self.answer)
        if inspect.isawaitable(value):
            value = await value
        return float(value)  # type: ignore[arg-type]


class ToolEnv(ChatEnv):
    """A chat env with tools: tool calls in a reply are run (concurrently, each under
    ``per_call_timeout``) and their results appended as tool messages; a reply without tool
    calls is the final answer, scored by ``scorer``.

    Failures of a call (unreadable, unknown tool, bad arguments, raising, too slow) come back
    as tool messages with ``is_error=True``; the env never raises for them.

    Args:
        tools: the tools, by name or as a list.
        parser: reads calls out of a reply's text (default :class:`XMLTagParser`); a reply
            carrying structured ``tool_calls`` is read by :class:`OpenAIToolCallParser`.
        per_call_timeout: seconds a call may take (None: no limit).
        limiter: a :class:`Limiter` (or its name) each call holds a slot of.
        max_turns: assistant turns before the episode is truncated.

    Example:
        >>> import asyncio
        >>> from tensordict import NonTensorData
        >>> from aenv.llm import FunctionTool, ToolEnv, get_data
        >>> def add(a: int, b: int) -> int:
        ...     return a + b
        >>> env = ToolEnv([FunctionTool(add)], prompt="1+2?", max_turns=3)
        >>> async def main():
        ...     td = await env.reset()
        ...     td["response"] = NonTensorData('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
        ...     out = await env.step(td)
        ...     return get_data(out["next"], "history")[-1].content
        >>> asyncio.run(main())
        '3'
    """

    def __init__(
        self,
        tools: Sequence[Tool] | Mapping[str, Tool],
        *,
        parser: ToolCallParser | None = None,
        per_call_timeout: float | None = 30.0,
        limiter: Limiter | str | None = None,
        max_turns: int = 8,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_turns=max_turns, **kwargs)
        self.tools: dict[str, Tool] = (
            dict(tools) if isinstance(tools, Mapping) else {t.name: t for t in tools}
        )
        self.parser: ToolCallParser = parser if parser is not None else XMLTagParser()
        self._structured = OpenAIToolCallParser()
        self.per_call_timeout = per_call_timeout
        self.limiter = Limiter.named(limiter) if isinstance(limiter, str) else limiter

    async def _respond(self, history: History, message: Message) -> tuple[History, float, bool]:
        parsed = self._structured(message) if message.tool_calls else self.parser(message)
        if not parsed:
            return history, await self.score(history), True
        results = await dispatch_tool_calls(
            parsed,
            self.tools,
            per_call_timeout=self.per_call_timeout,
            id_prefix=f"call_{self.turns}",
            limit=self.limiter.slot if self.limiter is not None else None,
        )
        return history.extend(results), 0.0, False
