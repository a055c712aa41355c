"""The Ray backend against the process backend, on the same envs in the same run.

A local Ray cluster (this machine's CPUs) hosts the envs in 2 actors; the process backend
runs them in 2 worker processes. Workloads:

- Per-step overhead: 8 zero-cost envs (``LatencyEnv(latency=0)``), random-action
  ``rollout(steps, break_when_any_done=False)``: microseconds per env-step, which is all
  framework cost (the env does nothing); on the Ray backend both ways its steps can travel
  (the default socket to each actor, and Ray actor calls with ``transport="ray"``).
- CPU-bound: 8 gymnasium CartPole-v1 envs, the same rollout: env-steps/s, against
  Gymnasium ``AsyncVectorEnv`` (one process per env; in TorchRL's peer venv) where its venv
  builds.
- High latency: 64 latency envs (lognormal, median 10 ms, sigma 1), streamed (every env
  re-sent as soon as it returns): env-steps/s against the ideal ``n_envs / E[latency]``.
- Startup: pool construction to the first reset (the cluster's own start apart).

Each row also gives the CPU per env-step of the driver (this process) and of the workers
or actors (their processes' user + system time over the timed part): on a shared machine
these move less with the load than the wall-clock rates.

Within a workload the backends are interleaved: both pools are open at once and take their
timed rollouts (or streaming turns) one after the other, in turn, so that the load of a
shared machine weighs on both alike. The Gymnasium peer runs first, in its own process.

Run: ``python benchmarks/bench_ray.py [--quick]`` (needs ``pip install 'aenv[ray]'``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks._common import ideal_throughput, print_table, stream_steps  # noqa: E402

WORKERS = 2
OVERHEAD = {"n_envs": 8, "steps": 300, "repeats": 3}
OVERHEAD_QUICK = {"n_envs": 8, "steps": 40, "repeats": 1}
CPU = {"n_envs": 8, "steps": 300, "repeats": 3}
CPU_QUICK = {"n_envs": 8, "steps": 40, "repeats": 1}
LATENCY = {"n_envs": 64, "median": 0.01, "sigma": 1.0, "duration": 6.0, "rounds": 3}
LATENCY_QUICK = {**LATENCY, "duration": 1.0, "rounds": 1}


def _cartpole() -> Any:
    from aenv.libs.gym import GymEnv

    return GymEnv("CartPole-v1")


#: the Ray pools' names here: the default transport (a socket from the driver to each
#: actor) and every step through Ray actor calls (``transport="ray"``)
RAY_CALLS = "ray (transport='ray')"


def _pool(fns: Any, backend: str) -> Any:
    from aenv.pool import AsyncEnvPool

    if backend.startswith("ray"):
        # 0.5 CPU per actor: both actors fit however few CPUs the cluster has
        options: dict[str, Any] = {"num_actors": WORKERS, "num_cpus": 0.5}
        if backend == RAY_CALLS:
            options["transport"] = "ray"
        backend = "ray"
    else:
        options = {"num_workers": WORKERS}
    return AsyncEnvPool(fns, backend=backend, backend_options=options)


def _cpu(pool: Any) -> tuple[float, float]:
    """CPU seconds so far of this process and of the pool's worker processes or actors."""
    import psutil

    backend = pool._backend
    pids = backend.actor_pids if backend.name == "ray" else backend.worker_pids
    workers = 0.0
    for pid in pids:
        if pid is not None:
            times = psutil.Process(pid).cpu_times()
            workers += times.user + times.system
    return time.process_time(), workers


def _add_cpu(
    res: dict[str, float], before: tuple[float, float], after: tuple[float, float]
) -> None:
    res["driver_cpu_s"] = res.get("driver_cpu_s", 0.0) + after[0] - before[0]
    res["workers_cpu_s"] = res.get("workers_cpu_s", 0.0) + after[1] - before[1]


