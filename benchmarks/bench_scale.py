"""How aenv's pools scale: envs per process, latency spread, startup, memory, per-step cost.

What it compares (all aenv, one run):

* throughput vs number of coroutine envs (16 .. 10,000 LatencyEnvs, fixed 50 ms latency),
  streaming send/recv, as env-steps/s and % of the ideal ``N / latency``;
* throughput vs latency spread (256 envs, lognormal median 20 ms, sigma 0 .. 2): streaming
  vs lockstep (``await pool.step`` over the whole batch), as % of the ideal: the steps the
  same envs would complete in the same time with zero overhead, their own seeded latencies
  replayed back to back (``aenv.testing.latency_ideal_steps``; over a short run of
  heavy-tailed latencies, ``N / E[latency]`` would misjudge what is reachable);
* startup time to the first reset for each backend;
* 1,024 to 16,384 coroutine envs in one process: build and reset CPU time per env, memory
  per env (RSS growth) and GC-tracked objects per env, each size in a fresh interpreter;
* cost growth: framework time per env-step with zero-latency envs, per backend and N.

Run: ``python benchmarks/bench_scale.py [--quick]``
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import torch  # noqa: E402

from aenv.testing import latency_ideal_steps  # noqa: E402
from benchmarks._common import expected_latency, print_table  # noqa: E402


def _backends() -> list[str]:
    from aenv.pool import BACKENDS

    return [b for b in ("coroutine", "thread", "process") if b in BACKENDS]


def _make_pool(n: int, backend: str = "coroutine", **env_kwargs: Any) -> Any:
    from aenv.pool import AsyncEnvPool
    from aenv.testing import LatencyEnv

    fns = [partial(LatencyEnv, seed=i, **env_kwargs) for i in range(n)]
    return AsyncEnvPool(fns, backend=backend)


async def stream_rate(pool: Any, duration: float) -> float:
    """Env-steps/s of a send/recv loop that re-sends to each env as soon as it returns."""
    n = pool.num_envs
    td = await pool.reset()
    actions = pool.rand_action(td)
    pool.async_step_send(actions, env_index=list(range(n)))
    in_flight, count = n, 0
    t0 = time.perf_counter()
    deadline = t0 + duration
    while True:
        out = await pool.async_step_recv(min_get=1)
        idx = out.get("env_index").reshape(-1)
        in_flight -= idx.numel()
        count += idx.numel()
        if time.perf_counter() >= deadline:
            break
        pool.async_step_send(actions[idx], env_index=idx)
        in_flight += idx.numel()
    elapsed = time.perf_counter() - t0
    while in_flight:  # drain, so the pool closes with nothing in flight
        in_flight -= (await pool.async_step_recv(min_get=1)).get("env_index").numel()
    return count / elapsed


async def lockstep_rate(pool: Any, duration: float) -> float:
    """Env-steps/s of whole-batch ``await pool.step`` (every step waits for the slowest env)."""
    td = await pool.reset()
    actions = pool.rand_action(td)
    count = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < duration:
        await pool.step(actions.clone())
        count += pool.num_envs
    return count / (time.perf_counter() - t0)


async def _with_pool(factory: Any, fn: Any, *args: Any) -> Any:
    gc.collect()  # garbage left by an earlier run (10,000 envs) must not bill this one
    pool = factory()
    try:
        return await fn(pool, *args)
    finally:
        await pool.aclose()


def scale_rows(quick: bool) -> list[dict[str, Any]]:
    sizes = [16, 64, 256] if quick else [16, 64, 256, 1024, 4096, 10_000]
    latency, duration = 0.05, (0.5 if quick else 3.0)
    rows = []
    for n in sizes:
        rate = anyio.run(_with_pool, partial(_make_pool, n, latency=latency), stream_rate, duration)
        ideal = n / latency
        rows.append(
            {"envs": n, "env-steps/s": rate, "ideal": ideal, "% of ideal": 100 * rate / ideal}
        )
    return rows


def spread_rows(quick: bool) -> list[dict[str, Any]]:
    n, median = (64, 0.02) if quick else (256, 0.02)
    sigmas = [0.0, 1.0, 2.0] if quick else [0.0, 0.5, 1.0, 1.5, 2.0]
    duration = 0.5 if quick else 4.0
    rows = []
    for sigma in sigmas:
        make = partial(_make_pool, n, median=median, sigma=sigma)
        streaming = anyio.run(_with_pool, make, stream_rate, duration)
        lockstep = anyio.run(_with_pool, make, lockstep_rate, duration)
        span = duration  # both runs stop at the first result past ``duration``
        ideal = (
            sum(latency_ideal_steps(span, median=median, sigma=sigma, seed=i) for i in range(n))
            / span
        )
        rows.append(
            {
                "sigma": sigma,
                "ideal env-steps/s": ideal,
                "N / E[latency]": n / expected_latency(median, sigma),
                "streaming env-steps/s": streaming,
                "lockstep env-steps/s": lockstep,
                "streaming % ideal": 100 * streaming / ideal,
                "lockstep % ideal": 100 * lockstep / ideal,
                "streaming / lockstep": streaming / lockstep,
            }
        )
    return rows


def startup_rows(quick: bool) -> list[dict[str, Any]]:
    rows = []
    for backend in _backends():
        if backend == "ray":
            continue
        for n in [8] if quick else [8, 64]:

            async def first_reset(n: int = n, backend: str = backend) -> float:
                t0 = time.perf_counter()
                pool = _make_pool(n, backend=backend)
                try:
                    await pool.reset()
                    return time.perf_counter() - t0
                finally:
                    await pool.aclose()

            rows.append(
                {
                    "backend": backend,
                    "envs": n,
                    "startup to first reset (s)": anyio.run(first_reset),
                }
            )
    return rows


def _memory_one(n: int) -> dict[str, Any]:
    """Build and reset ``n`` latency envs in this (fresh) process: CPU time per env for
    each, RSS growth and GC-tracked objects per env (the objects every full collection of
    the cyclic garbage collector walks)."""
    import psutil

    proc = psutil.Process(os.getpid())
    gc.collect()
    before, objs_before = proc.memory_info().rss, len(gc.get_objects())

    async def build_and_reset() -> tuple[float, float, int, int]:
        t0 = time.process_time()
        pool = _make_pool(n, latency=0.0)
        built = time.process_time() - t0
        try:
            t0 = time.process_time()
            await pool.reset()
            reset = time.process_time() - t0
            gc.collect()
            return built, reset, proc.memory_info().rss, len(gc.get_objects())
        finally:
            await pool.aclose()

    built, reset, after, objs = anyio.run(build_and_reset)
    return {
        "envs": n,
        "build (us per env)": built / n * 1e6,
        "reset (us per env)": reset / n * 1e6,
        "build + reset (s)": built + reset,
        "KiB per env": (after - before) / 1024 / n,
        "GC objects per env": (objs - objs_before) / n,
    }


def memory_rows(quick: bool) -> list[dict[str, Any]]:
    """:func:`_memory_one` per size, each in a fresh interpreter (RSS and the collector's
    heap otherwise carry the previous size's leftovers). Times are CPU times."""
    import json
    import subprocess

    rows = []
    for n in [1024] if quick else [1024, 4096, 16_384]:
        out = subprocess.run(
            [sys.executable, __file__, "--memory-one", str(n)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    return rows


def cost_rows(quick: bool) -> list[dict[str, Any]]:
    sizes = [1, 8, 64] if quick else [1, 8, 64, 256]
    rows = []
    for backend in _backends():
        if backend == "ray":
            continue
        for n in sizes:
            if backend == "thread" and n > 64:
                continue
            make = partial(_make_pool, n, backend=backend, latency=0.0)
            rate = anyio.run(_with_pool, make, lockstep_rate, 0.3 if quick else 1.5)
            rows.append({"backend": backend, "envs": n, "us per env-step": 1e6 / rate})
    return rows


def run(quick: bool = False) -> dict[str, list[dict[str, Any]]]:
    torch.set_num_threads(1)
    return {
        "scale": scale_rows(quick),
        "spread": spread_rows(quick),
        "startup": startup_rows(quick),
        "cost": cost_rows(quick),
        "memory": memory_rows(quick),  # last: it leaves the most garbage behind
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--memory-one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_one:
        import json

        torch.set_num_threads(1)
        print(json.dumps(_memory_one(args.memory_one)))
        return
    results = run(args.quick)
    titles = {
        "scale": "Throughput vs number of coroutine envs (50 ms latency, streaming)",
        "spread": "Throughput vs latency spread (streaming vs lockstep)",
        "startup": "Startup time to first reset",
        "memory": "Many envs in one process",
        "cost": "Framework cost per env-step (zero-latency envs, lockstep)",
    }
    for key, rows in results.items():
        print_table(titles[key], rows)


if __name__ == "__main__":
    main()
