"""High-latency envs, streaming: aenv's AsyncEnvPool vs TorchRL's AsyncEnvPool (threading).

``n_envs`` latency envs each take a lognormal step latency (median ``median``, log-std
``sigma``). Both frameworks run the same send/recv loop for ``duration`` seconds: send a
step to every env, then repeatedly receive whatever finished (at least one) and re-send
those envs at once. Reported: env-steps/s and its share of the ideal ``n_envs / E[latency]``
(a zero-overhead framework). On the coroutine backend aenv's envs await their latency
(``aenv.testing.LatencyEnv``); on the thread backend they block in ``time.sleep``
(``SyncLatencyEnv``), like TorchRL's envs in its threads
(benchmarks/peers/torchrl_async_pool.py).

Run: ``python benchmarks/bench_pool_latency.py [--quick]``
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

from benchmarks._common import ideal_throughput, print_table, stream_steps  # noqa: E402

FULL = {"n_envs": 1024, "median": 0.05, "sigma": 1.0, "duration": 10.0, "seed": 0}
QUICK = {"n_envs": 64, "median": 0.01, "sigma": 1.0, "duration": 2.0, "seed": 0}


async def _stream(backend: str, p: dict[str, Any]) -> dict[str, Any]:
    from aenv.pool import AsyncEnvPool
    from aenv.testing import LatencyEnv, SyncLatencyEnv

    n = int(p["n_envs"])
    env_cls = SyncLatencyEnv if backend == "thread" else LatencyEnv
    fns = [
        partial(env_cls, median=p["median"], sigma=p["sigma"], seed=p["seed"] * 1_000_003 + i)
        for i in range(n)
    ]
    t_build = time.perf_counter()
    pool = AsyncEnvPool(fns, backend=backend)
    try:
        td = await pool.reset()
        startup = time.perf_counter() - t_build
        res = await stream_steps(pool, td, float(p["duration"]))
    finally:
        await pool.aclose()
    return {**res, "startup_s": startup}


def _peer(p: dict[str, Any], quick: bool) -> dict[str, Any]:
    from benchmarks._peers import run_peer

    return run_peer("torchrl_async_pool", quick=quick, **p)


def run(quick: bool = False) -> list[dict[str, Any]]:
    from aenv.sync import get_runner

    torch.set_num_threads(1)
    p = QUICK if quick else FULL
    ideal = ideal_throughput(int(p["n_envs"]), float(p["median"]), float(p["sigma"]))
    rows = []
    peer = _peer(p, quick)
    peer_rate = peer["env_steps_per_s"]
    for backend in ("coroutine", "thread"):
        res = get_runner().run(_stream, backend, p)
        rate = res["steps"] / res["elapsed_s"]
        rows.append(
            {
                "benchmark": "pool_latency",
                "framework": f"aenv AsyncEnvPool ({backend})",
                "n_envs": p["n_envs"],
                "env-steps/s": rate,
                "% of ideal": 100.0 * rate / ideal,
                "vs TorchRL": rate / peer_rate,
                "startup s": res["startup_s"],
                "mean batch": res["steps"] / max(res["recv_calls"], 1),
            }
        )
    rows.append(
        {
            "benchmark": "pool_latency",
            "framework": "TorchRL AsyncEnvPool (threading)",
            "n_envs": peer.get("n_envs_used", p["n_envs"]),
            "env-steps/s": peer_rate,
            "% of ideal": peer.get("pct_of_ideal"),
            "vs TorchRL": 1.0,
            "startup s": peer.get("startup_s"),
            "mean batch": peer.get("mean_recv_batch"),
        }
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    args = parser.parse_args()
    print_table(
        "High-latency envs, streaming: aenv vs TorchRL (target: >= 90% of ideal)", run(args.quick)
    )


if __name__ == "__main__":
    main()
