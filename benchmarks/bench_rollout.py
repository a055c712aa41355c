"""Single-env rollout speed: aenv vs TorchRL, same env logic, same run.

Compares ``await env.rollout(steps)`` (random actions, no policy, no early stop) on
aenv's ``PendulumEnv`` vs TorchRL's ``PendulumEnv``, and on a counting env written
identically for both (benchmarks/_aenv_envs.py vs benchmarks/peers/_torchrl_envs.py).
TorchRL runs in its own venv (benchmarks/_peers.py). Reports steps/s and the ratio.

Run: ``python benchmarks/bench_rollout.py [--quick]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import torch  # noqa: E402

from benchmarks._aenv_envs import BenchCountingEnv  # noqa: E402
from benchmarks._common import print_table  # noqa: E402


async def _aenv_rates(steps: int, repeats: int) -> dict[str, float]:
    from aenv import PendulumEnv

    out = {}
    for name, env in (("pendulum", PendulumEnv(seed=0)), ("counting", BenchCountingEnv())):
        await env.rollout(min(steps, 200), break_when_any_done=False)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            await env.rollout(steps, break_when_any_done=False)
            best = min(best, time.perf_counter() - t0)
        out[name] = steps / best
    return out


def run(quick: bool = False) -> list[dict[str, Any]]:
    from benchmarks._peers import run_peer

    torch.set_num_threads(1)
    steps, repeats = (200, 2) if quick else (1000, 5)
    ours = anyio.run(_aenv_rates, steps, repeats)
    peer = run_peer("torchrl_rollout", steps=steps, repeats=repeats, quick=quick)
    rows = []
    for name in ("pendulum", "counting"):
        theirs = peer[f"{name}_steps_per_s"]
        rows.append(
            {
                "benchmark": "rollout",
                "env": name,
                "steps": steps,
                "aenv steps/s": ours[name],
                "TorchRL steps/s": theirs,
                "aenv / TorchRL": ours[name] / theirs,
                "aenv us/step": 1e6 / ours[name],
                "TorchRL us/step": 1e6 / theirs,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    args = parser.parse_args()
    print_table("Single-env rollout: aenv vs TorchRL (target: >= 5x)", run(args.quick))


if __name__ == "__main__":
    main()
