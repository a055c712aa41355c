"""Process pools: aenv's process backend vs Gymnasium AsyncVectorEnv and TorchRL ParallelEnv.

CPU-bound: ``n_envs`` gymnasium CartPole-v1 envs (aenv ``GymEnv``) on ``workers`` worker
processes (aenv) vs Gymnasium ``AsyncVectorEnv`` (one process per env) and TorchRL
``ParallelEnv`` (one process per env), all in the same run: env-steps/s of random-action
batched stepping with auto-reset (aenv: ``rollout(steps, break_when_any_done=False)``, async
and through the sync ``ParallelEnv`` facade), and startup time to the first reset. The peers
run in TorchRL's venv (``benchmarks/peers/gym_vector_cartpole.py``,
``benchmarks/peers/torchrl_parallel_cartpole.py``). EnvPool (C++ envs in its own thread pool,
``benchmarks/peers/envpool_cartpole.py``, own venv) is shown where it installs, as the
native-simulator yardstick.

High latency: 64 latency envs (lognormal, median 10 ms, sigma 1) on 2 workers, streamed
(every env re-sent as soon as it returns), against the ideal ``n_envs / E[latency]``.

Run: ``python benchmarks/bench_parallel.py [--quick]``
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks._common import best_of, ideal_throughput, print_table, stream_steps  # noqa: E402

CPU = {"n_envs": 8, "workers": 2, "steps": 1000, "repeats": 3}
CPU_QUICK = {"n_envs": 8, "workers": 2, "steps": 200, "repeats": 1}
LATENCY = {"n_envs": 64, "workers": 2, "median": 0.01, "sigma": 1.0, "duration": 5.0}
LATENCY_QUICK = {**LATENCY, "duration": 1.5}


def _peer(name: str, params: dict[str, Any], venv: str = "torchrl") -> dict[str, Any] | None:
    """A peer's result, or None (with a note) when its venv cannot be built here."""
    from benchmarks._peers import PeerRunError, run_peer

    try:
        return run_peer(name, venv=venv, **params)
    except PeerRunError as exc:
        print(f"peer {name} unavailable: {str(exc).splitlines()[0]}", file=sys.stderr)
        return None


def _cartpole() -> Any:
    from aenv.libs.gym import GymEnv

    return GymEnv("CartPole-v1")


async def _aenv_cartpole(p: dict[str, Any]) -> dict[str, float]:
    from aenv.pool import ProcessorAsyncEnvPool

    n, steps = int(p["n_envs"]), int(p["steps"])
    t0 = time.perf_counter()
    pool = ProcessorAsyncEnvPool((n, _cartpole), num_workers=int(p["workers"]))
    try:
        await pool.reset()
        startup = time.perf_counter() - t0
        await pool.rollout(steps, break_when_any_done=False)  # warm-up
        best = float("inf")
        for _ in range(int(p["repeats"])):
            t = time.perf_counter()
            await pool.rollout(steps, break_when_any_done=False)
            best = min(best, time.perf_counter() - t)
    finally:
        await pool.aclose()
    return {"startup_s": startup, "env_steps_per_s": n * steps / best}


def _aenv_cartpole_sync(p: dict[str, Any]) -> dict[str, float]:
    from aenv.sync._parallel import ParallelEnv

    n, steps = int(p["n_envs"]), int(p["steps"])
    t0 = time.perf_counter()
    env = ParallelEnv(n, _cartpole, num_processes=int(p["workers"]))
    try:
        env.reset()
        startup = time.perf_counter() - t0
        seconds = best_of(
            lambda: env.rollout(steps, break_when_any_done=False),
            repeats=int(p["repeats"]),
            warmup=1,
        )
    finally:
        env.close()
    return {"startup_s": startup, "env_steps_per_s": n * steps / seconds}


