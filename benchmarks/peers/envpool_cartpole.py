"""EnvPool's CartPole-v1: C++ envs stepped by EnvPool's own thread pool, gymnasium API.

Times ``envpool.make("CartPole-v1", env_type="gymnasium", ...)`` plus the first ``reset``
(startup), then ``steps`` batched ``step`` calls with random actions drawn beforehand
(EnvPool resets finished envs itself). Reports startup seconds and env-steps/s
(``n_envs * steps / seconds``, best of ``repeats`` after ``warmup``). EnvPool runs its envs
in C++, so this is a yardstick of what a native batched simulator reaches on this machine,
not a like-for-like comparison with Python envs. Runs in its own venv ("envpool").

Params (JSON object in argv[1]):
    n_envs (int): envs. Default 8; quick 8.
    threads (int): EnvPool worker threads. Default 2 (the machine's cores).
    steps (int): batched steps per timed run. Default 1000; quick 200.
    repeats (int): timed runs, the best is kept. Default 3; quick 1.
    warmup (int): untimed runs first. Default 1; quick 1.

Run: ``benchmarks/_venvs/envpool/bin/python benchmarks/peers/envpool_cartpole.py '{"quick": true}'``
"""

from __future__ import annotations

import time
from typing import Any

import _peerlib

DEFAULTS: dict[str, Any] = {"n_envs": 8, "threads": 2, "steps": 1000, "repeats": 3, "warmup": 1}
QUICK: dict[str, Any] = {"steps": 200, "repeats": 1, "warmup": 1}


def workload(p: dict[str, Any]) -> dict[str, Any]:
    import envpool
    import numpy as np
    from _common import best_of

    n_envs, steps = int(p["n_envs"]), int(p["steps"])
    t0 = time.perf_counter()
    envs = envpool.make(
        "CartPole-v1",
        env_type="gymnasium",
        num_envs=n_envs,
        batch_size=n_envs,
        num_threads=int(p["threads"]),
        seed=0,
    )
    envs.reset()
    startup_s = time.perf_counter() - t0
    actions = np.random.default_rng(0).integers(0, 2, size=(steps, n_envs)).astype(np.int32)

    def run() -> None:
        for a in actions:
            envs.step(a)

    seconds = best_of(run, repeats=int(p["repeats"]), warmup=int(p["warmup"]))
    envs.close()
    return {"startup_s": startup_s, "env_steps_per_s": n_envs * steps / seconds}


if __name__ == "__main__":
    _peerlib.run_main(workload, DEFAULTS, QUICK)
