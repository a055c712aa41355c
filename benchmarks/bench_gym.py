"""GymEnv CartPole-v1 rollout: aenv vs TorchRL ``GymEnv`` vs a raw gymnasium loop, same run.

aenv: ``await GymEnv("CartPole-v1").rollout(steps, break_when_any_done=False)`` (random actions,
episodes reset inside the rollout), and with a small torch policy. TorchRL's ``GymEnv`` (random
actions, and the same policy) and the raw loop run in TorchRL's venv
(``benchmarks/peers/torchrl_gymenv_cartpole.py``); each aenv row's ratio is against TorchRL
running the same actions. The raw loop is also timed here, with the random actions and with
the policy (called on a TensorDict of each observation, the action taken back with
``argmax``: what a hand-written loop does), and each row's overhead per step is measured
against the raw loop running the same actions.

Run: ``python benchmarks/bench_gym.py [--quick]``
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
import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks._common import best_of, print_table  # noqa: E402

PEER = "torchrl_gymenv_cartpole"


def _peer(steps: int, repeats: int, quick: bool) -> dict[str, Any]:
    from benchmarks._peers import run_peer

    return run_peer(PEER, steps=steps, repeats=repeats, quick=quick)


def policy(td: Any) -> Any:
    """The small torch policy of the policy rows (the TorchRL peer runs the same one)."""
    idx = (td.get("observation")[2] > 0).long()
    td.set("action", torch.nn.functional.one_hot(idx, 2))
    return td


def _raw_rate(steps: int, repeats: int, with_policy: bool = False) -> float:
    """The raw gymnasium loop: pre-drawn random actions, or (``with_policy``) the policy
    above called on a TensorDict holding each observation, as a hand-written loop would."""
    import gymnasium as gym
    from tensordict import TensorDict

    raw = gym.make("CartPole-v1")
    actions = np.random.default_rng(0).integers(0, 2, size=steps).tolist()

    def loop() -> None:
        raw.reset(seed=0)
        for a in actions:
            _, _, terminated, truncated, _ = raw.step(a)
            if terminated or truncated:
                raw.reset()

    def policy_loop() -> None:
        obs, _ = raw.reset(seed=0)
        td = TensorDict({"observation": torch.from_numpy(obs)}, [])
        for _ in range(steps):
            action = int(policy(td).get("action").argmax())
            obs, _, terminated, truncated, _ = raw.step(action)
            if terminated or truncated:
                obs, _ = raw.reset()
            td.set("observation", torch.from_numpy(obs))

    return steps / best_of(policy_loop if with_policy else loop, repeats=repeats, warmup=1)


async def _aenv_rates(steps: int, repeats: int) -> dict[str, float]:
    from aenv.libs.gym import GymEnv

    env = GymEnv("CartPole-v1")
    await env.set_seed(0)

    async def timed(fn: Any) -> float:
        await fn(min(steps, 500))
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = await fn(steps)
            best = min(best, time.perf_counter() - t0)
            assert out.batch_size == (steps,)
        return steps / best

    rates = {
        "random": await timed(lambda n: env.rollout(n, break_when_any_done=False)),
        "policy": await timed(lambda n: env.rollout(n, policy, break_when_any_done=False)),
    }
    await env.aclose()
    return rates


def run(quick: bool = False) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    steps, repeats = (1000, 1) if quick else (10_000, 3)
    peer = _peer(steps, repeats, quick)
    ours = anyio.run(_aenv_rates, steps, repeats)
    raw = _raw_rate(steps, repeats)
    raw_policy = _raw_rate(steps, repeats, with_policy=True)
    torchrl = float(peer["torchrl_gymenv_steps_per_s"])
    torchrl_policy = float(peer["torchrl_gymenv_policy_steps_per_s"])
    raw_peer = float(peer["raw_gymnasium_steps_per_s"])
    rows: list[dict[str, Any]] = []
    # (each row against TorchRL running the same actions: random ones, or the same policy;
    # its overhead against the raw loop running them in this venv)
    variants = [
        ("aenv GymEnv.rollout (random actions)", ours["random"], torchrl, raw),
        ("aenv GymEnv.rollout (torch policy)", ours["policy"], torchrl_policy, raw_policy),
        ("TorchRL GymEnv.rollout (random actions)", torchrl, torchrl, raw),
        ("TorchRL GymEnv.rollout (torch policy)", torchrl_policy, torchrl_policy, raw_policy),
        ("raw gymnasium loop (aenv venv)", raw, torchrl, raw),
        ("raw gymnasium loop (TorchRL venv)", raw_peer, torchrl, raw),
        (
            "raw gymnasium loop + the same policy (aenv venv)",
            raw_policy,
            torchrl_policy,
            raw_policy,
        ),
    ]
    for name, rate, peer_rate, floor in variants:
        rows.append(
            {
                "benchmark": "gym_cartpole",
                "variant": name,
                "steps": steps,
                "steps/s": rate,
                "us/step": 1e6 / rate,
                "x TorchRL (same actions)": rate / peer_rate,
                "overhead us/step vs raw": 1e6 / rate - 1e6 / floor,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run (smoke test)")
    args = parser.parse_args()
    print_table("GymEnv CartPole-v1 rollout: aenv vs TorchRL vs raw gymnasium", run(args.quick))


if __name__ == "__main__":
    main()
