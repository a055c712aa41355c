"""Mock envs for latency, faults, dynamic specs and text, for tests and benchmarks."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import anyio
import numpy as np
import torch
from tensordict import NonTensorData, TensorDict, TensorDictBase

from aenv._mdp_tree import NO_DIMS, non_tensor
from aenv.envs._common import EnvBase
from aenv.specs import Binary, Bounded, Composite, NonTensor, Unbounded
from aenv.specs._utils import done_flags
from aenv.testing._counting import CountingEnv

__all__ = [
    "CpuBoundEnv",
    "DynamicSpecEnv",
    "FailingEnv",
    "HangingEnv",
    "LatencyEnv",
    "SyncLatencyEnv",
    "TextEnv",
    "latency_ideal_steps",
]


class LatencyEnv(EnvBase):
    """An env whose step and reset take time, like a remote tool, an LLM call or a simulator.

    Each step awaits a latency: fixed (``latency=``) or drawn from a lognormal with the
    given ``median`` and ``sigma``, from a generator seeded by ``seed`` (and by
    ``set_seed``), so runs are reproducible. Observation ``"observation"`` (float32,
    ``(obs_dim,)``) holds the step count in every entry; reward 1; done after
    ``max_steps`` steps when given. ``"latency"`` in each step's output is the latency used.

    Example:
        >>> env = LatencyEnv(median=0.01, sigma=1.0, seed=0)
        >>> td = await env.rand_step(await env.reset())
    """

    # each step gives done, terminated and truncated, consistent: no completion needed
    _done_outputs_complete = True

    def __init__(
        self,
        latency: float | None = None,
        *,
        median: float | None = None,
        sigma: float = 0.0,
        seed: int = 0,
        obs_dim: int = 4,
        action_dim: int = 1,
        max_steps: int | None = None,
        reset_latency: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if latency is None and median is None:
            latency = 0.0
        self.latency = latency
        self.median = median
        self.sigma = sigma
        self.max_steps = max_steps
        self.reset_latency = reset_latency
        self.obs_dim = obs_dim
        # the generator is made on the first draw: a fixed latency never needs one, and
        # making it is a good part of building one of thousands of envs
        self._seed = seed
        self._rng_made: np.random.Generator | None = None
        # built once per configuration, held by every env of it (see EnvBase._specs_once)
        self._specs_once(_latency_specs, obs_dim, action_dim)
        self.count = 0
        self.steps_taken = 0

    @property
    def _rng(self) -> np.random.Generator:
        rng = self._rng_made
        if rng is None:
            rng = self._rng_made = np.random.default_rng(self._seed)
        return rng

    def draw_latency(self) -> float:
        """The next step's latency (seconds)."""
        if self.latency is not None:
            return float(self.latency)
        assert self.median is not None
        if self.sigma == 0:
            return float(self.median)
        rng = self._rng_made if self._rng_made is not None else self._rng
        return float(self.median * math.exp(self.sigma * rng.standard_normal()))

    def _set_seed(self, seed: int | None) -> None:
        self._rng_made = np.random.default_rng(seed)

    async def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        if self.reset_latency:
            await asyncio.sleep(self.reset_latency)
        return self._reset_out()

    def _reset_out(self) -> TensorDictBase:
        self.count = 0
        # (zeros, and no checks: the entries are known to fit; a pool of thousands of
        # these envs resets them all at once)
        return TensorDict._new_unsafe(
            {"observation": torch.zeros(self.obs_dim), "latency": torch.zeros(1)},
            batch_size=NO_DIMS,
            device=None,
            nested=False,
        )

    def _step_out(self, lat: float) -> TensorDictBase:
        self.count += 1
        self.steps_taken += 1
        truncated = self.max_steps is not None and self.count >= self.max_steps
        # one dict of the step's entries, built at once as the benchmarks' limit builds it
        # (torch.full, not torch.tensor([...]): a few µs less per step, which a pool of
        # thousands of these envs notices)
        return TensorDict(
            {
                "observation": torch.full((self.obs_dim,), float(self.count)),
                "latency": torch.full((1,), lat),
                "reward": torch.ones(1),
                "terminated": torch.zeros(1, dtype=torch.bool),
                "truncated": torch.full((1,), truncated),
                "done": torch.full((1,), truncated),  # never terminates: done is truncated
            },
            batch_size=(),
        )

    async def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        lat = self.draw_latency()
        if lat > 0:
            # asyncio's sleep: the cheapest timer on the loop, as latency envs model waiting
            await asyncio.sleep(lat)
        return self._step_out(lat)


