"""A CleanRL-style Gymnasium vector loop running on an aenv pool.

Four CartPole envs live in an aenv coroutine pool (one could as well use the thread or the
process backend); ``to_gymnasium_vector`` hands the pool to code that speaks Gymnasium's
``VectorEnv`` API, with next-step autoreset as in Gymnasium 1.x.

Run: ``python examples/gymnasium_vector_loop.py``
"""

from __future__ import annotations

import numpy as np

from aenv import AsyncEnvPool, GymEnv, to_gymnasium_vector


def main(steps: int = 200) -> None:
    pool = AsyncEnvPool([lambda: GymEnv("CartPole-v1")] * 4)
    envs = to_gymnasium_vector(pool)
    obs, _ = envs.reset(seed=0)
    episodes, returns = 0, np.zeros(envs.num_envs)
    for _ in range(steps):
        obs, rewards, terminated, truncated, _ = envs.step(envs.action_space.sample())
        returns += rewards
        finished = terminated | truncated
        episodes += int(finished.sum())
        returns[finished] = 0.0
    print(f"{steps} vector steps, {episodes} finished episodes, obs {obs.shape}")
    envs.close()


if __name__ == "__main__":
    main()
