"""Process pools against the hardware limit, as the cost of an env step grows.

8 CPU-bound envs on the machine's 2 cores: CartPole-v1 plus a pure-Python loop before each
step that sets its cost (``benchmarks/peers/_spin.py``; no loop, about 100 us and about 1 ms),
random actions, ended episodes reset. Each framework runs as its users run it, all in one
run:

- the **limit**, measured here: 2 plain processes, each stepping 4 envs in a loop, with
  nothing exchanged per step (what 2 cores can do with these envs); its runs alternate with
  aenv's timed rollouts and each side keeps its best, so a slow minute of a shared machine
  does not land on one side only;
- aenv ``ParallelEnv`` (the sync facade over a process pool): ``rollout(steps,
  break_when_any_done=False)``, with 2 worker processes of 4 envs and with 8 workers of 1;
- Gymnasium ``AsyncVectorEnv`` (one process per env) stepping pre-drawn random actions, and
  TorchRL ``ParallelEnv`` (one process per env) with its own ``rollout``, in TorchRL's venv
  (``benchmarks/peers/gym_vector_cartpole.py``, ``benchmarks/peers/torchrl_parallel_cartpole.py``);
- EnvPool's C++ CartPole (its own thread pool, own venv) for the plain CartPole row only: it
  cannot run a Python step, so it is the yardstick of a native simulator, not a peer.

A second table, ``collector``: the classic training shape, a collector with a small MLP
policy (``_spin.mlp_policy``: 4 -> 64 -> 64 -> 2, greedy one-hot action, run without grad in
the parent) gathering batches of 512 frames from 8 envs, at the first two costs: aenv
``SyncDataCollector`` over ``ParallelEnv`` (2 workers x 4 envs) against TorchRL's
``SyncDataCollector`` over its ``ParallelEnv`` (one process per env), steady-state frames/s
(after the first batch) and the parent's CPU per batched step.

Each cell is env-steps/s and its share of the limit; the last column is the parent's CPU
time per batch step of aenv's 2 x 4 layout (its process time over the rollouts: the sync
facade drives the pool's loop in the calling thread, and any thread torch starts there takes
its CPU from the workers too). The costs are measured, not assumed: the
loop's turns per microsecond are calibrated in this process, and "cost per env step" is the
limit's own CPU time per env step (CartPole's step and its resets included).

Run: ``python benchmarks/bench_scaling.py [--quick] [--plot FILE]`` (``--quick``: the ~100 us
row only, 100 steps, no TorchRL (its 8 processes take longer to start than the row takes),
Gymnasium where its venv is already built).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks._common import print_table  # noqa: E402
from benchmarks.peers import _spin  # noqa: E402

N_ENVS, CORES = 8, 2
#: extra cost per step (us) of each row: none (plain CartPole), ~100 us, ~1 ms
COSTS_US = (0, 100, 1000)
QUICK_COSTS_US = (100,)
#: seconds of stepping per timed run at the limit (the step counts follow from the cost),
#: at most MAX_STEPS batched steps (TorchRL runs plain CartPole at a few % of the limit)
SECONDS, MAX_STEPS, QUICK_STEPS = 1.5, 2000, 100
#: the collector table: its step costs, frames per batch and batches timed after the first
COLLECTOR_COSTS_US, FRAMES_PER_BATCH, BATCHES, QUICK_BATCHES = (0, 100), 512, 40, 4


def _aenv_spin(iters: int) -> Any:
    from aenv.libs.gym import GymWrapper

    return GymWrapper(_spin.make(iters))


def _steps(cost_us: float) -> int:
    """Batched steps that take about :data:`SECONDS` at the limit."""
    per_batch = N_ENVS * cost_us * 1e-6 / CORES
    return max(20, min(MAX_STEPS, int(SECONDS / per_batch)))


def _limit(iters: int, steps: int) -> dict[str, float]:
    """2 plain processes of 4 envs each: env-steps/s over the span from the first start to
    the last end, and the CPU time per env step (the cost on one core)."""
    ctx = multiprocessing.get_context("forkserver")
    per = N_ENVS // CORES
    barrier, out = ctx.Barrier(CORES), ctx.Queue()
    procs = [
        ctx.Process(target=_spin.limit_worker, args=(per, iters, steps, 9 * k, barrier, out))
        for k in range(CORES)
    ]
    for proc in procs:
        proc.start()
    try:
        # (each process builds its envs, then all step at once from the barrier on)
        spans = [out.get(timeout=600) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    start, end = min(s[0] for s in spans), max(s[1] for s in spans)
    cpu = sum(s[2] for s in spans)
    return {
        "env_steps_per_s": N_ENVS * steps / (end - start),
        "cost_us": cpu / (N_ENVS * steps) * 1e6,
    }


def _limit_into(runs: list[dict[str, float]], iters: int, steps: int) -> None:
    runs.append(_limit(iters, steps))


def _aenv(
    iters: int, steps: int, workers: int, repeats: int, between: Callable[[], Any] | None = None
) -> tuple[float, float]:
    """env-steps/s (best of ``repeats``) and the parent's CPU time per batch step (us; its
    process time over the timed rollouts: the sync facade runs its loop in this thread,
    torch's intra-op threads count too). ``between`` runs before each timed rollout (the
    limit's runs, interleaved with these so that both see the same minutes of the machine)."""
    from aenv.sync import ParallelEnv

    env = ParallelEnv(N_ENVS, partial(_aenv_spin, iters), num_processes=workers)
    try:
        env.set_seed(0)
        env.reset()
        env.rollout(steps, break_when_any_done=False)  # (warm-up)
        best, cpu = math.inf, 0.0
        for _ in range(repeats):
            if between is not None:
                between()
            c0, t0 = time.process_time(), time.perf_counter()
            env.rollout(steps, break_when_any_done=False)
            best = min(best, time.perf_counter() - t0)
            cpu += time.process_time() - c0
    finally:
        env.close()
    return N_ENVS * steps / best, cpu / (repeats * steps) * 1e6


