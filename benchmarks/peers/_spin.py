"""CartPole-v1 with a set cost per step: a pure-Python loop of ``iters`` turns before each
step, as a CPU-bound Python env spends its time.

Importable in every venv that has gymnasium (aenv's, TorchRL's), so that every framework
of ``bench_scaling`` steps the same env. :func:`limit_worker` is the limit's worker: a plain
process stepping its envs in a loop, with nothing exchanged per step.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["iters_per_us", "limit_worker", "make", "mlp_policy", "spin"]


def spin(iters: int) -> None:
    """Burn ``iters`` turns of a Python loop."""
    for _ in range(iters):
        pass


def iters_per_us(probe: int = 2_000_000) -> float:
    """Turns of :func:`spin` per microsecond in this process (best of three)."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        spin(probe)
        best = min(best, time.perf_counter() - t)
    return probe / (best * 1e6)


def make(iters: int = 0) -> Any:
    """A CartPole-v1 whose every step first spins ``iters`` turns (plain CartPole at 0)."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    if iters <= 0:
        return env

    class Spin(gym.Wrapper):  # type: ignore[type-arg]
        def step(self, action: Any) -> Any:
            spin(iters)
            return self.env.step(action)

    return Spin(env)


def limit_worker(
    n_envs: int, iters: int, steps: int, seed: int, barrier: Any = None, out: Any = None
) -> tuple[float, float, float]:
    """Step ``n_envs`` spinning CartPoles ``steps`` times each with random actions, resetting
    ended episodes, and nothing else: the start and end times (``time.perf_counter``) and
    the CPU seconds it took (``time.process_time``: the cost on one core, load or not).
    With a ``barrier``, the stepping starts when every worker is ready; with a queue ``out``,
    the result is put there."""
    import numpy as np

    envs = [make(iters) for _ in range(n_envs)]
    for k, env in enumerate(envs):
        env.reset(seed=seed + k)
    actions = np.random.default_rng(seed).integers(0, 2, size=(steps, n_envs)).tolist()
    if barrier is not None:
        barrier.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    for row in actions:
        for env, a in zip(envs, row):
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()
    result = (t0, time.perf_counter(), time.process_time() - c0)
    if out is not None:
        out.put(result)
    return result


def mlp_policy(seed: int = 0) -> Any:
    """The collectors' small policy for CartPole, the same in every venv: an MLP 4 -> 64 ->
    64 -> 2 over ``"observation"`` whose greedy choice is written as a one-hot ``"action"``
    (the action encoding of both aenv's and TorchRL's ``GymEnv``)."""
    import torch
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torch import nn

    class OneHotArgmax(nn.Module):
        def forward(self, logits: torch.Tensor) -> torch.Tensor:
            return nn.functional.one_hot(logits.argmax(-1), logits.shape[-1])

    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
    return TensorDictSequential(
        TensorDictModule(net, in_keys=["observation"], out_keys=["logits"]),
        TensorDictModule(OneHotArgmax(), in_keys=["logits"], out_keys=["action"]),
    )
