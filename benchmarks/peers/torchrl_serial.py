"""TorchRL ``SerialEnv`` of counting envs: batched rollout speed.

Measures ``SerialEnv(n_envs, CountingEnv).rollout(steps, break_when_any_done=False)`` with
random actions (no policy). Reports env-steps/s (``n_envs * steps / seconds``) of the best of
``repeats`` timed rollouts after ``warmup`` untimed ones.

Params (JSON object in argv[1]):
    n_envs (int): sub-envs. Default 8; quick 8.
    steps (int): batched steps per rollout. Default 1000; quick 100.
    repeats (int): timed rollouts, the best is kept. Default 3; quick 2.
    warmup (int): untimed rollouts first. Default 1; quick 1.

Run: ``benchmarks/_venvs/torchrl/bin/python benchmarks/peers/torchrl_serial.py '{"quick": true}'``
"""

from __future__ import annotations

from typing import Any

import _peerlib

DEFAULTS: dict[str, Any] = {"n_envs": 8, "steps": 1000, "repeats": 3, "warmup": 1}
QUICK: dict[str, Any] = {"n_envs": 8, "steps": 100, "repeats": 2, "warmup": 1}


def workload(p: dict[str, Any]) -> dict[str, Any]:
    import torch
    from _common import best_of
    from _torchrl_envs import CountingEnv
    from torchrl.envs import SerialEnv

    n_envs, steps = int(p["n_envs"]), int(p["steps"])
    max_count = max(10_000, steps + 1)
    env = SerialEnv(n_envs, lambda: CountingEnv(max_count=max_count))
    try:
        seconds = best_of(
            lambda: env.rollout(steps, break_when_any_done=False),
            repeats=int(p["repeats"]),
            warmup=int(p["warmup"]),
        )
        check = env.rollout(steps, break_when_any_done=False)
        assert check.batch_size == torch.Size([n_envs, steps]), check.batch_size
    finally:
        env.close()
    return {
        "env_steps_per_s": n_envs * steps / seconds,
        "batched_steps_per_s": steps / seconds,
    }


if __name__ == "__main__":
    _peerlib.run_main(workload, DEFAULTS, QUICK)
