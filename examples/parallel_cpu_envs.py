"""CPU-bound envs on worker processes: SerialEnv vs ParallelEnv, same sync API.

``CpuBoundEnv`` spins the CPU in Python for 2 ms per step (holding the GIL), so threads
cannot overlap its steps; ``ParallelEnv`` hosts the envs in 2 worker processes, with
tensors going through shared memory.

Run: ``python examples/parallel_cpu_envs.py``
"""

from __future__ import annotations

import time
from functools import partial

from aenv import ParallelEnv, SerialEnv
from aenv.testing import CpuBoundEnv


def timed(env, steps: int) -> float:  # type: ignore[no-untyped-def]
    env.rollout(5, break_when_any_done=False)  # warm up
    t0 = time.perf_counter()
    env.rollout(steps, break_when_any_done=False)
    return env.batch_size[0] * steps / (time.perf_counter() - t0)


def main(n_envs: int = 4, steps: int = 50) -> None:
    make = partial(CpuBoundEnv, work_ms=2.0)
    with SerialEnv(n_envs, make) as env:
        serial = timed(env, steps)
    with ParallelEnv(n_envs, make, num_processes=2) as env:
        parallel = timed(env, steps)
        pids = env.worker_pids
    print(f"SerialEnv   {serial:8,.0f} env-steps/s (1 process)")
    print(f"ParallelEnv {parallel:8,.0f} env-steps/s (workers {pids})")


if __name__ == "__main__":  # spawned workers re-import this module: keep the guard
    main()
