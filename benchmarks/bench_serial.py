"""SerialEnv of 8 cheap envs: aenv's SerialEnv (sync facade) vs TorchRL's SerialEnv.

Both run ``env.rollout(steps, break_when_any_done=False)`` with random actions over
``n_envs`` counting envs written identically for both frameworks
(benchmarks/_aenv_envs.py vs benchmarks/peers/_torchrl_envs.py); the best of ``repeats``
timed rollouts after a warmup. Reported: env-steps/s (``n_envs * steps / seconds``).

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


def run(quick: bool = False) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    p = QUICK if quick else FULL
    ours = _aenv_rate(p)
    from benchmarks._peers import run_peer

    theirs = run_peer("torchrl_serial", quick=quick, **p)["env_steps_per_s"]
    return [
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    args = parser.parse_args()
    print_table("SerialEnv of 8 cheap envs: aenv vs TorchRL (target: >= 10x)", run(args.quick))


if __name__ == "__main__":
    main()
