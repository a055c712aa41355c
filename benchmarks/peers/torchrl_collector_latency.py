"""TorchRL collectors over blocking latency envs with a small MLP policy.

``n_envs`` ``LatencyEnv``s (obs dim 4, action dim 1) each ``time.sleep`` a lognormal latency
(``median``, ``sigma``; env ``i`` draws from ``numpy.random.default_rng([seed, i])``) in a
sync ``_step``. The policy is a ``TensorDictModule`` MLP 4 -> 64 -> 64 -> 1 (Tanh), run
without grad by the collectors. Each candidate collector gathers ``total_frames`` frames;
reported per candidate: frames/s overall (construction included) and in steady state (frames
after the first batch over the time since the first batch), the latter as % of the ideal
``n_envs / (median * exp(sigma**2 / 2))``. ``best`` names the fastest in steady state.

Candidates (the ones that run on a 2-core machine; 256 ``ParallelEnv`` processes do not fit):
    ``async_batched_mp``: ``AsyncBatchedCollector``, env workers are ``workers`` processes of
        ``n_envs / workers`` threaded envs each (shared-memory exchange), policy served from a
        thread of the driver. The fastest here with 4 workers.
    ``async_batched_threading``: ``AsyncBatchedCollector`` with a threading ``AsyncEnvPool``
        (one thread per env plus one coordinator thread per env).
    ``multi_async``: ``MultiAsyncCollector`` of ``workers`` processes, each a ``Collector``
        over a threading ``AsyncEnvPool`` of ``n_envs / workers`` envs (batch barrier per step).
    ``pool_collector``: ``Collector`` over one threading ``AsyncEnvPool`` of all envs (one
        barrier per batched step: each step waits for the slowest of ``n_envs`` envs).
``Collector`` over an ``AsyncEnvPool`` needs ``use_buffers=False`` in TorchRL 0.14.1 (its
preallocated buffer cannot hold the pool's non-tensor ``env_index``).

Params (JSON object in argv[1]):
    n_envs (int): envs. Default 256; quick 32.
    median (float): median step latency, seconds. Default 0.02; quick 0.01.
    sigma (float): log-std of the step latency. Default 1.0.
    total_frames (int): frames per candidate. Default 16384; quick 1024.
    frames_per_batch (int): frames per yielded batch. Default 1024; quick 128.
    workers (int): processes for ``async_batched_mp`` / ``multi_async``. Default 4; quick 2.
    candidates (list[str]): which to run. Default async_batched_mp, async_batched_threading,
        multi_async; quick async_batched_threading.
    seed (int): latency and policy seed. Default 0.

Run: ``benchmarks/_venvs/torchrl/bin/python benchmarks/peers/torchrl_collector_latency.py '{"quick": true}'``
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import _peerlib

DEFAULTS: dict[str, Any] = {
    "n_envs": 256,
    "median": 0.02,
    "sigma": 1.0,
    "total_frames": 16384,
    "frames_per_batch": 1024,
    "workers": 4,
    "candidates": ["async_batched_mp", "async_batched_threading", "multi_async"],
    "seed": 0,
}
QUICK: dict[str, Any] = {
    "n_envs": 32,
    "median": 0.01,
    "total_frames": 1024,
    "frames_per_batch": 128,
    "workers": 2,
    "candidates": ["async_batched_threading"],
}


def make_policy(seed: int = 0):
    """The MLP policy 4 -> 64 -> 64 -> 1 reading "observation" and writing "action"."""
    import torch
    from tensordict.nn import TensorDictModule
    from torch import nn

    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    return TensorDictModule(net, in_keys=["observation"], out_keys=["action"])


def _build(name: str, p: dict[str, Any]):
    from _torchrl_envs import LatencyEnv
    from torchrl.collectors import AsyncBatchedCollector, Collector, MultiAsyncCollector
    from torchrl.envs import AsyncEnvPool

    n_envs, workers = int(p["n_envs"]), int(p["workers"])
    makers = [
        partial(LatencyEnv, float(p["median"]), float(p["sigma"]), int(p["seed"]), i, 4)
        for i in range(n_envs)
    ]
    common = {
        "frames_per_batch": int(p["frames_per_batch"]),
        "total_frames": int(p["total_frames"]),
    }
    policy = make_policy(int(p["seed"]))
    if name == "async_batched_mp":
        return AsyncBatchedCollector(
            makers,
            policy=policy,
            env_backend="multiprocessing",
            envs_per_worker=-(-n_envs // workers),
            max_batch_size=n_envs,
            transport="driver",
            **common,
        )
    if name == "async_batched_threading":
        return AsyncBatchedCollector(
            makers, policy=policy, env_backend="threading", max_batch_size=n_envs, **common
        )
    if name == "multi_async":
        per = -(-n_envs // workers)
        groups = [makers[i : i + per] for i in range(0, n_envs, per)]
        return MultiAsyncCollector(
            [partial(AsyncEnvPool, g, backend="threading") for g in groups],
            policy,
            use_buffers=False,
            auto_register_policy_transforms=False,
            **common,
        )
    if name == "pool_collector":
        return Collector(
            AsyncEnvPool(makers, backend="threading"),
            policy,
            use_buffers=False,
            auto_register_policy_transforms=False,
            **common,
        )
    raise ValueError(f"unknown candidate {name!r}")


def _measure(name: str, p: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    collector = _build(name, p)
    frames = frames_after_first = 0
    t_first = None
    try:
        for batch in collector:
            n = batch.numel()
            frames += n
            if t_first is None:
                t_first = time.perf_counter()
            else:
                frames_after_first += n
        t_end = time.perf_counter()
    finally:
        collector.shutdown()
    assert t_first is not None and frames >= int(p["total_frames"]), frames
    steady = frames_after_first / (t_end - t_first) if t_end > t_first else float("nan")
    return {
        "frames": frames,
        "first_batch_s": t_first - t0,
        "overall_frames_per_s": frames / (t_end - t0),
        "steady_frames_per_s": steady,
    }


def workload(p: dict[str, Any]) -> dict[str, Any]:
    import warnings

    from _common import ideal_throughput

    warnings.filterwarnings("ignore", category=FutureWarning)
    ideal = ideal_throughput(int(p["n_envs"]), float(p["median"]), float(p["sigma"]))
    results: dict[str, Any] = {}
    for name in p["candidates"]:
        run = _measure(name, p)
        run["pct_of_ideal"] = 100.0 * run["steady_frames_per_s"] / ideal
        results[name] = run
    best = max(results, key=lambda k: results[k]["steady_frames_per_s"])
    return {
        "best": best,
        "frames_per_s": results[best]["steady_frames_per_s"],
        "pct_of_ideal": results[best]["pct_of_ideal"],
        "ideal_frames_per_s": ideal,
        "candidates": results,
    }


if __name__ == "__main__":
    _peerlib.run_main(workload, DEFAULTS, QUICK)
