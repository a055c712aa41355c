"""Agent loops: one coroutine per episode (aenv.agents) vs a lockstep batch loop vs TorchRL.

``n_episodes`` episodes of a text env (:class:`aenv.testing.GuessTextEnv`), ``turns``
turns each, at most ``concurrency`` at once (a pool of that many envs). Every turn awaits a
simulated LLM policy call (lognormal latency, median ``policy_median``, log-std
``policy_sigma``) and then the env's step (lognormal, ``env_median``, ``env_sigma``). The
latencies are drawn once (``benchmarks._common.agent_schedule``) and replayed by every
contender, episode ``e`` always getting row ``e``:

* aenv runner: ``aenv.agents.run_episodes``: one coroutine per episode, each awaiting its own
  policy call and ``pool.step_one``; a freed env takes the next prompt at once.
* ideal: each episode's latencies back to back, episodes taken in order by ``concurrency``
  slots the moment one is free, zero overhead (``ideal_makespan``).
* aenv lockstep: the classic batch loop on the same pool: waves of ``concurrency`` episodes,
  each turn awaiting every env's policy call (concurrently) and then ``pool.step`` over the
  batch, so each turn lasts as long as its slowest policy call plus its slowest env step.
* TorchRL: the same lockstep loop on TorchRL's ``AsyncEnvPool`` (threading backend; one env
  per slot replays the same env latencies with ``time.sleep``, the policy wait is the
  wave's slowest call of the turn), in TorchRL's venv (``benchmarks/peers/torchrl_agents.py``).
  TorchRL has no per-episode runner; its env is numeric (its pool does not carry text
  actions), which changes nothing that is timed here.

Targets: runner >= 95% of ideal and >= 1.8x lockstep.

Run: ``python benchmarks/bench_agents.py [--quick]``
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks._common import agent_schedule, ideal_makespan, print_table  # noqa: E402

FULL = {
    "n_episodes": 256,
    "turns": 8,
    "concurrency": 64,
    "policy_median": 0.2,
    "policy_sigma": 1.0,
    "env_median": 0.05,
    "env_sigma": 1.0,
    "seed": 0,
}
QUICK = {**FULL, "n_episodes": 64, "turns": 4, "concurrency": 16, "policy_median": 0.02}
QUICK["env_median"] = 0.005


def _prompts(p: dict[str, Any], env_lat: Any) -> list[dict[str, Any]]:
    return [
        {
            "prompt": f"question {e}",
            "target": "never said",  # every episode runs its full ``turns`` turns
            "episode": torch.tensor([e]),
            "latencies": torch.tensor(env_lat[e], dtype=torch.float64),
        }
        for e in range(int(p["n_episodes"]))
    ]


def _pool(p: dict[str, Any]) -> Any:
    from aenv.pool import AsyncEnvPool
    from aenv.testing import GuessTextEnv

    return AsyncEnvPool([partial(GuessTextEnv, max_steps=int(p["turns"]))] * int(p["concurrency"]))


async def _answer(td: Any, policy_lat: Any) -> str:
    """The simulated LLM call: wait the episode's latency for this turn, answer."""
    e = int(td["episode"].reshape(-1)[0])
    turn = td["text"].count("\n> ")
    await asyncio.sleep(float(policy_lat[e, turn]))
    return f"answer {turn}"


async def _runner(
    p: dict[str, Any], policy_lat: Any, env_lat: Any, stats: dict[str, float] | None = None
) -> float:
    """The runner's seconds (``stats``, if given, gets its CPU seconds: ``"cpu"``)."""
    from aenv.agents import run_episodes

    async def policy(td: Any) -> str:
        return await _answer(td, policy_lat)  # the action: the runner writes it

    pool = _pool(p)
    async with pool:
        start, cpu = time.perf_counter(), time.process_time()
        n = 0
        async with run_episodes(pool, policy, _prompts(p, env_lat), emit="episodes") as stream:
            async for ep in stream:
                assert len(ep) == p["turns"] and ep.done_reason == "truncated", ep.done_reason
                n += 1
        elapsed = time.perf_counter() - start
        if stats is not None:
            stats["cpu"] = time.process_time() - cpu
    assert n == p["n_episodes"]
    return elapsed


