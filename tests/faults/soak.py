"""The soak: a long streamed run with injected faults, sampling what could leak.

:func:`soak` steps ``n`` envs of one backend through ``async_step_send`` /
``async_step_recv`` for ``steps`` env-steps, a fraction ``fault_rate`` of them (seeded)
raising in the env, under ``on_error="observe"`` (each failed env is rebuilt and its step
comes back truncated, the error with it). It samples this process's RSS (plus its worker
processes'), open fds, threads, asyncio tasks and child processes, and returns the figures
the reliability table reports.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from typing import Any

import psutil
import torch
from tensordict import TensorDict

from aenv.pool import AsyncEnvPool

from ._faulty import NORMAL, RAISE, FaultEnv

__all__ = ["soak"]


def _children() -> list[psutil.Process]:
    from aenv.testing._processes import _multiprocessing_helpers

    helpers = _multiprocessing_helpers()
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in helpers]


def _sample(steps: int) -> dict[str, float]:
    kids = _children()
    rss = psutil.Process().memory_info().rss
    for k in kids:
        try:
            rss += k.memory_info().rss
        except psutil.Error:
            pass
    return {
        "steps": steps,
        "rss_mb": rss / 2**20,
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "tasks": len(asyncio.all_tasks()),
        "children": len(kids),
    }


async def soak(
    backend: str, steps: int, fault_rate: float = 0.01, n: int = 8, seed: int = 22
) -> dict[str, Any]:
    rng = random.Random(seed)
    options = {"num_workers": 2} if backend == "process" else {}
    pool = AsyncEnvPool(
        [FaultEnv] * n, backend=backend, on_error="observe", backend_options=options
    )
    injected = recovered = received = sent = 0
    detect: list[float] = []
    sent_at = [0.0] * n
    faulty = [False] * n
    samples = []
    every = max(1, steps // 10)
    t0 = time.perf_counter()

    def send(indices: list[int]) -> None:
        nonlocal sent, injected
        acts = []
        now = time.perf_counter()
        for i in indices:
            fault = rng.random() < fault_rate
            faulty[i] = fault
            injected += fault
            sent_at[i] = now
            acts.append(RAISE if fault else NORMAL)
        td = TensorDict(action=torch.tensor(acts).reshape(-1, 1), batch_size=[len(indices)])
        pool.async_step_send(td, env_index=indices)
        sent += len(indices)

    async with pool:
        await pool.reset()
        send(list(range(n)))
        next_sample = 0
        while received < steps:
            out = await pool.async_step_recv(min_get=1)
            now = time.perf_counter()
            idx = out["env_index"].view(-1).tolist()
            errors = out["next", "error_type"]
            errors = [errors] if isinstance(errors, str) else list(errors)
            for i, err in zip(idx, errors):
                received += 1
                if err:
                    recovered += 1
                    if faulty[i]:
                        detect.append(now - sent_at[i])
            if received >= next_sample:
                samples.append(_sample(received))
                next_sample += every
            if sent < steps:
                send(idx)
        while received < sent:  # the last sends
            out = await pool.async_step_recv(min_get=1)
            received += out.batch_size[0]
        samples.append(_sample(received))
    elapsed = time.perf_counter() - t0
    warm, last = samples[2], samples[-1]  # after 20% (buffers, caches and pools warmed up)
    per = 100_000 / max(1, last["steps"] - warm["steps"])
    growth = {
        k: (last[k] - warm[k]) * per for k in ("rss_mb", "fds", "threads", "tasks", "children")
    }
    return {
        "backend": backend,
        "steps": received,
        "faults_injected": injected,
        "recovered": recovered,
        "lost": sent - received,
        "detect_ms_median": 1000 * sorted(detect)[len(detect) // 2] if detect else None,
        "detect_ms_max": 1000 * max(detect) if detect else None,
        "growth_per_100k": growth,
        "steps_per_s": received / elapsed,
        "samples": samples,
    }


if __name__ == "__main__":  # a longer soak than the suite's, by hand
    import argparse
    import json

    ap = argparse.ArgumentParser(description="one backend's soak, with its samples")
    ap.add_argument("backend", choices=["coroutine", "thread", "process"])
    ap.add_argument("steps", type=int)
    args = ap.parse_args()
    result = asyncio.run(soak(args.backend, args.steps))
    for sample in result.pop("samples"):
        print(sample)
    print(json.dumps(result, indent=1))
