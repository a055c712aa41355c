"""The gymnasium bridges against plain gymnasium, in one run on one machine.

* single env: a CartPole-v1 step loop (random actions, resets on episode ends) on
  ``to_gymnasium(GymEnv("CartPole-v1"))`` vs the raw ``gymnasium.make`` env;
* Stable-Baselines3: a short ``PPO.learn`` on the bridged env vs on the raw env (same seed);
* vector: 8 CartPole-v1 behind gymnasium's ``RecordEpisodeStatistics`` vector wrapper, as
  training scripts use them: ``make_gymnasium_vector`` (aenv coroutine pool, infos not
  kept), ``to_gymnasium_vector(SerialEnv(8, ...))`` and
  ``to_gymnasium_vector(GymEnv("CartPole-v1", num_envs=8))`` vs gymnasium's
  ``SyncVectorEnv`` and ``AsyncVectorEnv``.

The machine is shared: every variant of a table is built first, then timed in interleaved
rounds (one run of each per round, the order flipped every round), and each ratio is the median over rounds of the ratio
within a round, so that load that comes and goes hits both sides of a ratio alike. Ratios
are given on wall-clock time (what a script sees) and on CPU time (this process's and its
child processes', AsyncVectorEnv's workers included: what a step costs, which a loaded
machine does not blur).

Run: ``python benchmarks/bench_gymnasium_bridge.py [--quick]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks._common import print_table  # noqa: E402


def _single_loop(env: Any, steps: int) -> Callable[[], None]:
    actions = np.random.default_rng(0).integers(0, 2, size=steps).tolist()

    def loop() -> None:
        env.reset(seed=0)
        for a in actions:
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()

    return loop


def _vector_loop(envs: Any, steps: int) -> Callable[[], None]:
    actions = np.random.default_rng(0).integers(0, 2, size=(steps, envs.num_envs))

    def loop() -> None:
        envs.reset(seed=0)
        for a in actions:
            envs.step(a)

    return loop


def _cpu_seconds() -> float:
    """CPU seconds used so far by this process and its child processes (AsyncVectorEnv's
    workers, still running: read with psutil where it is installed)."""
    own = time.process_time()
    try:
        import psutil
    except ImportError:
        return own
    children = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:
            continue
        children += t.user + t.system
    return own + children


def _interleaved(
    loops: dict[str, Callable[[], None]], rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall-clock and CPU seconds of each loop per round, the loops taking turns (one
    warm-up run each)."""
    for loop in loops.values():
        loop()
    wall: dict[str, list[float]] = {name: [] for name in loops}
    cpu: dict[str, list[float]] = {name: [] for name in loops}
    names = list(loops)
    for r in range(rounds):
        # the order flips every round (A B, B A, ...): what running first or second costs
        # (a warm cache, a collection due) falls on each side alike
        for name in names if r % 2 == 0 else names[::-1]:
            loop = loops[name]
            c0, w0 = _cpu_seconds(), time.perf_counter()
            loop()
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(_cpu_seconds() - c0)
    return wall, cpu


def _ratio(times: dict[str, list[float]], name: str, base: str) -> float:
    """Median over rounds of ``base``'s time / ``name``'s time (> 1: ``name`` is faster)."""
    return statistics.median(b / t for b, t in zip(times[base], times[name], strict=True))


def _single(steps: int, rounds: int) -> list[dict[str, Any]]:
    import gymnasium as gym

    from aenv.libs.gym import GymEnv, to_gymnasium

    envs = {
        "gymnasium.make": gym.make("CartPole-v1"),
        "to_gymnasium(GymEnv)": to_gymnasium(GymEnv("CartPole-v1")),
    }
    times, cpu = _interleaved({k: _single_loop(e, steps) for k, e in envs.items()}, rounds)
    for env in envs.values():
        env.close()
    return [
        {
            "benchmark": "single CartPole-v1",
            "variant": name,
            "env-steps/s": steps / min(t),
            "x plain gymnasium": _ratio(times, name, "gymnasium.make"),
            "CPU x plain gymnasium": _ratio(cpu, name, "gymnasium.make"),
        }
        for name, t in times.items()
    ]


