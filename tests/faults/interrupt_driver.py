"""Ctrl-C at random moments during sync facade calls (run as a script by the tests).

``python interrupt_driver.py BACKEND ITERATIONS SEED [uvloop|asyncio] [MAX_DELAY] [P_ROLLOUT]``
sends SIGINT to itself at a random moment (seeded, up to ``MAX_DELAY`` seconds into the call,
default 0.025) during each call of a ``SerialEnv`` (coroutine, thread) or ``ParallelEnv``
(process) of counting envs on a runner with that loop (resets, steps and, with probability
``P_ROLLOUT``, default 0.5, rollouts), and checks every call after it: an
interrupted call raises ``KeyboardInterrupt`` (never an exception group), the next call
works, and each step's observation is the count of steps since its reset (a stale result
delivered into a later call would break the count). Prints one JSON line of figures.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time

import torch
from tensordict import TensorDict

from aenv.sync import Runner, get_runner
from aenv.sync._facades import SerialEnv
from aenv.testing import CountingEnv


class Interrupter:
    """Sends SIGINT to this process after a delay, unless disarmed first."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()

    def arm(self, delay: float) -> None:
        self.stop.clear()
        self.thread = threading.Thread(target=self._run, args=(delay,), daemon=True)
        self.thread.start()

    def _run(self, delay: float) -> None:
        if not self.stop.wait(delay):
            os.kill(os.getpid(), signal.SIGINT)

    def disarm(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


def main() -> None:
    # Python's own Ctrl-C handler, as in a terminal (a process started in the background
    # by a non-interactive shell inherits SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    backend, iterations, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    loop_kind = sys.argv[4] if len(sys.argv) > 4 else "uvloop"
    max_delay = float(sys.argv[5]) if len(sys.argv) > 5 else 0.025
    p_rollout = float(sys.argv[6]) if len(sys.argv) > 6 else 0.5
    import aenv.sync._runner as runner_mod

    runner_mod._default = Runner(use_uvloop=loop_kind == "uvloop")
    get_runner()
    rng = random.Random(seed)
    n = 3
    if backend == "process":
        from aenv.sync import ParallelEnv

        env = ParallelEnv(n, CountingEnv, {"max_steps": 10**9}, num_processes=1)
    else:
        env = SerialEnv(n, lambda: CountingEnv(max_steps=10**9), backend=backend)
    action = TensorDict(action=torch.zeros(n, 1, dtype=torch.int64), batch_size=[n])
    stats = {"calls": 0, "interrupted": 0, "groups": 0, "stale": 0, "other": []}
    intr = Interrupter()
    count = None  # steps since the last reset (None: a reset is due)
    t_end = time.monotonic() + 600
    # at least ``iterations`` calls, and on until a few were interrupted: on a quiet
    # machine a call can be quicker than most of the delays drawn, and the interrupter's
    # thread may start after the call returned
    while stats["calls"] < iterations or (
        stats["interrupted"] < 5 and stats["calls"] < 20 * iterations
    ):
        if time.monotonic() > t_end:
            break
        stats["calls"] += 1
        try:
            try:
                intr.arm(rng.uniform(0.0, max_delay))
                if rng.random() < p_rollout:
                    out = env.rollout(20)
                    obs = out["next", "observation"][:, -1]
                    expect = 20.0
                    first = out["next", "observation"][:, 0]
                    if not bool((first == 1.0).all()):
                        stats["stale"] += 1
                elif count is None:
                    out = env.reset()
                    obs = out["observation"]
                    expect = 0.0
                else:
                    out = env.step(action.clone())
                    obs = out["next", "observation"]
                    expect = count + 1.0
            finally:
                intr.disarm()
            if not bool((obs == expect).all()):
                stats["stale"] += 1
                count = None
            else:
                count = int(expect) if expect < 10**8 else None
        except KeyboardInterrupt:
            stats["interrupted"] += 1
            count = None  # the interrupted call may or may not have happened: reset
        except BaseExceptionGroup as exc:
            stats["groups"] += 1
            stats["other"].append(repr(exc)[:200])
            count = None
        except Exception as exc:
            stats["other"].append(f"{type(exc).__name__}: {str(exc)[:200]}")
            count = None
    env.close()
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    main()