def _latency_specs(env: LatencyEnv, obs_dim: int, action_dim: int) -> None:
    env.observation_spec = Composite(observation=Unbounded((obs_dim,)), latency=Unbounded((1,)))
    env.action_spec = Bounded(-1.0, 1.0, shape=(action_dim,))
    env.reward_spec = Unbounded((1,))
    env.full_done_spec = Composite(done_flags((1,)))


def latency_ideal_steps(
    duration: float,
    *,
    latency: float | None = None,
    median: float | None = None,
    sigma: float = 0.0,
    seed: int = 0,
) -> int:
    """Steps a :class:`LatencyEnv` built with these arguments completes in ``duration`` s
    with zero overhead: its own latencies (same seed) replayed back to back.

    The yardstick for "% of ideal" over a finite run: with heavy-tailed latencies the
    long-run rate ``1 / E[latency]`` misjudges what a short run can reach.
    """
    if latency is not None or median is None or sigma == 0:
        lat = float(latency if latency is not None else (median or 0.0))
        return int(duration / lat + 1e-9) if lat > 0 else 0
    rng = np.random.default_rng(seed)
    steps, elapsed, chunk = 0, 0.0, 256
    while True:
        draws = median * np.exp(sigma * rng.standard_normal(chunk))
        total = np.cumsum(draws) + elapsed
        fit = int(np.searchsorted(total, duration, side="right"))
        steps += fit
        if fit < chunk:
            return steps
        elapsed = float(total[-1])


class SyncLatencyEnv(LatencyEnv):
    """:class:`LatencyEnv` whose step blocks the thread (``time.sleep``), declared ``blocking``.

    Stands for envs doing blocking I/O; on the coroutine backend its steps run in worker
    threads, on the thread backend in the env's own thread.
    """

    blocking = True

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:  # type: ignore[override]
        if self.reset_latency:
            time.sleep(self.reset_latency)
        return self._reset_out()

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        lat = self.draw_latency()
        if lat > 0:
            time.sleep(lat)
        return self._step_out(lat)


