"""The gymnasium bridges against plain gymnasium, in one run on one machine.

* single env: a CartPole-v1 step loop on ``to_gymnasium(GymEnv("CartPole-v1"))`` vs the raw
  ``gymnasium.make`` env (random actions, resets on episode ends);
* vector: 8 CartPole-v1 behind gymnasium's ``RecordEpisodeStatistics`` vector wrapper, as
  training scripts use them: ``make_gymnasium_vector`` (aenv coroutine pool, infos not
  kept) and ``to_gymnasium_vector(GymEnv("CartPole-v1", num_envs=8))`` vs gymnasium's
  ``SyncVectorEnv`` and ``AsyncVectorEnv``.

Run: ``python benchmarks/bench_gymnasium_bridge.py [--quick]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks._common import best_of, print_table  # noqa: E402


def _single_rate(make: Any, steps: int, repeats: int) -> float:
    env = make()
    actions = np.random.default_rng(0).integers(0, 2, size=steps).tolist()

    def loop() -> None:
        env.reset(seed=0)
        for a in actions:
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()

    rate = steps / best_of(loop, repeats=repeats, warmup=1)
    env.close()
    return rate


def _vector_rate(make: Any, steps: int, repeats: int) -> float:
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    envs = RecordEpisodeStatistics(make())
    n = envs.num_envs
    actions = np.random.default_rng(0).integers(0, 2, size=(steps, n))

    def loop() -> None:
        envs.reset(seed=0)
        for a in actions:
            envs.step(a)

    rate = steps * n / best_of(loop, repeats=repeats, warmup=1)
    envs.close()
    return rate


def run(quick: bool = False) -> list[dict[str, Any]]:
    import gymnasium as gym

    from aenv.libs.gym import GymEnv, make_gymnasium_vector, to_gymnasium, to_gymnasium_vector

    torch.set_num_threads(1)
    steps, repeats = (500, 1) if quick else (5000, 3)
    rows: list[dict[str, Any]] = []
    raw = _single_rate(lambda: gym.make("CartPole-v1"), steps, repeats)
    bridged = _single_rate(lambda: to_gymnasium(GymEnv("CartPole-v1")), steps, repeats)
    for name, rate in (("gymnasium.make", raw), ("to_gymnasium(GymEnv)", bridged)):
        rows.append(
            {
                "benchmark": "single CartPole-v1",
                "variant": name,
                "env-steps/s": rate,
                "x plain gymnasium": rate / raw,
            }
        )
    fns = [lambda: gym.make("CartPole-v1")] * 8
    vsteps = steps // 8 * 2
    sync = _vector_rate(lambda: gym.vector.SyncVectorEnv(fns), vsteps, repeats)
    variants = [
        ("SyncVectorEnv", sync),
        ("AsyncVectorEnv", _vector_rate(lambda: gym.vector.AsyncVectorEnv(fns), vsteps, repeats)),
        (
            "make_gymnasium_vector (coroutine pool)",
            _vector_rate(lambda: make_gymnasium_vector(fns, keep_infos=False), vsteps, repeats),
        ),
        (
            "to_gymnasium_vector(GymEnv(num_envs=8))",
            _vector_rate(
                lambda: to_gymnasium_vector(GymEnv("CartPole-v1", num_envs=8)), vsteps, repeats
            ),
        ),
    ]
    async_rate = variants[1][1]
    for name, rate in variants:
        rows.append(
            {
                "benchmark": "8 CartPole-v1 + RecordEpisodeStatistics",
                "variant": name,
                "env-steps/s": rate,
                "x plain gymnasium": rate / sync,
                "x AsyncVectorEnv": rate / async_rate,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run (smoke test)")
    args = parser.parse_args()
    print_table("gymnasium bridges vs plain gymnasium", run(args.quick))


if __name__ == "__main__":
    main()
