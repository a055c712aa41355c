"""TorchRL ``AsyncEnvPool`` (threading backend) over blocking latency envs: send/recv loop.

``n_envs`` ``LatencyEnv``s each ``time.sleep`` a lognormal latency (``median``, ``sigma``;
env ``i`` draws from ``numpy.random.default_rng([seed, i])``) in ``_step``. The loop sends a
step to every env, then for ``duration`` seconds repeatedly calls ``async_step_recv()`` (which
returns every env that has finished, at least one) and at once re-sends those envs their next
step (``pool.step_mdp(out)`` with a fresh action). Reports completed env-steps/s and that rate
as a percentage of the ideal ``n_envs / (median * exp(sigma**2 / 2))``.

If the pool cannot be built or run with ``n_envs`` threads, the script halves ``n_envs``
until it works and reports ``fallback_reason``.

Params (JSON object in argv[1]):
    n_envs (int): envs (= threads). Default 1024; quick 64.
    median (float): median step latency, seconds. Default 0.05; quick 0.01.
    sigma (float): log-std of the step latency. Default 1.0; quick 1.0.
    duration (float): measured seconds. Default 10.0; quick 2.0.
    seed (int): latency seed. Default 0.

Run: ``benchmarks/_venvs/torchrl/bin/python benchmarks/peers/torchrl_async_pool.py '{"quick": true}'``
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import _peerlib

DEFAULTS: dict[str, Any] = {
    "n_envs": 1024,
    "median": 0.05,
    "sigma": 1.0,
    "duration": 10.0,
    "seed": 0,
}
QUICK: dict[str, Any] = {"n_envs": 64, "median": 0.01, "sigma": 1.0, "duration": 2.0}


def _measure(n_envs: int, p: dict[str, Any]) -> dict[str, Any]:
    import torch
    from _torchrl_envs import LatencyEnv
    from torchrl.envs import AsyncEnvPool

    makers = [
        partial(LatencyEnv, float(p["median"]), float(p["sigma"]), int(p["seed"]), i, 1)
        for i in range(n_envs)
    ]
    t_build = time.perf_counter()
    pool = AsyncEnvPool(makers, backend="threading")
    try:
        td = pool.reset()
        startup_s = time.perf_counter() - t_build
        td["action"] = torch.zeros(n_envs, 1)
        steps = recvs = 0
        start = time.perf_counter()
        deadline = start + float(p["duration"])
        pool.async_step_send(td)
        while True:
            out = pool.async_step_recv()
            now = time.perf_counter()
            steps += out.shape[0]
            recvs += 1
            if now >= deadline:
                break
            nxt = pool.step_mdp(out)
            nxt["action"] = torch.zeros(out.shape[0], 1)
            pool.async_step_send(nxt)
        elapsed = now - start
    finally:
        pool.close()
    return {
        "steps": steps,
        "elapsed_s": elapsed,
        "startup_s": startup_s,
        "recv_calls": recvs,
        "mean_recv_batch": steps / max(recvs, 1),
    }


def workload(p: dict[str, Any]) -> dict[str, Any]:
    from _common import ideal_throughput

    requested = int(p["n_envs"])
    n_envs, reasons = requested, []
    while True:
        try:
            run = _measure(n_envs, p)
            break
        except Exception as exc:
            reasons.append(f"n_envs={n_envs}: {type(exc).__name__}: {exc}"[:500])
            if n_envs <= 1:
                raise
            n_envs //= 2
    rate = run["steps"] / run["elapsed_s"]
    ideal = ideal_throughput(n_envs, float(p["median"]), float(p["sigma"]))
    return {
        "env_steps_per_s": rate,
        "ideal_env_steps_per_s": ideal,
        "pct_of_ideal": 100.0 * rate / ideal,
        "n_envs_requested": requested,
        "n_envs_used": n_envs,
        "fallback_reason": "; ".join(reasons) or None,
        **run,
    }


if __name__ == "__main__":
    _peerlib.run_main(workload, DEFAULTS, QUICK)
