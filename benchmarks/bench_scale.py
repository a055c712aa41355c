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
* cost growth: framework time per env-step with zero-latency envs, per backend and N;
* the streaming loop against its limit at 1,024 to 16,384 envs (lognormal latencies,
  sigma 1): at a fixed ideal rate (the median grows with N) and at a fixed median (200 ms,
  where the machine becomes the bottleneck). The limit is the same load without a pool:
  one plain asyncio task per env that sleeps the same seeded latencies and builds one
  TensorDict per step. Each cell runs in a fresh interpreter, the limit's and aenv's twice,
  alternating, keeping each one's best (once in quick mode); besides % of ideal it gives
  the CPU time per env-step and the part of it the cyclic garbage collector took (both
  counted from the first send; the collector's time with ``gc.callbacks``), with the
  pool's collector policy as it is by default (``gc_freeze``: pools of 64 envs or more
  freeze what their build and first reset made, see ``aenv/pool/_gc.py``) and turned off;
* the episode runner (``aenv.agents.run_episodes``) with 256 and 4,096 concurrent episodes,
  % of ideal and CPU time per turn, against its limit in the same run: the same episodes,
  env hooks and policy in plain tasks, no pool (``bench_agents._limit``). With 4,096 the
  ideal schedule starts ~14k turns in its first second: the loop is CPU-bound there unless a
  turn costs under ~70 us in all (env, policy, timers and framework).

Run: ``python benchmarks/bench_scale.py [--quick]``
"""

from __future__ import annotations

import argparse
import gc
import math
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


def _make_pool(
    n: int, backend: str = "coroutine", gc_freeze: bool | None = None, **env_kwargs: Any
) -> Any:
    from aenv.pool import AsyncEnvPool
    from aenv.testing import LatencyEnv

    fns = [partial(LatencyEnv, seed=i, **env_kwargs) for i in range(n)]
    return AsyncEnvPool(fns, backend=backend, gc_freeze=gc_freeze)


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


class _GcClock:
    """CPU time the cyclic garbage collector takes, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.seconds, self.full, self._t0 = 0.0, 0, 0.0

    def restart(self) -> None:
        """Count from now on (the measured window, not the build and reset before it)."""
        self.seconds, self.full = 0.0, 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.process_time()
        else:
            self.seconds += time.process_time() - self._t0
            self.full += info["generation"] == 2


async def _limit_run(
    n: int, median: float, sigma: float, duration: float, clock: _GcClock | None = None
) -> tuple[int, float]:
    """The limit: ``n`` plain tasks, each sleeping its env's seeded latencies and building
    one TensorDict per step (what a LatencyEnv step returns). Steps counted from the start
    until ``duration``, and the CPU time it took."""
    import asyncio
    import math

    import numpy as np
    from tensordict import TensorDict

    count, stop = 0, False

    async def one(i: int) -> None:
        nonlocal count
        rng = np.random.default_rng(i)
        steps = 0
        while not stop:
            await asyncio.sleep(median * math.exp(sigma * rng.standard_normal()))
            steps += 1
            TensorDict(
                {
                    "observation": torch.full((4,), float(steps)),
                    "latency": torch.full((1,), 0.0),
                    "reward": torch.ones(1),
                    "terminated": torch.zeros(1, dtype=torch.bool),
                    "truncated": torch.zeros(1, dtype=torch.bool),
                    "done": torch.zeros(1, dtype=torch.bool),
                },
                batch_size=(),
            )
            if not stop:
                count += 1

    if clock is not None:
        clock.restart()
    t0 = time.process_time()
    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    await asyncio.sleep(duration)
    stop, steps, cpu = True, count, time.process_time() - t0
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return steps, cpu


async def _stream_run(
    n: int,
    median: float,
    sigma: float,
    duration: float,
    gc_freeze: bool | None,
    clock: _GcClock | None = None,
) -> tuple[int, float]:
    """The streaming loop of :func:`stream_rate` on ``n`` LatencyEnvs: steps returned in
    ``duration`` from the first send, and the CPU time the loop took."""
    pool = _make_pool(n, gc_freeze=gc_freeze, median=median, sigma=sigma)
    try:
        td = await pool.reset()
        actions = pool.rand_action(td)
        if clock is not None:
            clock.restart()
        t0, c0 = time.perf_counter(), time.process_time()
        pool.async_step_send(actions, env_index=list(range(n)))
        count = 0
        while True:
            out = await pool.async_step_recv(min_get=1)
            idx = out.get("env_index").reshape(-1)
            if time.perf_counter() - t0 > duration:
                break
            count += idx.numel()
            pool.async_step_send(actions[idx], env_index=idx)
        # (the steps still out are cancelled by aclose: waiting for the slowest of
        # thousands of lognormal latencies would take minutes and measure nothing)
        return count, time.process_time() - c0
    finally:
        await pool.aclose()


