"""TorchRL's collector over its ``ParallelEnv`` of CartPole-v1 with a small MLP policy.

Builds ``ParallelEnv(n_envs, ...)`` (one process per env, TorchRL's defaults), a
``SyncDataCollector`` over it with ``_spin.mlp_policy`` (MLP 4 -> 64 -> 64 -> 2, greedy
one-hot action) and ``frames_per_batch`` frames per batch, and iterates batches without
grad. Reported: steady-state frames/s (frames after the first batch over the time since the
first batch came) and the driver's CPU time per batched step over the same span.

Params (JSON object in argv[1]):
    n_envs (int): worker processes, one CartPole each. Default 8; quick 2.
    frames_per_batch (int): frames per batch. Default 512; quick 64.
    batches (int): batches timed after the first. Default 40; quick 4.
    spin (int): turns of a Python loop before each env step (``_spin.make``, wrapped with
        TorchRL's ``GymWrapper``). Default 0 (TorchRL's own ``GymEnv("CartPole-v1")``).

Run: ``benchmarks/_venvs/torchrl/bin/python benchmarks/peers/torchrl_parallel_collector.py '{"quick": true}'``
"""

from __future__ import annotations

import functools
import time
from typing import Any

import _peerlib
from torchrl_parallel_cartpole import _make_cartpole, _make_spin_cartpole

DEFAULTS: dict[str, Any] = {"n_envs": 8, "frames_per_batch": 512, "batches": 40, "spin": 0}
QUICK: dict[str, Any] = {"n_envs": 2, "frames_per_batch": 64, "batches": 4}


def workload(p: dict[str, Any]) -> dict[str, Any]:
    import _spin
    import torch

    try:
        from torchrl.collectors import SyncDataCollector
    except ImportError:  # (renamed in later TorchRL releases)
        from torchrl.collectors import Collector as SyncDataCollector
    from torchrl.envs import ParallelEnv

    torch.set_num_threads(1)
    n_envs, iters = int(p["n_envs"]), int(p["spin"])
    make = functools.partial(_make_spin_cartpole, iters) if iters else _make_cartpole
    env = ParallelEnv(n_envs, make)
    env.set_seed(0)
    kwargs = {"frames_per_batch": int(p["frames_per_batch"]), "total_frames": -1}
    try:  # (no transforms added for the policy: the env is the same as aenv's)
        collector = SyncDataCollector(
            env, _spin.mlp_policy(), auto_register_policy_transforms=False, **kwargs
        )
    except TypeError:  # (a TorchRL without that option adds none)
        collector = SyncDataCollector(env, _spin.mlp_policy(), **kwargs)
    frames = 0
    try:
        with torch.no_grad():
            for i, batch in enumerate(collector):
                if i == 0:
                    t0, c0 = time.perf_counter(), time.thread_time()
                    continue
                frames += batch.numel()
                if i == int(p["batches"]):
                    break
            seconds, cpu = time.perf_counter() - t0, time.thread_time() - c0
    finally:
        collector.shutdown()
        if not env.is_closed:
            env.close()
    return {
        "frames_per_s": frames / seconds,
        "driver_cpu_us_per_batched_step": cpu / (frames / n_envs) * 1e6,
    }


if __name__ == "__main__":
    _peerlib.run_main(workload, DEFAULTS, QUICK)
