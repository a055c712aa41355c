"""TorchRL ``ParallelEnv`` of gymnasium CartPole-v1: startup and batched rollout speed.

Builds ``ParallelEnv(n_envs, lambda: GymEnv("CartPole-v1"))`` and times construction plus the
first ``reset()`` (worker processes start there), then ``rollout(steps,
break_when_any_done=False)`` with random actions (done sub-envs are reset inside the rollout).
Reports startup seconds and env-steps/s (``n_envs * steps / seconds``) of the best of
``repeats`` timed rollouts after ``warmup`` untimed ones. TorchRL's own defaults are kept
(start method, shared memory buffers).

Params (JSON object in argv[1]):
    n_envs (int): worker processes, one CartPole each. Default 8; quick 2.
    steps (int): batched steps per rollout. Default 1000; quick 100.
    repeats (int): timed rollouts, the best is kept. Default 3; quick 1.
    warmup (int): untimed rollouts first. Default 1; quick 1.
    spin (int): turns of a Python loop before each env step (``_spin.make``, wrapped with
        TorchRL's ``GymWrapper``), to set the cost of a step. Default 0 (TorchRL's own
        ``GymEnv("CartPole-v1")``).

Run: ``benchmarks/_venvs/torchrl/bin/python benchmarks/peers/torchrl_parallel_cartpole.py '{"quick": true}'``
"""

from __future__ import annotations

import functools
import time
from typing import Any

import _peerlib

DEFAULTS: dict[str, Any] = {"n_envs": 8, "steps": 1000, "repeats": 3, "warmup": 1, "spin": 0}
QUICK: dict[str, Any] = {"n_envs": 2, "steps": 100, "repeats": 1, "warmup": 1}


def _make_cartpole():  # a module-level factory, so any start method can pickle it
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1")


def _make_spin_cartpole(iters: int):  # module level too, with its cost bound by partial
    import _spin
    from torchrl.envs import GymWrapper

    return GymWrapper(_spin.make(iters))


def _default_start_method() -> str:
    from torchrl._utils import _get_default_mp_start_method

    return str(_get_default_mp_start_method())


def workload(p: dict[str, Any]) -> dict[str, Any]:
    import torch
    from _common import best_of
    from torchrl.envs import ParallelEnv

    n_envs, steps = int(p["n_envs"]), int(p["steps"])
    t0 = time.perf_counter()
    iters = int(p["spin"])
    env = ParallelEnv(
        n_envs, functools.partial(_make_spin_cartpole, iters) if iters else _make_cartpole
    )
    try:
        env.set_seed(0)
        env.reset()
        startup_s = time.perf_counter() - t0
        seconds = best_of(
            lambda: env.rollout(steps, break_when_any_done=False),
            repeats=int(p["repeats"]),
            warmup=int(p["warmup"]),
        )
        check = env.rollout(steps, break_when_any_done=False)
        assert check.batch_size == torch.Size([n_envs, steps]), check.batch_size
        t_close = time.perf_counter()
    finally:
        env.close()
    return {
        "startup_s": startup_s,
        "env_steps_per_s": n_envs * steps / seconds,
        "batched_steps_per_s": steps / seconds,
        "close_s": time.perf_counter() - t_close,
        "start_method": getattr(env, "_mp_start_method", None) or _default_start_method(),
    }


if __name__ == "__main__":
    _peerlib.run_main(workload, DEFAULTS, QUICK)