class FailingEnv(CountingEnv):
    """A counting env that raises ``exc_type(message)`` on the step after ``fail_after`` steps.

    ``fail_on_reset=True`` makes ``reset`` raise instead. ``fail_after`` counts steps since
    the env was built (resets do not rewind it), so a rebuilt env fails again later.
    """

    def __init__(
        self,
        fail_after: int = 3,
        exc_type: type[BaseException] = RuntimeError,
        message: str = "boom",
        fail_on_reset: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("max_steps", 1_000_000)
        super().__init__(**kwargs)
        self.fail_after = fail_after
        self.exc_type = exc_type
        self.message = message
        self.fail_on_reset = fail_on_reset
        self.total_steps = 0

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        if self.fail_on_reset:
            raise self.exc_type(self.message)
        return super()._reset(tensordict, **kwargs)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self.total_steps >= self.fail_after:
            raise self.exc_type(self.message)
        self.total_steps += 1
        return super()._step(tensordict)


class HangingEnv(CountingEnv):
    """A counting env whose step never returns once ``hang_after`` steps were taken.

    ``mode="async"`` awaits forever (cancellable); ``mode="sync"`` blocks its thread until
    :meth:`release` is called (declared blocking), as a stuck C call would.
    """

    def __init__(self, hang_after: int = 0, mode: str = "async", **kwargs: Any) -> None:
        kwargs.setdefault("max_steps", 1_000_000)
        super().__init__(**kwargs)
        if mode not in ("async", "sync"):
            raise ValueError(f"mode must be 'async' or 'sync', got {mode!r}")
        self.hang_after = hang_after
        self.mode = mode
        self.blocking = mode == "sync"  # type: ignore[misc]
        self._released = threading.Event()
        self.total_steps = 0

    def release(self) -> None:
        """Let a blocked sync step return."""
        self._released.set()

    async def _step(self, tensordict: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        if self.total_steps >= self.hang_after:
            if self.mode == "async":
                await anyio.sleep_forever()
            else:
                await anyio.to_thread.run_sync(self._released.wait)
        self.total_steps += 1
        return CountingEnv._step(self, tensordict)


class DynamicSpecEnv(EnvBase):
    """An env whose observation grows along a dynamic (-1) dim: ``(3, count + 1, 2)``.

    Rollouts need ``return_contiguous=False`` and come back as lazy stacks.
    """

    def __init__(self, max_count: int = 5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observation_spec = Composite(observation=Unbounded(shape=(3, -1, 2)))
        self.action_spec = Bounded(low=-1, high=1, shape=(2,))
        self.full_done_spec = Composite(
            done=Binary(1, shape=(1,), dtype=torch.bool),
            terminated=Binary(1, shape=(1,), dtype=torch.bool),
            truncated=Binary(1, shape=(1,), dtype=torch.bool),
        )
        self.reward_spec = Unbounded((1,), dtype=torch.float)
        self.count = 0
        self.max_count = max_count

    def _obs(self) -> TensorDictBase:
        return TensorDict(
            {"observation": torch.full((3, self.count + 1, 2), float(self.count))}, batch_size=()
        )

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        self.count = 0
        return self._obs().update(self.full_done_spec.zero())

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.count += 1
        done = self.count >= self.max_count
        out = self._obs()
        for key in ("done", "terminated"):
            out[key] = torch.tensor([done])
        out["truncated"] = torch.tensor([False])
        out["reward"] = torch.ones(1)
        return out

    def _set_seed(self, seed: int | None) -> None:
        self.seed = seed


class TextEnv(EnvBase):
    """A text env: the observation is a string history, the action a string.

    Each step appends the action text to ``"history"``; reward is the length of the action;
    done after ``max_steps`` steps or when the action is ``stop_word``.
    """

    def __init__(
        self, max_steps: int = 4, prompt: str = "hello", stop_word: str = "<stop>", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.max_steps = max_steps
        self.prompt = prompt
        self.stop_word = stop_word
        self.observation_spec = Composite(history=NonTensor(shape=(), example_data=prompt))
        self.action_spec = NonTensor(shape=(), example_data="word")
        self.reward_spec = Unbounded((1,))
        self.history = prompt
        self.count = 0

    def _set_seed(self, seed: int | None) -> None:
        self.seed = seed

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        self.history = self.prompt
        self.count = 0
        return TensorDict({"history": non_tensor(self.history)}, batch_size=())

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get("action")
        text = action.data if isinstance(action, NonTensorData) else action
        if not isinstance(text, str):
            text = str(text)
        self.history = f"{self.history} {text}"
        self.count += 1
        done = self.count >= self.max_steps or text == self.stop_word
        return TensorDict(
            {
                "history": non_tensor(self.history),
                "reward": torch.tensor([float(len(text))]),
                "done": torch.tensor([done]),
            },
            batch_size=(),
        )


class CpuBoundEnv(CountingEnv):
    """A counting env whose step keeps the CPU busy for ``work_ms`` milliseconds (holding
    the GIL, like a simulator written in Python): threads cannot overlap its steps,
    processes can."""

    def __init__(self, work_ms: float = 1.0, **kwargs: Any) -> None:
        kwargs.setdefault("max_steps", 1_000_000_000)
        super().__init__(**kwargs)
        self.work_ms = work_ms

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        end = time.perf_counter() + self.work_ms / 1000.0
        x = 0
        while time.perf_counter() < end:
            x += 1
        return super()._step(tensordict)
