"""The demo behind ``python -m aenv demo``."""

from __future__ import annotations

import argparse
import time

import anyio
import torch
from tensordict import TensorDict


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=1000, help="rollout length")


async def _demo(steps: int) -> list[tuple[str, float]]:
    from aenv import PendulumEnv
    from aenv.testing import CountingEnv

    rows = []
    env = CountingEnv(max_steps=steps + 1)
    t0 = time.perf_counter()
    await env.rollout(steps)
    rows.append(("CountingEnv rollout", steps / (time.perf_counter() - t0)))
    pend = PendulumEnv(seed=0)
    td = await pend.reset(TensorDict({}, [64]))
    t0 = time.perf_counter()
    await pend.rollout(steps // 10, tensordict=td, auto_reset=False)
    rows.append(("PendulumEnv x64 rollout", 64 * (steps // 10) / (time.perf_counter() - t0)))
    return rows


def run_demo(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    rows = anyio.run(_demo, args.steps)
    print(f"{'workload':<28}{'env-steps/s':>14}")
    for name, rate in rows:
        print(f"{name:<28}{rate:>14,.0f}")
    return 0