def _aenv_collector(iters: int, batches: int, frames: int) -> tuple[float, float]:
    """Steady-state frames/s of aenv's ``SyncDataCollector`` over ``ParallelEnv`` (2 workers
    x 4 envs) with the MLP policy, and the parent's CPU time per batched step (us)."""
    from aenv.collectors import SyncDataCollector
    from aenv.sync import ParallelEnv

    env = ParallelEnv(N_ENVS, partial(_aenv_spin, iters), num_processes=CORES)
    collector = None
    try:
        env.set_seed(0)
        collector = SyncDataCollector(
            env, _spin.mlp_policy(), frames_per_batch=frames, total_frames=-1
        )
        count = 0
        with torch.no_grad():
            for i, batch in enumerate(collector):
                if i == 0:  # (steady state: from the end of the first batch, as the peer)
                    t0, c0 = time.perf_counter(), time.process_time()
                    continue
                count += batch.numel()
                if i == batches:
                    break
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        if collector is not None:
            collector.shutdown()
        env.close()
    return count / seconds, cpu / (count / N_ENVS) * 1e6


def _peer(name: str, params: dict[str, Any], quick: bool, venv: str = "torchrl") -> Any:
    from benchmarks._peers import VENVS_DIR, PeerRunError, run_peer

    if quick and not (VENVS_DIR / venv / "bin" / "python").exists():
        print(f"peer {name}: skipped in quick mode (no {venv} venv built)", file=sys.stderr)
        return None
    try:
        return run_peer(name, venv=venv, **params)
    except PeerRunError as exc:
        print(f"peer {name} unavailable: {str(exc).splitlines()[0]}", file=sys.stderr)
        return None


def _cell(rate: float | None, limit: float) -> str | None:
    if not rate:
        return None
    return f"{rate:,.0f} ({100.0 * rate / limit:.0f}%)"


