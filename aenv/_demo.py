"""The demo behind ``python -m aenv demo``: lockstep vs streaming, and processes for CPU work.

Part 1 runs many high-latency envs (lognormal latencies, like LLM calls or remote tools)
two ways on the same pool backend: *lockstep*, where every batched step waits for the
slowest env, and *streaming*, where each env gets its next action as soon as it returns.
Part 2 runs CPU-bound envs (a Python busy loop holding the GIL) on one process
(``SerialEnv``) and on worker processes (``ParallelEnv``). A final table gives env-steps/s
and % of the ideal throughput.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from functools import partial
from typing import Any

import anyio
import torch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--envs", type=int, default=256, help="high-latency envs (default 256)")
    parser.add_argument("--latency", type=float, default=0.05, help="median latency in s (0.05)")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal spread (1.0)")
    parser.add_argument(
        "--backend",
        default="coroutine",
        choices=["coroutine", "thread", "process"],
        help="pool backend for the latency part (coroutine)",
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="duration of each latency run")
    parser.add_argument("--cpu-envs", type=int, default=4, help="CPU-bound envs (4; 0 skips)")
    parser.add_argument("--cpu-ms", type=float, default=2.0, help="CPU work per step in ms (2)")
    parser.add_argument("--cpu-steps", type=int, default=200, help="batched CPU steps (200)")


class _Progress:
    """One status line, redrawn in place on a terminal, printed once a second otherwise."""

    def __init__(self, label: str, ideal: float) -> None:
        self.label = label
        self.ideal = ideal
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.tty = sys.stdout.isatty()

    def update(self, steps: int, final: bool = False) -> None:
        now = time.perf_counter()
        if not final and now - self.last < (0.2 if self.tty else 1.0):
            return
        self.last = now
        rate = steps / max(now - self.t0, 1e-9)
        bar_len = 24
        frac = min(rate / self.ideal, 1.0) if self.ideal else 0.0
        bar = "#" * round(frac * bar_len) + "." * (bar_len - round(frac * bar_len))
        line = (
            f"  {self.label:<30} [{bar}] {steps:>8,} env-steps  {rate:>9,.0f}/s"
            f"  {100 * frac:5.1f}% of ideal"
        )
        if self.tty:
            end = "\n" if final else ""
            sys.stdout.write("\r" + line + end)
        else:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _latency_pool(args: argparse.Namespace) -> Any:
    from aenv.pool import AsyncEnvPool, ProcessorAsyncEnvPool
    from aenv.testing import LatencyEnv

    fns = [
        partial(LatencyEnv, median=args.latency, sigma=args.sigma, seed=i) for i in range(args.envs)
    ]
    if args.backend == "process":
        return ProcessorAsyncEnvPool(fns, num_workers=2)
    return AsyncEnvPool(fns, backend=args.backend)


def _replay_ideal(args: argparse.Namespace, elapsed: float) -> float:
    """Env-steps/s with zero overhead: each env's own seeded latencies, back to back."""
    from aenv.testing import latency_ideal_steps

    steps = sum(
        latency_ideal_steps(elapsed, median=args.latency, sigma=args.sigma, seed=i)
        for i in range(args.envs)
    )
    return steps / elapsed


async def _lockstep(args: argparse.Namespace, ideal: float) -> tuple[float, float]:
    pool = _latency_pool(args)
    try:
        td = await pool.reset()
        actions = pool.rand_action(td)
        progress = _Progress(f"lockstep ({args.backend})", ideal)
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            await pool.step(actions.clone())
            steps += pool.num_envs
            progress.update(steps)
        elapsed = time.perf_counter() - t0
        progress.update(steps, final=True)
        return steps / elapsed, _replay_ideal(args, elapsed)
    finally:
        await pool.aclose()


async def _streaming(args: argparse.Namespace, ideal: float) -> tuple[float, float]:
    pool = _latency_pool(args)
    try:
        n = pool.num_envs
        td = await pool.reset()
        actions = pool.rand_action(td)
        progress = _Progress(f"streaming ({args.backend})", ideal)
        pool.async_step_send(actions, env_index=list(range(n)))
        in_flight, steps = n, 0
        t0 = time.perf_counter()
        while True:
            out = await pool.async_step_recv(min_get=1)
            idx = out.get("env_index").reshape(-1)
            in_flight -= idx.numel()
            steps += idx.numel()
            progress.update(steps)
            if time.perf_counter() - t0 >= args.seconds:
                break
            pool.async_step_send(actions[idx], env_index=idx)
            in_flight += idx.numel()
        elapsed = time.perf_counter() - t0
        progress.update(steps, final=True)
        while in_flight:
            in_flight -= (await pool.async_step_recv(min_get=1)).get("env_index").numel()
        return steps / elapsed, _replay_ideal(args, elapsed)
    finally:
        await pool.aclose()


def _cpu_runs(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    from aenv import step_mdp
    from aenv.sync import ParallelEnv, SerialEnv
    from aenv.testing import CpuBoundEnv

    make = partial(CpuBoundEnv, work_ms=args.cpu_ms)
    n, steps = args.cpu_envs, args.cpu_steps
    cores = 2
    ideal_one = 1000.0 / args.cpu_ms
    rows = []
    for label, factory, ideal in (
        ("SerialEnv (1 process)", lambda: SerialEnv(n, make), ideal_one),
        (
            "ParallelEnv (2 processes)",
            lambda: ParallelEnv(n, make, num_processes=cores),
            ideal_one * cores,
        ),
    ):
        with factory() as env:
            td = env.reset()
            for _ in range(5):  # warm up (first steps in fresh workers are slow)
                td = step_mdp(env.step(env.rand_action(td)))
            progress = _Progress(label, ideal)
            t0 = time.perf_counter()
            for i in range(steps):
                td = step_mdp(env.step(env.rand_action(td)))
                progress.update((i + 1) * n)
            rate = steps * n / (time.perf_counter() - t0)
            progress.update(steps * n, final=True)
        rows.append((label, rate, ideal))
    return rows


def run_demo(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    expected = args.latency * math.exp(args.sigma**2 / 2)
    ideal = args.envs / expected
    print(
        f"aenv demo: {args.envs} envs, lognormal latency (median {1000 * args.latency:.0f} ms, "
        f"sigma {args.sigma}); long-run ideal {ideal:,.0f} env-steps/s = envs / mean latency"
    )
    rows: list[tuple[str, float, float]] = []
    lock, lock_ideal = anyio.run(_lockstep, args, ideal)
    rows.append((f"lockstep ({args.backend})", lock, lock_ideal))
    stream, stream_ideal = anyio.run(_streaming, args, ideal)
    rows.append((f"streaming ({args.backend})", stream, stream_ideal))
    if args.cpu_envs > 0:
        print(f"\nCPU-bound: {args.cpu_envs} envs, {args.cpu_ms} ms of Python work per step")
        rows.extend(_cpu_runs(args))
    print(f"\n{'run':<32}{'env-steps/s':>14}{'ideal':>10}{'% of ideal':>12}")
    for label, rate, ideal_rate in rows:
        print(f"{label:<32}{rate:>14,.0f}{ideal_rate:>10,.0f}{100 * rate / ideal_rate:>11.1f}%")
    print(
        "ideal: latency runs, the steps the same envs would take in the same time with zero "
        "overhead (their seeded latencies replayed back to back); CPU runs, cores / work per step"
    )
    print(f"\nstreaming / lockstep: {stream / lock:.1f}x")
    return 0
