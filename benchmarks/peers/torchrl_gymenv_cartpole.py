"""TorchRL ``GymEnv("CartPole-v1")`` rollout against a raw gymnasium loop on the same env.

Times ``GymEnv("CartPole-v1").rollout(steps, break_when_any_done=False)`` (random actions
from the action spec; done episodes are reset inside the rollout), the same rollout with the
small torch policy ``bench_gym`` runs on aenv (``policy``), and a plain gymnasium loop
of ``steps`` ``env.step`` calls with actions drawn beforehand that resets on termination or
truncation. Reports steps/s for each (best of ``repeats`` after ``warmup``) and the ratio, i.e.
what TorchRL's wrapper costs per step.

Params (JSON object in argv[1]):
    steps (int): steps per timed run. Default 10000; quick 500.
    repeats (int): timed runs, the best is kept. Default 3; quick 1.
    warmup (int): untimed runs first. Default 1; quick 1.

Run: ``benchmarks/_venvs/torchrl/bin/python benchmarks/peers/torchrl_gymenv_cartpole.py '{"quick": true}'``
"""

from __future__ import annotations

from typing import Any

import _peerlib

DEFAULTS: dict[str, Any] = {"steps": 10_000, "repeats": 3, "warmup": 1}
QUICK: dict[str, Any] = {"steps": 500, "repeats": 1, "warmup": 1}


def workload(p: dict[str, Any]) -> dict[str, Any]:
    import gymnasium as gym
    import numpy as np
    import torch
    from _common import best_of
    from torchrl.envs import GymEnv

    steps, repeats, warmup = int(p["steps"]), int(p["repeats"]), int(p["warmup"])

    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    t_torchrl = best_of(
        lambda: env.rollout(steps, break_when_any_done=False), repeats=repeats, warmup=warmup
    )
    check = env.rollout(steps, break_when_any_done=False)
    assert check.batch_size == torch.Size([steps]), check.batch_size

    def policy(td: Any) -> Any:
        # (the same small torch policy bench_gym runs on aenv's GymEnv)
        idx = (td.get("observation")[2] > 0).long()
        td.set("action", torch.nn.functional.one_hot(idx, 2))
        return td

    t_policy = best_of(
        lambda: env.rollout(steps, policy, break_when_any_done=False),
        repeats=repeats,
        warmup=warmup,
    )
    env.close()

    raw = gym.make("CartPole-v1")
    actions = np.random.default_rng(0).integers(0, 2, size=steps).tolist()

    def raw_loop() -> None:
        raw.reset(seed=0)
        for a in actions:
            _, _, terminated, truncated, _ = raw.step(a)
            if terminated or truncated:
                raw.reset()

    t_raw = best_of(raw_loop, repeats=repeats, warmup=warmup)
    raw.close()
    return {
        "torchrl_gymenv_steps_per_s": steps / t_torchrl,
        "torchrl_gymenv_policy_steps_per_s": steps / t_policy,
        "raw_gymnasium_steps_per_s": steps / t_raw,
        "torchrl_us_per_step": 1e6 * t_torchrl / steps,
        "raw_us_per_step": 1e6 * t_raw / steps,
        "torchrl_slowdown_x": t_torchrl / t_raw,
    }


if __name__ == "__main__":
    _peerlib.run_main(workload, DEFAULTS, QUICK)