def run(quick: bool = False) -> dict[str, list[dict[str, Any]]]:
    """One row per step cost: the limit, then each framework's env-steps/s and % of it."""
    torch.set_num_threads(1)
    costs = QUICK_COSTS_US if quick else COSTS_US
    repeats = 1 if quick else 3
    per_us = _spin.iters_per_us()
    rows, plot, collected = [], [], []
    for extra in costs:
        iters = int(extra * per_us)
        steps = QUICK_STEPS if quick else _steps(extra + 8.0)
        # (the limit's runs alternate with aenv's timed rollouts, best of each: a slow
        # minute of the shared machine falls on both sides, not on one)
        limits: list[dict[str, float]] = []
        between = partial(_limit_into, limits, iters, steps)
        aenv_2x4, parent_us = _aenv(iters, steps, CORES, repeats, between)
        aenv_8x1, _ = _aenv(iters, steps, N_ENVS, repeats, between)
        limit = max(limits, key=lambda r: r["env_steps_per_s"])
        rate = limit["env_steps_per_s"]
        params = {"n_envs": N_ENVS, "steps": steps, "repeats": repeats, "spin": iters}
        gym = _peer("gym_vector_cartpole", {**params, "kinds": ["async"]}, quick)
        trl = None if quick else _peer("torchrl_parallel_cartpole", params, quick)
        pool = None
        if extra == 0:
            pool = _peer(
                "envpool_cartpole",
                {"n_envs": N_ENVS, "steps": steps, "repeats": repeats, "threads": CORES},
                quick,
                venv="envpool",
            )
        gym_rate = gym["async_env_steps_per_s"] if gym else None
        trl_rate = trl["env_steps_per_s"] if trl else None
        rows.append(
            {
                "cost per env step": f"{limit['cost_us']:,.0f} us",
                "limit (2 plain processes)": f"{rate:,.0f}",
                "aenv ParallelEnv, 2 workers x 4 envs": _cell(aenv_2x4, rate),
                "aenv ParallelEnv, 8 workers x 1 env": _cell(aenv_8x1, rate),
                "Gymnasium AsyncVectorEnv": _cell(gym_rate, rate),
                "TorchRL ParallelEnv": _cell(trl_rate, rate),
                "EnvPool (C++ CartPole)": _cell(pool["env_steps_per_s"], rate) if pool else None,
                "aenv 2x4 / AsyncVectorEnv": aenv_2x4 / gym_rate if gym_rate else None,
                "aenv 2x4: parent CPU per batch step": f"{parent_us:,.0f} us",
            }
        )
        plot.append(
            {
                "cost_us": limit["cost_us"],
                "aenv 2x4": 100.0 * aenv_2x4 / rate,
                "aenv 8x1": 100.0 * aenv_8x1 / rate,
                "AsyncVectorEnv": 100.0 * gym_rate / rate if gym_rate else None,
                "TorchRL": 100.0 * trl_rate / rate if trl_rate else None,
            }
        )
        if extra in COLLECTOR_COSTS_US and not (quick and extra != costs[0]):
            collected.append(_collector_row(iters, limit, quick))
    return {"": rows, "collector": collected, "% of the limit": plot}


def _collector_row(iters: int, limit: dict[str, float], quick: bool) -> dict[str, Any]:
    """One row of the collector table at the cost ``iters`` sets (see the module doc)."""
    batches = QUICK_BATCHES if quick else BATCHES
    frames = FRAMES_PER_BATCH // 4 if quick else FRAMES_PER_BATCH
    rate, parent_us = _aenv_collector(iters, batches, frames)
    params = {"n_envs": N_ENVS, "frames_per_batch": frames, "batches": batches, "spin": iters}
    trl = None if quick else _peer("torchrl_parallel_collector", params, quick)
    trl_rate = trl["frames_per_s"] if trl else None
    return {
        "cost per env step": f"{limit['cost_us']:,.0f} us",
        "limit (2 plain processes)": f"{limit['env_steps_per_s']:,.0f}",
        "aenv SyncDataCollector, ParallelEnv 2 workers x 4 envs": _cell(
            rate, limit["env_steps_per_s"]
        ),
        "TorchRL SyncDataCollector, ParallelEnv 8 processes": _cell(
            trl_rate, limit["env_steps_per_s"]
        ),
        "aenv / TorchRL": rate / trl_rate if trl_rate else None,
        "aenv: parent CPU per batched step": f"{parent_us:,.0f} us",
        "TorchRL: parent CPU per batched step": (
            f"{trl['driver_cpu_us_per_batched_step']:,.0f} us" if trl else None
        ),
    }


def plot(points: list[dict[str, Any]], path: Path) -> None:
    """% of the limit against the cost per env step (log scale), one line per framework."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [p["cost_us"] for p in points]
    for name in ("aenv 2x4", "aenv 8x1", "AsyncVectorEnv", "TorchRL"):
        ys = [p[name] for p in points]
        if all(y is not None for y in ys):
            ax.plot(xs, ys, "o-", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("cost per env step (us, one core)")
    ax.set_ylabel("% of the limit (2 plain processes)")
    ax.set_ylim(0, 105)
    ax.set_title(f"{N_ENVS} CPU-bound envs on {CORES} cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one row, short runs")
    parser.add_argument("--plot", type=Path, help="write the plot there (PNG)")
    args = parser.parse_args()
    t = time.perf_counter()
    res = run(args.quick)
    print_table(f"{N_ENVS} CPU-bound envs on {CORES} cores: env-steps/s (% of the limit)", res[""])
    print_table("Collectors with a small MLP policy: frames/s (% of the limit)", res["collector"])
    if args.plot:
        plot(res["% of the limit"], args.plot)
    print(f"({time.perf_counter() - t:.0f} s)")


if __name__ == "__main__":
    main()
