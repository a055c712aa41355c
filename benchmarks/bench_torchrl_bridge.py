"""The TorchRL bridge's cost per step, each direction beside the wrapped env alone (same run).

* TorchRL -> aenv: a TorchRL ``GymEnv("CartPole-v1")`` stepped by TorchRL's own rollout,
  then the same env as ``TorchRLWrapper`` stepped by aenv's rollout (inline and in a worker
  thread, ``blocking``).
* aenv -> TorchRL: aenv's ``GymEnv("CartPole-v1")`` stepped by aenv's rollout (``SyncEnv``),
  then the same env through ``to_torchrl`` stepped by TorchRL's rollout; and, as the fairer
  baseline, TorchRL's own ``GymEnv`` in that same TorchRL loop.

Needs aenv and torchrl in one venv (``pip install -e ".[torchrl]"``; TorchRL pins tensordict
0.14.x, which aenv accepts). Run: ``python benchmarks/bench_torchrl_bridge.py [--quick]``.
Without torchrl, ``run`` returns no rows and says why.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import print_table  # noqa: E402


def _per_step_us(fn: Any, steps: int, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best / steps * 1e6


def run(quick: bool = False) -> list[dict[str, Any]]:
    try:
        import torchrl  # noqa: F401
    except ImportError:
        print("bench_torchrl_bridge: torchrl is not installed here; no rows")
        return []
    from torchrl.envs import GymEnv as TorchRLGymEnv

    from aenv.libs.gym import GymEnv
    from aenv.libs.torchrl import TorchRLWrapper, to_torchrl
    from aenv.sync import SyncEnv

    steps, repeats = (200, 2) if quick else (2000, 5)
    rows: list[dict[str, Any]] = []

    base = TorchRLGymEnv("CartPole-v1")
    alone = _per_step_us(lambda: base.rollout(steps, break_when_any_done=False), steps, repeats)
    for blocking in (False, True):
        wrapped = TorchRLWrapper(TorchRLGymEnv("CartPole-v1"), blocking=blocking)

        def bridged(env: Any = wrapped) -> Any:
            return asyncio.run(env.rollout(steps, break_when_any_done=False))

        t = _per_step_us(bridged, steps, repeats)
        rows.append(
            {
                "direction": "TorchRL -> aenv" + (" (thread)" if blocking else " (inline)"),
                "wrapped env alone (us/step)": round(alone, 1),
                "through the bridge (us/step)": round(t, 1),
                "overhead (us/step)": round(t - alone, 1),
            }
        )
    base.close()

    sync = SyncEnv(GymEnv("CartPole-v1"))
    alone = _per_step_us(lambda: sync.rollout(steps, break_when_any_done=False), steps, repeats)
    sync.close()
    tenv = to_torchrl(GymEnv("CartPole-v1"))
    t = _per_step_us(lambda: tenv.rollout(steps, break_when_any_done=False), steps, repeats)
    tenv.close()
    rows.append(
        {
            "direction": "aenv -> TorchRL",
            "wrapped env alone (us/step)": round(alone, 1),
            "through the bridge (us/step)": round(t, 1),
            "overhead (us/step)": round(t - alone, 1),
        }
    )
    # the same TorchRL loop over TorchRL's own GymEnv: what the bridge adds to a native env
    native = TorchRLGymEnv("CartPole-v1")
    t_native = _per_step_us(
        lambda: native.rollout(steps, break_when_any_done=False), steps, repeats
    )
    native.close()
    rows.append(
        {
            "direction": "aenv -> TorchRL, vs TorchRL's GymEnv in the same loop",
            "wrapped env alone (us/step)": round(t_native, 1),
            "through the bridge (us/step)": round(t, 1),
            "overhead (us/step)": round(t - t_native, 1),
        }
    )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    print_table(
        "TorchRL bridge: cost per step over the wrapped env alone", run(parser.parse_args().quick)
    )