async def _limit(
    p: dict[str, Any], policy_lat: Any, env_lat: Any, stats: dict[str, float] | None = None
) -> float:
    """The runner's limit: the same episodes with no pool and no runner, one plain task per
    slot taking the next prompt, calling the same env's ``_reset`` / ``_step`` hooks (its
    latencies, its tensordicts) and the same policy. Seconds (``stats`` as :func:`_runner`)."""
    from tensordict import TensorDict

    from aenv._mdp_tree import non_tensor
    from aenv.agents._groups import prompt_tensordict
    from aenv.testing import GuessTextEnv

    turns = int(p["turns"])
    envs = [GuessTextEnv(max_steps=turns) for _ in range(int(p["concurrency"]))]
    prompts = _prompts(p, env_lat)
    todo = iter(prompts)

    async def slot(env: Any) -> None:
        for prompt in todo:
            td = await env._reset(prompt_tensordict(prompt, torch.Size()))
            for _ in range(turns):
                td._tensordict["episode"] = prompt["episode"]  # (what _answer reads)
                action = await _answer(td, policy_lat)
                td = await env._step(TensorDict({"action": non_tensor(action)}, []))

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(slot(env) for env in envs))
    elapsed = time.perf_counter() - start
    if stats is not None:
        stats["cpu"] = time.process_time() - cpu
    return elapsed


async def _lockstep(p: dict[str, Any], policy_lat: Any, env_lat: Any) -> float:
    from tensordict import NonTensorStack

    from aenv.agents._groups import prompt_tensordict

    pool = _pool(p)
    cap, turns = int(p["concurrency"]), int(p["turns"])
    prompts = _prompts(p, env_lat)
    async with pool:
        start = time.perf_counter()
        for wave in range(0, len(prompts), cap):
            batch = prompts[wave : wave + cap]
            tds = await asyncio.gather(
                *(
                    pool.reset_one(i, prompt_tensordict(pr, torch.Size()))
                    for i, pr in enumerate(batch)
                )
            )
            td = torch.stack(tds, 0)
            if len(batch) < cap:
                raise ValueError("n_episodes must be a multiple of concurrency")
            for _ in range(turns):
                answers = await asyncio.gather(*(_answer(td[i], policy_lat) for i in range(cap)))
                td.set("action", NonTensorStack(*answers))
                td = pool.step_mdp(await pool.step(td))
        elapsed = time.perf_counter() - start
    return elapsed


def _peer(p: dict[str, Any], quick: bool) -> dict[str, Any]:
    from benchmarks._peers import run_peer

    try:
        return run_peer("torchrl_agents", quick=quick, **{k: v for k, v in p.items()})  # type: ignore[no-any-return]
    except Exception as exc:  # a missing or failing peer is reported, not fatal
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Time each contender; one row each (see the module docstring)."""
    from aenv.sync import get_runner

    torch.set_num_threads(1)
    p = QUICK if quick else FULL
    n, turns, cap = int(p["n_episodes"]), int(p["turns"]), int(p["concurrency"])
    policy_lat, env_lat = agent_schedule(
        int(p["seed"]),
        n,
        turns,
        (float(p["policy_median"]), float(p["policy_sigma"])),
        (float(p["env_median"]), float(p["env_sigma"])),
    )
    ideal = ideal_makespan(policy_lat.sum(1) + env_lat.sum(1), cap)
    runner = get_runner().run(_runner, p, policy_lat, env_lat)
    lockstep = get_runner().run(_lockstep, p, policy_lat, env_lat)
    rows = []

    def row(name: str, seconds: float) -> dict[str, Any]:
        return {
            "benchmark": "agents",
            "framework": name,
            "episodes": n,
            "turns": turns,
            "concurrency": cap,
            "seconds": seconds,
            "episodes/s": n / seconds,
            "% of ideal": 100.0 * ideal / seconds,
            "vs lockstep": lockstep / seconds,
        }

    rows.append(row("ideal (replayed latencies, zero overhead)", ideal))
    rows.append(row("aenv run_episodes (one coroutine per episode)", runner))
    rows.append(row("aenv lockstep batch loop (same pool)", lockstep))
    peer = _peer(p, quick)
    if "seconds" in peer:
        rows.append(
            row("TorchRL AsyncEnvPool, lockstep batch loop (threads)", float(peer["seconds"]))
        )
    else:
        rows.append({"benchmark": "agents", "framework": f"TorchRL: {peer.get('error')}"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    args = parser.parse_args()
    print_table("Agent loops (targets: runner >= 95% of ideal, >= 1.8x lockstep)", run(args.quick))


if __name__ == "__main__":
    main()
