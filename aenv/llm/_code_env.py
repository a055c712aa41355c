"""``CodeExecEnv``: the assistant writes a program, the task's tests run it in a sandbox."""

from __future__ import annotations

import re
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv.llm._chat import ChatEnv
from aenv.llm._history import History, Message
from aenv.llm._limiter import Limiter
from aenv.llm._sandbox import SandboxLimits, SandboxResult, SubprocessSandbox
from aenv.specs import Binary, Unbounded

__all__ = ["CodeExecEnv", "extract_code"]

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced code block of ``text`` (```` ```python ```` or bare fences), or the
    whole text when it has none.

    Example:
        >>> from aenv.llm import extract_code
        >>> extract_code("Here:\\n```python\\nprint(1)\\n```")
        'print(1)\\n'
    """
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


class CodeExecEnv(ChatEnv):
    """A coding task: reset takes a ``"prompt"`` and ``"tests"`` (Python code, e.g. asserts)
    from the reset input (or ``prompt=`` / ``tests=``); a step runs the reply's code followed
    by the tests in a :class:`SubprocessSandbox`; reward 1.0 when they pass. The observation
    adds the last run's ``"exit_code"`` and ``"timed_out"`` (zeros after a reset).

    With ``max_turns > 1`` a failing run is shown to the assistant (a user message with the
    tail of stderr) and it may try again.

    The env owns its sandbox: closing the env, cancelling its step, or the pool's
    :meth:`interrupt` (a thread pool giving up a step past its deadline) kills the live
    program with its whole process group.

    Example:
        >>> import asyncio
        >>> from tensordict import NonTensorData
        >>> from aenv.llm import CodeExecEnv
        >>> env = CodeExecEnv(prompt="Write f(x) = 2x.", tests="assert f(2) == 4")
        >>> async def main():
        ...     td = await env.reset()
        ...     td["response"] = NonTensorData("```python\\ndef f(x):\\n    return 2 * x\\n```")
        ...     return (await env.step(td))["next", "reward"].item()
        >>> asyncio.run(main())
        1.0
    """

    reset_inputs = (*ChatEnv.reset_inputs, "tests")

    def __init__(
        self,
        *,
        tests: str | None = None,
        limits: SandboxLimits | None = None,
        limiter: Limiter | str | None = None,
        user: str | int | None = None,
        max_turns: int = 1,
        feedback_chars: int = 2000,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_turns=max_turns, **kwargs)
        self.tests = tests
        self.sandbox = SubprocessSandbox(limits, limiter=limiter, user=user)
        # how the last run went (zeros after a reset)
        self.observation_spec["exit_code"] = Unbounded((1,), dtype=torch.int64)
        self.observation_spec["timed_out"] = Binary(1, dtype=torch.bool)
        self.feedback_chars = feedback_chars
        self.last_result: SandboxResult | None = None
        self._tests = ""

    async def _on_reset(self, tensordict: TensorDictBase | None) -> None:
        from aenv.llm._text import get_text

        if tensordict is not None and "tests" in tensordict.keys():
            self._tests = get_text(tensordict, "tests")
        elif self.tests is not None:
            self._tests = self.tests
        else:
            raise ValueError(
                "CodeExecEnv.reset needs tests: a 'tests' entry (str) in the reset input or "
                "tests= on the env"
            )
        self.last_result = None

    def _observation(self, history: History) -> TensorDict:
        out = super()._observation(history)
        res = getattr(self, "last_result", None)
        code = res.exit_code if res is not None and res.exit_code is not None else 0
        out["exit_code"] = torch.tensor([code], dtype=torch.int64)
        out["timed_out"] = torch.tensor([res is not None and res.timed_out])
        return out

    async def _respond(self, history: History, message: Message) -> tuple[History, float, bool]:
        program = f"{extract_code(message.content)}\n\n{self._tests}\n"
        result = await self.sandbox.run_python(program)
        self.last_result = result
        if result.ok:
            return history, await self._passed_reward(history), True
        if self.turns >= self.max_turns:
            return history, 0.0, True
        why = "timed out" if result.timed_out else f"exited with code {result.exit_code}"
        tail = result.stderr[-self.feedback_chars :]
        return history.add("user", f"The tests failed: the program {why}.\n{tail}"), 0.0, False

    async def _passed_reward(self, history: History) -> float:
        return 1.0 if self.scorer is None else await self.score(history)

    def interrupt(self) -> None:
        """Kill the env's live program now (safe from any thread)."""
        self.sandbox.kill_all()

    async def _aclose(self) -> None:
        await self.sandbox.aclose()
