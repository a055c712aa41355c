"""Gymnasium vector envs of CartPole-v1: ``AsyncVectorEnv`` and ``SyncVectorEnv``.

For each kind, times construction plus the first ``reset(seed=0)`` (for ``AsyncVectorEnv``
this includes starting the worker processes, with gymnasium's default start method), then
``steps`` batched ``step`` calls with random actions drawn beforehand (one
``numpy.random.Generator.integers`` call; episodes end and auto-reset as gymnasium does by
default). Reports startup seconds and env-steps/s (``n_envs * steps / seconds``, best of
``repeats`` after ``warmup``). Needs only gymnasium and numpy, so it runs in either venv.

Params (JSON object in argv[1]):
    n_envs (int): sub-envs. Default 8; quick 2.
    steps (int): batched steps per timed run. Default 1000; quick 200.
    repeats (int): timed runs, the best is kept. Default 3; quick 1.
    warmup (int): untimed runs first. Default 1; quick 1.
    kinds (list[str]): which of "async", "sync" to run. Default both.
    spin (int): turns of a Python loop before each env step (``_spin.make``), to set the
        cost of a step. Default 0 (plain CartPole).

Run: ``python benchmarks/peers/gym_vector_cartpole.py '{"quick": true}'``
"""

from __future__ import annotations

import functools
import time
from typing import Any

import _peerlib
import _spin

DEFAULTS: dict[str, Any] = {
    "n_envs": 8,
    "steps": 1000,
    "repeats": 3,
    "warmup": 1,
    "kinds": ["async", "sync"],
    "spin": 0,
}
QUICK: dict[str, Any] = {"n_envs": 2, "steps": 200, "repeats": 1, "warmup": 1}


def _measure(kind: str, p: dict[str, Any]) -> dict[str, Any]:
    import gymnasium as gym
    import numpy as np
    from _common import best_of

    n_envs, steps = int(p["n_envs"]), int(p["steps"])
    fns = [functools.partial(_spin.make, int(p["spin"])) for _ in range(n_envs)]
    cls = gym.vector.AsyncVectorEnv if kind == "async" else gym.vector.SyncVectorEnv
    t0 = time.perf_counter()
    envs = cls(fns)
    try:
        envs.reset(seed=0)
        startup_s = time.perf_counter() - t0
        actions = np.random.default_rng(0).integers(0, 2, size=(steps, n_envs))

        def run() -> None:
            for a in actions:
                envs.step(a)

        seconds = best_of(run, repeats=int(p["repeats"]), warmup=int(p["warmup"]))
    finally:
        envs.close()
    return {"startup_s": startup_s, "env_steps_per_s": n_envs * steps / seconds}


def workload(p: dict[str, Any]) -> dict[str, Any]:
    import multiprocessing

    out: dict[str, Any] = {"start_method": multiprocessing.get_start_method()}
    for kind in p["kinds"]:
        if kind not in ("async", "sync"):
            raise ValueError(f"unknown kind {kind!r}")
        for key, value in _measure(kind, p).items():
            out[f"{kind}_{key}"] = value
    return out


if __name__ == "__main__":
    _peerlib.run_main(workload, DEFAULTS, QUICK)