def _sb3(timesteps: int, rounds: int) -> list[dict[str, Any]]:
    try:
        from stable_baselines3 import PPO
        from stable_baselines3.common.logger import Logger
    except ImportError:
        return []  # (pip install 'aenv[sb3]')
    import gymnasium as gym

    from aenv.libs.gym import GymEnv, to_gymnasium

    makers: dict[str, Callable[[], Any]] = {
        "gymnasium.make": lambda: gym.make("CartPole-v1"),
        "to_gymnasium(GymEnv)": lambda: to_gymnasium(GymEnv("CartPole-v1")),
    }
    n_steps = min(512, timesteps)

    def learn(make: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            env = make()
            model = PPO(
                "MlpPolicy", env, n_steps=n_steps, batch_size=64, n_epochs=4, seed=0, device="cpu"
            )
            # a logger with no output: SB3's default one makes a folder in /tmp per model
            model.set_logger(Logger(folder=None, output_formats=[]))
            model.learn(total_timesteps=timesteps)
            env.close()

        return run

    times, cpu = _interleaved({k: learn(m) for k, m in makers.items()}, rounds)
    return [
        {
            "benchmark": f"SB3 PPO.learn({timesteps}) on CartPole-v1",
            "variant": name,
            "env-steps/s": timesteps / min(t),
            "x plain gymnasium": _ratio(times, name, "gymnasium.make"),
            "CPU x plain gymnasium": _ratio(cpu, name, "gymnasium.make"),
            "time / plain gymnasium's": 1 / _ratio(times, name, "gymnasium.make"),
        }
        for name, t in times.items()
    ]


def _vector(steps: int, rounds: int) -> list[dict[str, Any]]:
    import gymnasium as gym
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    from aenv.libs.gym import GymEnv, make_gymnasium_vector, to_gymnasium_vector
    from aenv.sync import SerialEnv

    fns = [lambda: gym.make("CartPole-v1")] * 8
    envs = {
        "SyncVectorEnv": gym.vector.SyncVectorEnv(fns),
        "AsyncVectorEnv": gym.vector.AsyncVectorEnv(fns),
        "make_gymnasium_vector (coroutine pool)": make_gymnasium_vector(fns, keep_infos=False),
        "to_gymnasium_vector(SerialEnv(8))": to_gymnasium_vector(
            SerialEnv(8, lambda: GymEnv("CartPole-v1", categorical_action_encoding=True))
        ),
        "to_gymnasium_vector(GymEnv(num_envs=8))": to_gymnasium_vector(
            GymEnv("CartPole-v1", num_envs=8)
        ),
    }
    wrapped = {k: RecordEpisodeStatistics(e) for k, e in envs.items()}
    times, cpu = _interleaved({k: _vector_loop(e, steps) for k, e in wrapped.items()}, rounds)
    for env in wrapped.values():
        env.close()
    return [
        {
            "benchmark": "8 CartPole-v1 + RecordEpisodeStatistics",
            "variant": name,
            "env-steps/s": steps * 8 / min(t),
            "x plain gymnasium": _ratio(times, name, "SyncVectorEnv"),
            "x AsyncVectorEnv": _ratio(times, name, "AsyncVectorEnv"),
            "CPU x AsyncVectorEnv": _ratio(cpu, name, "AsyncVectorEnv"),
        }
        for name, t in times.items()
    ]


def run(quick: bool = False) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    if quick:
        return [*_single(300, 1), *_sb3(128, 1), *_vector(40, 1)]
    return [*_single(20_000, 6), *_sb3(4096, 4), *_vector(2_000, 6)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run (smoke test)")
    args = parser.parse_args()
    print_table("gymnasium bridges vs plain gymnasium", run(args.quick))


if __name__ == "__main__":
    main()
