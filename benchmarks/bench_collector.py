"""Collectors on high-latency envs: aenv streaming vs aenv lockstep vs TorchRL.

``n_envs`` latency envs each take a lognormal step latency (median ``median``, log-std
``sigma``) and a small MLP policy (obs 4 -> 64 -> 64 -> action 1) picks the actions.

* aenv streaming: ``Collector`` on a coroutine ``AsyncEnvPool`` (the default on a pool): the
  policy runs on whatever envs are ready, each env is re-sent its action at once.
* aenv lockstep: the same ``Collector`` with ``streaming=False``: every time step awaits
  ``step_and_maybe_reset`` over the whole batch, so each step lasts as long as the slowest
  env's latency.
* TorchRL: the best TorchRL collector runnable on the same envs, measured in TorchRL's venv
  by ``benchmarks/peers/torchrl_collector_latency.py`` (through ``benchmarks/_peers.py``).

Each aenv collector runs batches of ``frames_per_batch`` frames for ``duration`` seconds;
reported: steady-state frames/s (from the end of the first batch, as the peer script
measures), its share of the ideal ``n_envs / E[latency]`` (a zero-overhead
framework re-sending each env the moment it returns) and the ratio to lockstep.
Targets: streaming >= 3x lockstep and >= 80% of ideal.

Run: ``python benchmarks/bench_collector.py [--quick]``
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks._common import ideal_throughput, print_table  # noqa: E402

FULL = {
    "n_envs": 256,
    "median": 0.02,
    "sigma": 1.0,
    "duration": 10.0,
    "frames_per_batch": 1024,
    "seed": 0,
}
QUICK = {
    "n_envs": 64,
    "median": 0.01,
    "sigma": 1.0,
    "duration": 2.0,
    "frames_per_batch": 256,
    "seed": 0,
}


def _policy() -> Any:
    from tensordict.nn import TensorDictModule
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    net.append(nn.Tanh())
    return TensorDictModule(net, in_keys=["observation"], out_keys=["action"])


async def _collect(streaming: bool, p: dict[str, Any]) -> dict[str, Any]:
    from aenv.collectors import Collector
    from aenv.pool import AsyncEnvPool
    from aenv.testing import LatencyEnv

    n = int(p["n_envs"])
    fns = [
        partial(LatencyEnv, median=p["median"], sigma=p["sigma"], seed=p["seed"] * 1_000_003 + i)
        for i in range(n)
    ]
    pool = AsyncEnvPool(fns, backend="coroutine")
    collector = Collector(
        pool,
        _policy(),
        frames_per_batch=int(p["frames_per_batch"]),
        total_frames=-1,
        streaming=streaming,
    )
    frames = batches = 0
    try:
        with torch.no_grad():
            # steady state, as the TorchRL peer reports: from the end of the first batch
            start = deadline = 0.0
            async for batch in collector:
                assert batch is not None
                now = time.perf_counter()
                if not batches:
                    start, deadline = now, now + float(p["duration"])
                else:
                    frames += batch.numel()
                batches += 1
                if now >= deadline:
                    break
            elapsed = now - start
    finally:
        await collector.ashutdown()
    return {"frames": frames, "elapsed_s": elapsed, "batches": batches}


def _peer(p: dict[str, Any], quick: bool) -> dict[str, Any] | None:
    from benchmarks._peers import run_peer

    keys = ("n_envs", "median", "sigma", "frames_per_batch", "seed")
    params = {k: p[k] for k in keys}
    try:
        return run_peer("torchrl_collector_latency", quick=quick, **params)  # type: ignore[no-any-return]
    except Exception as exc:  # a missing or failing peer is reported, not fatal
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure each collector; one row per collector (see the module docstring)."""
    from aenv.sync import get_runner

    torch.set_num_threads(1)
    p = QUICK if quick else FULL
    ideal = ideal_throughput(int(p["n_envs"]), float(p["median"]), float(p["sigma"]))
    results = {}
    for name, streaming in (("streaming", True), ("lockstep", False)):
        res = get_runner().run(_collect, streaming, p)
        results[name] = res["frames"] / res["elapsed_s"]
    lockstep = results["lockstep"]
    rows = []
    for name, label in (
        ("streaming", "aenv Collector (streaming, coroutine pool)"),
        ("lockstep", "aenv Collector (lockstep step, coroutine pool)"),
    ):
        rate = results[name]
        rows.append(
            {
                "benchmark": "collector",
                "framework": label,
                "n_envs": p["n_envs"],
                "frames/s": rate,
                "% of ideal": 100.0 * rate / ideal,
                "vs lockstep": rate / lockstep,
            }
        )
    peer = _peer(p, quick)
    if peer is None or "error" in peer or "frames_per_s" not in peer:
        why = "peer failed" if peer is None else peer.get("error", "no frames_per_s")
        rows.append({"benchmark": "collector", "framework": f"TorchRL: {why}"})
    else:
        rate = float(peer["frames_per_s"])
        rows.append(
            {
                "benchmark": "collector",
                "framework": f"TorchRL {peer.get('best', 'collector')} (threads/processes)",
                "n_envs": peer.get("n_envs_used", p["n_envs"]),
                "frames/s": rate,
                "% of ideal": peer.get("pct_of_ideal", 100.0 * rate / ideal),
                "vs lockstep": rate / lockstep,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    args = parser.parse_args()
    print_table(
        "Collectors on latency envs (targets: streaming >= 3x lockstep, >= 80% of ideal)",
        run(args.quick),
    )


if __name__ == "__main__":
    main()