def _limit_one(n: int, median: float, mode: str, duration: float) -> dict[str, Any]:
    """One row cell of :func:`limit_rows`, in this (fresh) process: ``mode`` is "limit",
    "aenv" or "nofreeze" (aenv with ``gc_freeze=False``)."""
    clock = _GcClock()
    gc.collect()
    if mode == "limit":
        gc.callbacks.append(clock)
        steps, cpu = anyio.run(_limit_run, n, median, 1.0, duration, clock)
    else:
        gc.callbacks.append(clock)
        steps, cpu = anyio.run(
            _stream_run, n, median, 1.0, duration, False if mode == "nofreeze" else None, clock
        )
    gc.callbacks.remove(clock)
    if not steps:  # nothing came back in time (an overloaded machine): no per-step figure
        return {"steps": 0, "cpu_us": None, "gc_us": None, "full": clock.full}
    return {
        "steps": steps,
        "cpu_us": 1e6 * cpu / steps,
        "gc_us": 1e6 * clock.seconds / steps,
        "full": clock.full,
    }


def limit_rows(quick: bool) -> list[dict[str, Any]]:
    """The streaming loop against its limit (see the module docstring); each cell in a
    fresh interpreter. % of ideal: steps against the same envs' own latencies replayed
    back to back for the same time (``latency_ideal_steps``)."""
    import json
    import subprocess

    configs = (
        [(256, 0.032), (1024, 0.128), (1024, 0.05)]
        if quick
        else [(1024, 0.128), (4096, 0.512), (16_384, 2.048), (4096, 0.2), (16_384, 0.2)]
    )
    rows = []
    for n, median in configs:
        duration = (1.0 if quick else 4.0) + 3 * median
        ideal = sum(
            latency_ideal_steps(duration, median=median, sigma=1.0, seed=i) for i in range(n)
        )
        row: dict[str, Any] = {
            "envs": n,
            "median latency (ms)": 1000 * median,
            "N / E[latency]": n / expected_latency(median, 1.0),
            "ideal env-steps/s": ideal / duration,
        }
        # (limit and aenv alternate twice and each keeps its best run, so that a slow
        # minute of a shared machine does not fall on one side only)
        cells: dict[str, dict[str, Any]] = {}
        twice = () if quick else ("limit", "aenv")
        for mode in ("limit", "aenv", *twice, "nofreeze"):
            out = subprocess.run(
                [sys.executable, __file__, "--limit-one", str(n), str(median), mode, str(duration)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            cell = json.loads(out.strip().splitlines()[-1])
            if mode in cells and cells[mode]["steps"] >= cell["steps"]:
                continue
            cells[mode] = cell
        for mode, cell in cells.items():
            name = {"limit": "limit", "aenv": "aenv", "nofreeze": "aenv, gc_freeze=False"}[mode]
            row[f"{name} %"] = 100 * cell["steps"] / ideal
            row[f"{name} CPU us/step"] = cell["cpu_us"]
            if mode != "limit":
                row[f"{name} GC us/step"] = cell["gc_us"]
        rows.append(row)
    return rows


def runner_rows(quick: bool) -> list[dict[str, Any]]:
    """The episode runner of ``bench_agents`` at 256 and 4,096 concurrent episodes (two
    episodes per slot, 4 turns, policy and env latencies lognormal): % of its ideal, best
    of two runs alternating with its limit's."""
    from aenv.sync import get_runner
    from benchmarks import bench_agents
    from benchmarks._common import agent_schedule, ideal_makespan

    rows = []
    for cap in [64, 256] if quick else [256, 4096]:
        p = {**bench_agents.FULL, "concurrency": cap, "n_episodes": 2 * cap, "turns": 4}
        policy_lat, env_lat = agent_schedule(
            0,
            2 * cap,
            4,
            (p["policy_median"], p["policy_sigma"]),
            (p["env_median"], p["env_sigma"]),
        )
        ideal = ideal_makespan(policy_lat.sum(1) + env_lat.sum(1), cap)
        turns = 2 * cap * 4
        # (the runner and its limit alternate, twice out of quick mode, each keeping its
        # best run: a slow minute of a shared machine does not fall on one side only)
        seconds = limit_s = math.inf
        for _ in range(1 if quick else 2):
            run_stats: dict[str, float] = {}
            gc.collect()
            s = get_runner().run(bench_agents._runner, p, policy_lat, env_lat, run_stats)
            if s < seconds:
                seconds, stats = s, run_stats
            run_limit: dict[str, float] = {}
            gc.collect()
            s = get_runner().run(bench_agents._limit, p, policy_lat, env_lat, run_limit)
            if s < limit_s:
                limit_s, limit = s, run_limit
        rows.append(
            {
                "concurrent episodes": cap,
                "episodes": 2 * cap,
                "turns": 4,
                "seconds": seconds,
                "ideal (s)": ideal,
                "% of ideal": 100 * ideal / seconds,
                "CPU per turn (us)": 1e6 * stats["cpu"] / turns,
                "limit % of ideal": 100 * ideal / limit_s,
                "limit CPU per turn (us)": 1e6 * limit["cpu"] / turns,
            }
        )
    return rows


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
    each (the factories made beforehand, as a user's list of them), the part of it the
    cyclic garbage collector took, RSS growth and GC-tracked objects per env (the objects
    every full collection walks)."""
    import psutil

    from aenv.pool import AsyncEnvPool
    from aenv.testing import LatencyEnv

    proc = psutil.Process(os.getpid())
    fns = [partial(LatencyEnv, seed=i, latency=0.0) for i in range(n)]
    gc.collect()
    # (frozen objects are in no generation: count them too)
    before = proc.memory_info().rss
    objs_before = len(gc.get_objects()) + gc.get_freeze_count()
    clock = _GcClock()

    async def build_and_reset() -> tuple[float, float, int, int]:
        gc.callbacks.append(clock)
        try:
            t0 = time.process_time()
            pool = AsyncEnvPool(fns, backend="coroutine")
            built = time.process_time() - t0
            try:
                t0 = time.process_time()
                await pool.reset()
                reset = time.process_time() - t0
            finally:
                gc.callbacks.remove(clock)
            gc.collect()
            objs = len(gc.get_objects()) + gc.get_freeze_count()
            return built, reset, proc.memory_info().rss, objs
        finally:
            await pool.aclose()

    built, reset, after, objs = anyio.run(build_and_reset)
    return {
        "envs": n,
        "build (us per env)": built / n * 1e6,
        "reset (us per env)": reset / n * 1e6,
        "build + reset (s)": built + reset,
        "of which GC (s)": clock.seconds,
        "full GCs": clock.full,
        "KiB per env": (after - before) / 1024 / n,
        "GC objects per env": (objs - objs_before) / n,
    }


def memory_rows(quick: bool, repeat: int = 3) -> list[dict[str, Any]]:
    """:func:`_memory_one` per size, each in a fresh interpreter (RSS and the collector's
    heap otherwise carry the previous size's leftovers). Times are CPU times: of ``repeat``
    runs, the one whose build and reset took least (a shared machine's other work inflates
    them by as much as half)."""
    import json
    import subprocess

    rows = []
    for n in [1024] if quick else [1024, 4096, 16_384]:
        runs = []
        for _ in range(1 if quick else repeat):
            out = subprocess.run(
                [sys.executable, __file__, "--memory-one", str(n)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
        rows.append(min(runs, key=lambda r: r["build + reset (s)"]))
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
        "limit": limit_rows(quick),
        "runner": runner_rows(quick),
        "memory": memory_rows(quick),  # last: it leaves the most garbage behind
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--memory-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--limit-one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.limit_one:
        import json

        torch.set_num_threads(1)
        n, median, mode, duration = args.limit_one
        print(json.dumps(_limit_one(int(n), float(median), mode, float(duration))))
        return
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
        "limit": "Streaming loop vs its limit (lognormal sigma 1; CPU and GC per env-step)",
        "runner": "Episode runner: 256 vs 4,096 concurrent episodes",
    }
    for key, rows in results.items():
        print_table(titles[key], rows)


if __name__ == "__main__":
    main()