async def _aenv_latency(p: dict[str, Any]) -> dict[str, float]:
    from aenv.pool import ProcessorAsyncEnvPool
    from aenv.testing import LatencyEnv

    n = int(p["n_envs"])
    fns = [partial(LatencyEnv, median=p["median"], sigma=p["sigma"], seed=i) for i in range(n)]
    t0 = time.perf_counter()
    pool = ProcessorAsyncEnvPool(fns, num_workers=int(p["workers"]))
    try:
        td = await pool.reset()
        startup = time.perf_counter() - t0
        res = await stream_steps(pool, td, float(p["duration"]))
    finally:
        await pool.aclose()
    return {"startup_s": startup, "env_steps_per_s": res["steps"] / res["elapsed_s"]}


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Run both benchmarks; one row per framework and workload."""
    from aenv.sync import get_runner

    torch.set_num_threads(1)
    cpu = CPU_QUICK if quick else CPU
    lat = LATENCY_QUICK if quick else LATENCY
    peer_params = {"n_envs": cpu["n_envs"], "steps": cpu["steps"], "repeats": cpu["repeats"]}
    gym = _peer("gym_vector_cartpole", {**peer_params, "kinds": ["async"]})
    trl = _peer("torchrl_parallel_cartpole", peer_params)
    envpool = _peer("envpool_cartpole", {**peer_params, "threads": cpu["workers"]}, venv="envpool")
    ours = get_runner().run(_aenv_cartpole, cpu)
    ours_sync = _aenv_cartpole_sync(cpu)
    gym_rate = gym["async_env_steps_per_s"] if gym else None
    trl_rate = trl.get("env_steps_per_s") if trl else None
    label = f"{cpu['n_envs']} CartPole-v1"
    rows: list[dict[str, Any]] = []

    def row(framework: str, procs: int, rate: float | None, startup: float | None) -> None:
        rows.append(
            {
                "benchmark": label,
                "framework": framework,
                "processes": procs,
                "env-steps/s": rate,
                "x Gymnasium async": rate / gym_rate if rate and gym_rate else None,
                "x TorchRL": rate / trl_rate if rate and trl_rate else None,
                "startup s": startup,
            }
        )

    n, w = int(cpu["n_envs"]), int(cpu["workers"])
    # startup: the first pool of the process starts aenv's forkserver (one import of torch
    # and aenv for every later pool); the facade is the second pool
    row(
        "aenv ProcessorAsyncEnvPool (async; first pool)",
        w,
        ours["env_steps_per_s"],
        ours["startup_s"],
    )
    row(
        "aenv ParallelEnv (sync facade; second pool)",
        w,
        ours_sync["env_steps_per_s"],
        ours_sync["startup_s"],
    )
    row("Gymnasium AsyncVectorEnv", n, gym_rate, gym.get("async_startup_s") if gym else None)
    row("TorchRL ParallelEnv", n, trl_rate, trl.get("startup_s") if trl else None)
    if envpool is not None:  # "where it installs": a C++ simulator, for scale
        row(
            f"EnvPool (C++ envs, {w} threads)",
            1,
            envpool["env_steps_per_s"],
            envpool["startup_s"],
        )
    res = get_runner().run(_aenv_latency, lat)
    ideal = ideal_throughput(int(lat["n_envs"]), float(lat["median"]), float(lat["sigma"]))
    rows.append(
        {
            "benchmark": f"{lat['n_envs']} latency envs (median {lat['median'] * 1e3:.0f} ms)",
            "framework": "aenv ProcessorAsyncEnvPool (streamed)",
            "processes": lat["workers"],
            "env-steps/s": res["env_steps_per_s"],
            "% of ideal": 100.0 * res["env_steps_per_s"] / ideal,
            "startup s": res["startup_s"],
        }
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run (smoke test)")
    args = parser.parse_args()
    print_table(
        "Process pools: aenv vs Gymnasium AsyncVectorEnv vs TorchRL ParallelEnv", run(args.quick)
    )


if __name__ == "__main__":
    main()