def _cpu_per_step(res: dict[str, float], steps: float) -> None:
    """CPU microseconds per env-step, in this process and in the workers (or actors)."""
    res["driver_cpu_us"] = 1e6 * res.pop("driver_cpu_s") / steps
    res["workers_cpu_us"] = 1e6 * res.pop("workers_cpu_s") / steps


async def _open(fns: Any, backend: str) -> tuple[Any, Any, float]:
    """A pool of ``fns`` on ``backend``, its first reset, and the seconds to get there."""
    t0 = time.perf_counter()
    pool = _pool(fns, backend)
    try:
        td = await pool.reset()
    except BaseException:
        await pool.aclose()
        raise
    return pool, td, time.perf_counter() - t0


async def _rollout_rates(
    fns: Any, backends: tuple[str, ...], p: dict[str, Any]
) -> dict[str, dict[str, float]]:
    """Per backend: env-steps/s of the best of ``repeats`` rollouts, the backends'
    rollouts interleaved (one each in turn, every pool open), and the startup."""
    n, steps = len(fns), int(p["steps"])
    pools: dict[str, Any] = {}
    out: dict[str, dict[str, float]] = {}
    try:
        for backend in backends:
            pools[backend], _, startup = await _open(fns, backend)
            out[backend] = {"startup_s": startup, "best_s": float("inf")}
            await pools[backend].rollout(max(steps // 4, 2), break_when_any_done=False)  # warm-up
        for _ in range(int(p["repeats"])):
            for backend, pool in pools.items():
                cpu = _cpu(pool)
                t = time.perf_counter()
                await pool.rollout(steps, break_when_any_done=False)
                out[backend]["best_s"] = min(out[backend]["best_s"], time.perf_counter() - t)
                _add_cpu(out[backend], cpu, _cpu(pool))
    finally:
        for pool in pools.values():
            await pool.aclose()
    for res in out.values():
        res["env_steps_per_s"] = n * steps / res.pop("best_s")
        _cpu_per_step(res, n * steps * int(p["repeats"]))
    return out


async def _streamed_rates(
    backends: tuple[str, ...], p: dict[str, Any]
) -> dict[str, dict[str, float]]:
    """Per backend: env-steps/s of the streaming loop over ``rounds`` turns of
    ``duration / rounds`` seconds, the backends' turns interleaved, and the startup."""
    from aenv.testing import LatencyEnv

    n = int(p["n_envs"])
    fns = [partial(LatencyEnv, median=p["median"], sigma=p["sigma"], seed=i) for i in range(n)]
    rounds = int(p["rounds"])
    pools: dict[str, Any] = {}
    tds: dict[str, Any] = {}
    out: dict[str, dict[str, float]] = {}
    try:
        for backend in backends:
            pools[backend], tds[backend], startup = await _open(fns, backend)
            out[backend] = {"startup_s": startup, "steps": 0.0, "elapsed_s": 0.0}
        for _ in range(rounds):
            for backend, pool in pools.items():
                cpu = _cpu(pool)
                res = await stream_steps(pool, tds[backend], float(p["duration"]) / rounds)
                _add_cpu(out[backend], cpu, _cpu(pool))
                out[backend]["steps"] += res["steps"]
                out[backend]["elapsed_s"] += res["elapsed_s"]
                for i in range(n):  # the steps still in flight are given up
                    pool.cancel(i)
                tds[backend] = await pool.reset()
    finally:
        for pool in pools.values():
            await pool.aclose()
    for res in out.values():
        _cpu_per_step(res, res["steps"])
        res["env_steps_per_s"] = res.pop("steps") / res.pop("elapsed_s")
    return out


def _cpu_cells(res: dict[str, float]) -> dict[str, float]:
    return {
        "driver CPU us/env-step": res["driver_cpu_us"],
        "workers CPU us/env-step": res["workers_cpu_us"],
    }


def _gym_peer(p: dict[str, Any]) -> dict[str, Any] | None:
    from benchmarks._peers import PeerRunError, run_peer

    params = {"n_envs": p["n_envs"], "steps": p["steps"], "repeats": p["repeats"]}
    try:
        return run_peer("gym_vector_cartpole", venv="torchrl", kinds=["async"], **params)
    except PeerRunError as exc:
        print(f"peer gym_vector_cartpole unavailable: {str(exc).splitlines()[0]}", file=sys.stderr)
        return None


def run(quick: bool = False) -> list[dict[str, Any]]:
    """One row per workload and backend (none when Ray is not installed)."""
    try:
        import ray
    except ImportError:
        print("bench_ray: Ray is not installed (pip install 'aenv[ray]'); skipped", file=sys.stderr)
        return []
    from aenv.sync import get_runner
    from aenv.testing import LatencyEnv

    torch.set_num_threads(1)
    overhead = OVERHEAD_QUICK if quick else OVERHEAD
    cpu = CPU_QUICK if quick else CPU
    lat = LATENCY_QUICK if quick else LATENCY
    t0 = time.perf_counter()
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
    cluster_s = time.perf_counter() - t0
    runner = get_runner()
    rows: list[dict[str, Any]] = []
    try:
        gym = None if quick else _gym_peer(cpu)
        zero = [partial(LatencyEnv, latency=0.0) for _ in range(int(overhead["n_envs"]))]
        carts = [_cartpole] * int(cpu["n_envs"])
        ideal = ideal_throughput(int(lat["n_envs"]), float(lat["median"]), float(lat["sigma"]))
        backends = ("process", "ray")
        zero_res = runner.run(_rollout_rates, zero, (*backends, RAY_CALLS), overhead)
        cart_res = runner.run(_rollout_rates, carts, backends, cpu)
        lat_res = runner.run(_streamed_rates, backends, lat)
        for backend in (*backends, RAY_CALLS):
            res = zero_res[backend]
            rows.append(
                {
                    "workload": f"{overhead['n_envs']} zero-cost envs, rollout",
                    "backend": backend,
                    "env-steps/s": res["env_steps_per_s"],
                    "us per env-step": 1e6 / res["env_steps_per_s"],
                    **_cpu_cells(res),
                    "startup to first reset s": res["startup_s"],
                }
            )
        for backend in backends:
            res = cart_res[backend]
            rows.append(
                {
                    "workload": f"{cpu['n_envs']} CartPole-v1, rollout",
                    "backend": backend,
                    "env-steps/s": res["env_steps_per_s"],
                    "us per env-step": 1e6 / res["env_steps_per_s"],
                    "x process": res["env_steps_per_s"] / cart_res["process"]["env_steps_per_s"],
                    **_cpu_cells(res),
                    "startup to first reset s": res["startup_s"],
                }
            )
        for backend in backends:
            res = lat_res[backend]
            rows.append(
                {
                    "workload": f"{lat['n_envs']} latency envs (median 10 ms), streamed",
                    "backend": backend,
                    "env-steps/s": res["env_steps_per_s"],
                    "% of ideal": 100.0 * res["env_steps_per_s"] / ideal,
                    **_cpu_cells(res),
                    "startup to first reset s": res["startup_s"],
                }
            )
        if gym is not None:
            rate = gym["async_env_steps_per_s"]
            rows.append(
                {
                    "workload": f"{cpu['n_envs']} CartPole-v1, rollout",
                    "backend": f"Gymnasium AsyncVectorEnv ({cpu['n_envs']} processes)",
                    "env-steps/s": rate,
                    "us per env-step": 1e6 / rate,
                    "x process": rate / cart_res["process"]["env_steps_per_s"],
                    "startup to first reset s": gym.get("async_startup_s"),
                }
            )
        rows.append(
            {
                "workload": "local Ray cluster start (ray.init)",
                "backend": "ray",
                "startup to first reset s": cluster_s if started else None,
            }
        )
    finally:
        if started:
            ray.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run (smoke test)")
    args = parser.parse_args()
    print_table("Ray backend vs process backend (2 actors / 2 workers)", run(args.quick))


if __name__ == "__main__":
    main()
