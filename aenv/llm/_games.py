"""Built-in text envs: a multi-turn guessing game and a token-level hashing env."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp_tree import non_tensor
from aenv.envs import EnvBase
from aenv.llm._chat import ChatEnv
from aenv.llm._history import History, Message
from aenv.llm._text import Text, get_data, get_text
from aenv.specs import Categorical, Composite, NonTensor, Unbounded

__all__ = ["GuessNumberEnv", "LLMHashingEnv"]

_INT = re.compile(r"-?\d+")


class GuessNumberEnv(ChatEnv):
    """Guess the number: a secret integer in ``[low, high]``; each reply's first integer is a
    guess, answered "higher", "lower" or "correct". Reward 1.0 for the correct guess
    (terminated); ``max_turns`` wrong guesses truncate the episode.

    The secret is drawn from the env's seeded generator at each reset, or taken from the
    reset input's ``"answer"``.

    Example:
        >>> import asyncio
        >>> from tensordict import NonTensorData, TensorDict
        >>> from aenv.llm import GuessNumberEnv, get_data
        >>> env = GuessNumberEnv(low=1, high=10)
        >>> async def main():
        ...     td = await env.reset(TensorDict(answer=NonTensorData(7)))
        ...     td["response"] = NonTensorData("5")
        ...     out = await env.step(td)
        ...     return get_data(out["next"], "history")[-1].content
        >>> asyncio.run(main())
        'higher'
    """

    def __init__(self, low: int = 1, high: int = 100, *, max_turns: int = 8, **kwargs: Any):
        if high < low:
            raise ValueError(f"high ({high}) must be >= low ({low})")
        self.low, self.high = low, high
        kwargs.setdefault(
            "prompt",
            f"I picked an integer between {low} and {high}. Guess it; I will say higher or "
            "lower. Answer with the number only.",
        )
        super().__init__(max_turns=max_turns, **kwargs)
        self.rng = random.Random(0)
        self.secret = low

    def _set_seed(self, seed: int | None) -> None:
        self.rng.seed(seed)

    async def _on_reset(self, tensordict: TensorDictBase | None) -> None:
        if self.answer is not None:
            self.secret = int(self.answer)
        else:
            self.secret = self.rng.randint(self.low, self.high)

    async def _respond(self, history: History, message: Message) -> tuple[History, float, bool]:
        found = _INT.search(message.content)
        if found is None:
            return history.add("user", "Answer with a number."), 0.0, False
        guess = int(found.group())
        if guess == self.secret:
            return history.add("user", "correct"), 1.0, True
        return history.add("user", "higher" if guess < self.secret else "lower"), 0.0, False


def _mix(h: int, token: int) -> int:
    """One step of a 63-bit rolling hash (splitmix64's finaliser over h ^ token)."""
    x = (h ^ (token + 0x9E3779B97F4A7C15)) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 31)) & 0x7FFFFFFFFFFFFFFF


def _byte_encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _byte_decode(tokens: Sequence[int]) -> str:
    return bytes(int(t) % 256 for t in tokens).decode("utf-8", "replace")


class LLMHashingEnv(EnvBase):
    """Token-level text generation whose state is identified by a hash (TorchRL's
    ``LLMHashingEnv``): each action is one token appended to the sequence; ``"hash"`` is a
    rolling hash of the whole sequence, equal for equal sequences whatever the path to them
    (the key a tree search stores nodes under).

    Observations: ``"hash"`` (int64, shape ``(1,)``), ``"tokens"`` (the sequence, a tuple
    of ints) and ``"text"`` (the decoded sequence); action ``"action"``: a token id in
    ``[0, vocab_size)``. Reset takes ``"text"`` from the reset input (or ``prompt=``). The
    default tokenizer is byte-level (``vocab_size=256``); pass ``encode`` / ``decode`` for
    another. Reward 0; the episode ends at ``eos_token`` or after ``max_tokens`` tokens.

    Example:
        >>> import asyncio
        >>> from aenv.llm import LLMHashingEnv, get_text
        >>> env = LLMHashingEnv(prompt="ab")
        >>> async def main():
        ...     td = await env.reset()
        ...     td["action"] = torch.tensor(ord("c"))
        ...     return get_text((await env.step(td))["next"], "text")
        >>> asyncio.run(main())
        'abc'
    """

    def __init__(
        self,
        vocab_size: int = 256,
        *,
        prompt: str = "",
        encode: Callable[[str], list[int]] | None = None,
        decode: Callable[[Sequence[int]], str] | None = None,
        eos_token: int | None = None,
        max_tokens: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.prompt = prompt
        self.encode = encode or _byte_encode
        self.decode = decode or _byte_decode
        self.eos_token = eos_token
        self.max_tokens = max_tokens
        self.observation_spec = Composite(
            hash=Unbounded((1,), dtype=torch.int64), tokens=NonTensor(shape=()), text=Text()
        )
        self.state_spec = Composite(text=Text(), tokens=NonTensor(shape=()))  # reset inputs
        self.action_spec = Categorical(vocab_size, shape=(), dtype=torch.int64)
        self.reward_spec = Unbounded((1,))
        self.add_truncated_keys()
        self.tokens: tuple[int, ...] = ()
        self.hash = 0
        self._generated = 0

    def _set_seed(self, seed: int | None) -> None:
        self.seed = seed

    @staticmethod
    def hash_tokens(tokens: Sequence[int]) -> int:
        """The hash of a whole sequence (what the env reports after reaching it)."""
        h = 0
        for t in tokens:
            h = _mix(h, int(t))
        return h

    def _obs(self) -> TensorDict:
        return TensorDict(
            {
                "hash": torch.tensor([self.hash], dtype=torch.int64),
                "tokens": non_tensor(self.tokens),
                "text": non_tensor(self.decode(self.tokens)),
            },
            batch_size=(),
        )

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        if tensordict is not None and "tokens" in tensordict.keys():
            self.tokens = tuple(int(t) for t in get_data(tensordict, "tokens"))
        elif tensordict is not None and "text" in tensordict.keys():
            self.tokens = tuple(self.encode(get_text(tensordict, "text")))
        else:
            self.tokens = tuple(self.encode(self.prompt))
        self.hash = self.hash_tokens(self.tokens)
        self._generated = 0
        return self._obs()

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        token = int(tensordict.get("action").reshape(-1)[0])
        if not 0 <= token < self.vocab_size:
            raise ValueError(f"'action' must be a token id in [0, {self.vocab_size}), got {token}")
        self.tokens = (*self.tokens, token)
        self.hash = _mix(self.hash, token)
        self._generated += 1
        out = self._obs()
        terminated = self.eos_token is not None and token == self.eos_token
        truncated = (
            not terminated and self.max_tokens is not None and self._generated >= self.max_tokens
        )
        out["terminated"] = torch.tensor([terminated])
        out["truncated"] = torch.tensor([truncated])
        out["done"] = torch.tensor([terminated or truncated])
        return out
