"""SerialEnv of 8 cheap envs: aenv's SerialEnv (sync facade) vs TorchRL's SerialEnv.

Both run ``env.rollout(steps, break_when_any_done=False)`` with random actions over
``n_envs`` counting envs written identically for both frameworks
(benchmarks/_aenv_envs.py vs benchmarks/peers/_torchrl_envs.py); the best of ``repeats``
timed rollouts after a warmup. Reported: env-steps/s (``n_envs * steps / seconds``).

A second row set compares 8 Gymnasium ``CartPole-v1`` envs, in the same process and the
same run: aenv's ``SerialEnv`` stepped as a Python training loop would step it
(``step_and_maybe_reset`` with ``rand_action``, one call per batch) and its ``rollout``,
against Gymnasium's ``SyncVectorEnv`` stepped with ``action_space.sample()`` (it resets
finished envs itself). Reported: env-steps/s and the ratio to ``SyncVectorEnv``.

Run: ``python benchmarks/bench_serial.py [--quick]``
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks._aenv_envs import BenchCountingEnv  # noqa: E402
from benchmarks._common import best_of, print_table  # noqa: E402

FULL = {"n_envs": 8, "steps": 1000, "repeats": 3, "warmup": 1}
QUICK = {"n_envs": 8, "steps": 100, "repeats": 2, "warmup": 1}


def _aenv_rate(p: dict[str, Any]) -> float:
    from aenv.sync import SerialEnv

    n, steps = int(p["n_envs"]), int(p["steps"])
    with SerialEnv(n, partial(BenchCountingEnv, max_count=max(10_000, steps + 1))) as env:
        seconds = best_of(
            lambda: env.rollout(steps, break_when_any_done=False),
            repeats=int(p["repeats"]),
            warmup=int(p["warmup"]),
        )
        check = env.rollout(steps, break_when_any_done=False)
        assert check.batch_size == torch.Size([n, steps]), check.batch_size
    return n * steps / seconds


def _cartpole_rates(p: dict[str, Any]) -> dict[str, float]:
    import gymnasium as gym

    from aenv.libs.gym import GymEnv
    from aenv.sync import SerialEnv

    n, steps = int(p["n_envs"]), int(p["steps"])
    out: dict[str, float] = {}
    with SerialEnv(n, partial(GymEnv, "CartPole-v1")) as env:
        env.set_seed(0)
        state = {"td": env.reset()}

        def loop() -> None:
            td = state["td"]
            for _ in range(steps):
                _, td = env.step_and_maybe_reset(env.rand_action(td))
            state["td"] = td

        kw = {"repeats": int(p["repeats"]), "warmup": int(p["warmup"])}
        out["loop"] = n * steps / best_of(loop, **kw)
        out["rollout"] = (
            n * steps / best_of(lambda: env.rollout(steps, break_when_any_done=False), **kw)
        )
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n)
    vec.reset(seed=0)

    def vec_loop() -> None:
        for _ in range(steps):
            vec.step(vec.action_space.sample())

    out["sync_vector"] = n * steps / best_of(vec_loop, **kw)
    vec.close()
    return out


def run(quick: bool = False) -> dict[str, list[dict[str, Any]]]:
    torch.set_num_threads(1)
    p = QUICK if quick else FULL
    ours = _aenv_rate(p)
    from benchmarks._peers import run_peer

    theirs = run_peer("torchrl_serial", quick=quick, **p)["env_steps_per_s"]
    rows = [
        {
            "benchmark": "serial",
            "n_envs": p["n_envs"],
            "steps": p["steps"],
            "aenv env-steps/s": ours,
            "TorchRL env-steps/s": theirs,
            "aenv / TorchRL": ours / theirs,
            "aenv us/batched step": 1e6 * p["n_envs"] / ours,
        }
    ]
    return {
        "counting envs vs TorchRL SerialEnv": rows,
        "CartPole-v1 vs Gymnasium SyncVectorEnv": _cartpole_rows(p),
    }


def _cartpole_rows(p: dict[str, Any]) -> list[dict[str, Any]]:
    rates = _cartpole_rates(p)
    base = rates["sync_vector"]
    return [
        {
            "benchmark": f"{p['n_envs']} CartPole-v1",
            "framework": name,
            "steps": p["steps"],
            "env-steps/s": rates[key],
            "x Gymnasium SyncVectorEnv": rates[key] / base,
        }
        for name, key in (
            ("aenv SerialEnv step_and_maybe_reset loop", "loop"),
            ("aenv SerialEnv.rollout", "rollout"),
            ("Gymnasium SyncVectorEnv step loop", "sync_vector"),
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    args = parser.parse_args()
    for title, rows in run(args.quick).items():
        print_table(f"SerialEnv of 8 envs: {title}", rows)


if __name__ == "__main__":
    main()
