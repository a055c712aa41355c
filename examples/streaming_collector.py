"""Collect frames from 64 high-latency envs with a small MLP policy, streaming.

Each env's step awaits a lognormal latency (median 20 ms), like a remote tool or an LLM
call. The async Collector sends each env its next action as soon as it returns, so fast
envs are never held back by slow ones; batches of frames come out in arrival order, each
frame carrying its env index and trajectory id.

Run: ``python examples/streaming_collector.py``
"""

from __future__ import annotations

import asyncio
import time
from functools import partial

import torch
from tensordict.nn import TensorDictModule

from aenv import AsyncEnvPool, Collector
from aenv.testing import LatencyEnv


async def main(n_envs: int = 64, batches: int = 5, frames_per_batch: int = 256) -> None:
    pool = AsyncEnvPool(
        [partial(LatencyEnv, median=0.02, sigma=1.0, seed=i) for i in range(n_envs)]
    )
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    policy = TensorDictModule(mlp, in_keys=["observation"], out_keys=["action"])
    t0 = time.perf_counter()
    async with Collector(
        pool, policy, frames_per_batch=frames_per_batch, total_frames=batches * frames_per_batch
    ) as collector:
        async for batch in collector:
            envs = batch["env_index"].unique().numel()
            print(
                f"batch {tuple(batch.batch_size)} from {envs} envs, "
                f"trajectories {batch['collector', 'traj_ids'].unique().numel()}"
            )
    rate = batches * frames_per_batch / (time.perf_counter() - t0)
    ideal = n_envs / (0.02 * torch.tensor(0.5).exp().item())
    print(f"{rate:,.0f} frames/s, {100 * rate / ideal:.0f}% of the ideal {ideal:,.0f}")


if __name__ == "__main__":
    asyncio.run(main())
