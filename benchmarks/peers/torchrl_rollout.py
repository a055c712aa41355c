"""TorchRL single-env rollout speed: ``PendulumEnv`` and a minimal counting env.

Measures ``env.rollout(steps)`` (random actions, no policy) on TorchRL's stateless
``PendulumEnv`` (``batch_size=[]``) and on ``CountingEnv`` (an ``EnvBase`` subclass that is
never done within the run; ``break_when_any_done=False``). Reports steps/s of the best of
``repeats`` timed rollouts after ``warmup`` untimed ones.

Params (JSON object in argv[1]):
    steps (int): rollout length. Default 1000; quick 200.
    repeats (int): timed rollouts, the best is kept. Default 5; quick 2.
    warmup (int): untimed rollouts first. Default 1; quick 1.

Run: ``benchmarks/_venvs/torchrl/bin/python benchmarks/peers/torchrl_rollout.py '{"quick": true}'``
"""

from __future__ import annotations

from typing import Any

import _peerlib

DEFAULTS: dict[str, Any] = {"steps": 1000, "repeats": 5, "warmup": 1}
QUICK: dict[str, Any] = {"steps": 200, "repeats": 2, "warmup": 1}


def workload(p: dict[str, Any]) -> dict[str, Any]:
    import torch
    from _common import best_of
    from _torchrl_envs import CountingEnv
    from torchrl.envs import PendulumEnv

    steps = int(p["steps"])
    pendulum = PendulumEnv()
    pendulum.set_seed(0)
    t_pend = best_of(
        lambda: pendulum.rollout(steps), repeats=int(p["repeats"]), warmup=int(p["warmup"])
    )
    counting = CountingEnv(max_count=max(10_000, steps + 1))
    t_count = best_of(
        lambda: counting.rollout(steps, break_when_any_done=False),
        repeats=int(p["repeats"]),
        warmup=int(p["warmup"]),
    )
    check = counting.rollout(steps, break_when_any_done=False)
    assert check.batch_size == torch.Size([steps]), check.batch_size
    return {
        "pendulum_steps_per_s": steps / t_pend,
        "counting_steps_per_s": steps / t_count,
        "pendulum_us_per_step": 1e6 * t_pend / steps,
        "counting_us_per_step": 1e6 * t_count / steps,
    }


if __name__ == "__main__":
    _peerlib.run_main(workload, DEFAULTS, QUICK)
