"""TorchRL ``AsyncEnvPool`` (threading backend) in a lockstep agent loop: waves of episodes.

The TorchRL side of ``benchmarks/bench_agents.py``. ``concurrency`` envs run waves of
``concurrency`` episodes (``n_episodes`` in all), ``turns`` turns each. The latencies come
from ``_common.agent_schedule`` (the same draws as the aenv side): episode ``e`` is played by
env ``e % concurrency`` in wave ``e // concurrency``; its env step ``time.sleep``\\ s
``env[e, turn]`` (blocking, in the pool's thread). Each turn first waits the slowest
simulated policy call of the wave (the calls run concurrently, so a batch loop waits for
the last), then ``pool.step(td)`` over the whole batch. TorchRL has no per-episode runner,
so this lockstep batch loop is its closest equivalent. Reports the wall time.

Params (JSON object in argv[1]):
    n_episodes (int): episodes (a multiple of concurrency). Default 256; quick 64.
    turns (int): turns per episode. Default 8; quick 4.
    concurrency (int): envs (= threads). Default 64; quick 16.
    policy_median, policy_sigma (float): policy latency law. Default 0.2, 1.0; quick 0.02.
    env_median, env_sigma (float): env latency law. Default 0.05, 1.0; quick 0.005.
    seed (int): latency seed. Default 0.

Run: ``benchmarks/_venvs/torchrl/bin/python benchmarks/peers/torchrl_agents.py '{"quick": true}'``
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import _peerlib

DEFAULTS: dict[str, Any] = {
    "n_episodes": 256,
    "turns": 8,
    "concurrency": 64,
    "policy_median": 0.2,
    "policy_sigma": 1.0,
    "env_median": 0.05,
    "env_sigma": 1.0,
    "seed": 0,
}
QUICK: dict[str, Any] = {
    "n_episodes": 64,
    "turns": 4,
    "concurrency": 16,
    "policy_median": 0.02,
    "env_median": 0.005,
}


def _env_class() -> Any:
    import torch
    from tensordict import TensorDict, TensorDictBase
    from torchrl.data import Categorical, Composite, Unbounded
    from torchrl.envs import EnvBase

    class ReplayLatencyEnv(EnvBase):
        """Replays its episodes' env latencies (``time.sleep``); truncated after ``turns``."""

        def __init__(self, rows: list[list[float]], turns: int) -> None:
            super().__init__(batch_size=torch.Size([]))
            self.rows = rows  # one row of latencies per episode this env plays, in order
            self.turns = turns
            self.observation_spec = Composite(observation=Unbounded((1,), dtype=torch.float32))
            self.action_spec = Unbounded((1,), dtype=torch.float32)
            self.reward_spec = Unbounded((1,), dtype=torch.float32)
            self.full_done_spec = Composite(
                done=Categorical(2, (1,), dtype=torch.bool),
                terminated=Categorical(2, (1,), dtype=torch.bool),
                truncated=Categorical(2, (1,), dtype=torch.bool),
            )
            self.episode = -1
            self.count = 0

        def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
            self.episode += 1
            self.count = 0
            false = torch.zeros(1, dtype=torch.bool)
            return TensorDict(
                {
                    "observation": torch.zeros(1),
                    "done": false,
                    "terminated": false.clone(),
                    "truncated": false.clone(),
                },
                batch_size=self.batch_size,
            )

        def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
            time.sleep(self.rows[self.episode][self.count])
            self.count += 1
            trunc = torch.tensor([self.count >= self.turns])
            return TensorDict(
                {
                    "observation": torch.full((1,), float(self.count)),
                    "reward": torch.zeros(1),
                    "done": trunc,
                    "terminated": torch.zeros(1, dtype=torch.bool),
                    "truncated": trunc.clone(),
                },
                batch_size=self.batch_size,
            )

        def _set_seed(self, seed: int | None) -> None:
            return None

    return ReplayLatencyEnv


def workload(p: dict[str, Any]) -> dict[str, Any]:
    import torch
    from _common import agent_schedule
    from torchrl.envs import AsyncEnvPool

    n, turns, cap = int(p["n_episodes"]), int(p["turns"]), int(p["concurrency"])
    if n % cap:
        raise SystemExit("n_episodes must be a multiple of concurrency")
    policy_lat, env_lat = agent_schedule(
        int(p["seed"]),
        n,
        turns,
        (float(p["policy_median"]), float(p["policy_sigma"])),
        (float(p["env_median"]), float(p["env_sigma"])),
    )
    env_cls = _env_class()
    makers = [
        partial(env_cls, [env_lat[e].tolist() for e in range(i, n, cap)], turns) for i in range(cap)
    ]
    pool = AsyncEnvPool(makers, backend="threading")
    try:
        start = time.perf_counter()
        for wave in range(n // cap):
            td = pool.reset()
            rows = range(wave * cap, (wave + 1) * cap)
            for turn in range(turns):
                time.sleep(max(float(policy_lat[e, turn]) for e in rows))  # the batch's LLM call
                td["action"] = torch.zeros(cap, 1)
                td = pool.step_mdp(pool.step(td))
        elapsed = time.perf_counter() - start
    finally:
        pool.close()
    return {"seconds": elapsed, "episodes_per_s": n / elapsed}


if __name__ == "__main__":
    _peerlib.run_main(workload, DEFAULTS, QUICK)
