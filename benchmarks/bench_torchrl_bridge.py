"""The TorchRL bridge's cost per step, each direction beside the wrapped env alone (same run).

* TorchRL -> aenv: a TorchRL ``GymEnv("CartPole-v1")`` stepped by the barest loop
  (set the action, ``step``, then its ``"next"``, a reset at an episode end), then the same env as
  ``TorchRLWrapper`` stepped by aenv's rollout (inline and in a worker thread,
  ``blocking``); and the wrapper against TorchRL's own rollout of that env.
* aenv -> TorchRL: aenv's ``GymEnv("CartPole-v1")`` stepped by aenv's rollout (``SyncEnv``),
  then the same env through ``to_torchrl`` stepped by TorchRL's rollout; and, as the fairer
  baseline, TorchRL's own ``GymEnv`` in that same TorchRL loop.

How the figures are taken: every workload steps with the same cheap policy (actions drawn
from the action spec beforehand, cycled: no spec sampling inside the loops), no early stop;
the workloads run in interleaved rounds in one process (so machine load hits them alike),
each timed with ``time.process_time()`` (CPU of every thread of the process: the worker
thread of ``blocking`` included) and ``time.perf_counter()``; a figure is the best round,
per step. The overhead is the bridge's figure minus its baseline's, CPU and wall.

Needs aenv and torchrl in one venv (``pip install -e ".[torchrl]"``; TorchRL pins tensordict
0.14.x, which aenv accepts). Where this interpreter has no torchrl, ``run`` re-runs this
script under ``AENV_TORCHRL_PYTHON`` (a python with both; CI points it at ``.venv-torchrl``),
or, without it, returns no rows and says why.
Run: ``python benchmarks/bench_torchrl_bridge.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import print_table  # noqa: E402


def _interleaved(
    workloads: dict[str, Callable[[], Any]], steps: int, rounds: int
) -> dict[str, tuple[float, float]]:
    """``{name: (cpu µs/step, wall µs/step)}``: the best of ``rounds`` interleaved rounds."""
    for fn in workloads.values():
        fn()  # warm-up: first calls build caches and threads
    best = {name: [float("inf"), float("inf")] for name in workloads}
    for _ in range(rounds):
        for name, fn in workloads.items():
            c0, w0 = time.process_time(), time.perf_counter()
            fn()
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            best[name][0] = min(best[name][0], cpu)
            best[name][1] = min(best[name][1], wall)
    return {name: (cpu / steps * 1e6, wall / steps * 1e6) for name, (cpu, wall) in best.items()}


def _row(direction: str, alone: tuple[float, float], bridged: tuple[float, float]) -> dict:
    return {
        "direction": direction,
        "wrapped env alone (us/step, CPU)": round(alone[0], 1),
        "through the bridge (us/step, CPU)": round(bridged[0], 1),
        "overhead (us/step, CPU)": round(bridged[0] - alone[0], 1),
        "overhead (us/step, wall)": round(bridged[1] - alone[1], 1),
    }


def _measure(quick: bool) -> list[dict[str, Any]]:
    from torchrl.envs import GymEnv as TorchRLGymEnv

    from aenv.libs.gym import GymEnv
    from aenv.libs.torchrl import TorchRLWrapper, to_torchrl
    from aenv.sync import SyncEnv

    steps, rounds = (200, 2) if quick else (2000, 7)
    torchrl_env = TorchRLGymEnv("CartPole-v1")
    inline = TorchRLWrapper(TorchRLGymEnv("CartPole-v1"), blocking=False)
    threaded = TorchRLWrapper(TorchRLGymEnv("CartPole-v1"), blocking=True)
    aenv_env = SyncEnv(GymEnv("CartPole-v1"))
    bridged = to_torchrl(GymEnv("CartPole-v1"))

    def policy(env: Any) -> Callable[[Any], Any]:
        actions = itertools.cycle([env.action_spec.rand() for _ in range(16)])
        return lambda td: td.set("action", next(actions))

    def aenv_rollout(env: Any) -> Callable[[], Any]:
        act = policy(env)
        return lambda: asyncio.run(env.rollout(steps, act, break_when_any_done=False))

    def sync_rollout(env: Any) -> Callable[[], Any]:
        act = policy(env)
        return lambda: env.rollout(steps, act, break_when_any_done=False)

    bare_act = policy(torchrl_env)

    def bare_loop() -> None:
        td = torchrl_env.reset()
        for _ in range(steps):
            nxt = torchrl_env.step(bare_act(td))["next"]
            td = torchrl_env.reset() if bool(nxt["done"]) else nxt

    try:
        t = _interleaved(
            {
                "bare": bare_loop,
                "torchrl": sync_rollout(torchrl_env),
                "inline": aenv_rollout(inline),
                "thread": aenv_rollout(threaded),
                "aenv": sync_rollout(aenv_env),
                "to_torchrl": sync_rollout(bridged),
            },
            steps,
            rounds,
        )
    finally:
        for env in (torchrl_env, aenv_env, bridged):
            env.close()
        for wrapped in (inline, threaded):
            asyncio.run(wrapped.aclose())
    return [
        _row("TorchRL -> aenv (inline)", t["bare"], t["inline"]),
        _row("TorchRL -> aenv (thread)", t["bare"], t["thread"]),
        # aenv's rollout over the wrapper against TorchRL's own rollout of the env
        _row("TorchRL -> aenv (inline), vs TorchRL's own rollout", t["torchrl"], t["inline"]),
        _row("aenv -> TorchRL", t["aenv"], t["to_torchrl"]),
        # the same TorchRL loop over TorchRL's own GymEnv: what the bridge adds to a native env
        _row(
            "aenv -> TorchRL, vs TorchRL's GymEnv in the same loop", t["torchrl"], t["to_torchrl"]
        ),
    ]


def _in_torchrl_python(python: str, quick: bool) -> list[dict[str, Any]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [python, str(Path(__file__).resolve()), "--json", *(["--quick"] if quick else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"bench_torchrl_bridge under {python} failed (exit {proc.returncode}):\n"
            f"{proc.stderr[-3000:]}"
        )
    return list(json.loads(lines[-1]))


def run(quick: bool = False) -> list[dict[str, Any]]:
    try:
        import torchrl  # noqa: F401
    except ImportError:
        python = os.environ.get("AENV_TORCHRL_PYTHON")
        if not python:
            print(
                "bench_torchrl_bridge: torchrl is not installed here and AENV_TORCHRL_PYTHON "
                "names no python that has it; no rows"
            )
            return []
        return _in_torchrl_python(python, quick)
    return _measure(quick)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON line")
    args = parser.parse_args()
    rows = run(args.quick)
    if args.json:
        print(json.dumps(rows))
    else:
        print_table("TorchRL bridge: cost per step over the wrapped env alone", rows)
