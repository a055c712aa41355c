"""A GRPO-shaped agent loop: one coroutine per episode, groups of 4 per prompt, training.

The "LLM" is a tiny policy (one row of logits over the answers "0".."9" per prompt) that
answers arithmetic questions in a text env (``GuessTextEnv``: reward 1 for the right
answer, "try again" otherwise, at most 3 tries). Each call awaits a simulated model latency,
as a request to an inference server would. ``run_episodes`` runs every episode as its own
coroutine over a pool of 8 envs, refills each freed env with the next prompt, and hands out
each group of 4 episodes of a prompt as soon as it completes: the training step runs on it
right away (zero-mean group advantages, a policy-gradient update) while the other groups
still play. The episodes are written to JSONL at the end.

Run: ``python examples/agent_grpo_loop.py``
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from functools import partial
from pathlib import Path

import torch

from aenv.agents import Group, load_episodes, run_episodes, save_episodes
from aenv.pool import AsyncEnvPool
from aenv.testing import GuessTextEnv

QUESTIONS = [(a, b) for a in range(1, 5) for b in range(0, 5) if a + b < 10][:8]
PROMPTS = [{"prompt": f"{a} + {b} =", "target": str(a + b)} for a, b in QUESTIONS]
INDEX = {p["prompt"]: i for i, p in enumerate(PROMPTS)}


async def main(iterations: int = 12, group_size: int = 4) -> None:
    torch.manual_seed(0)
    rng = random.Random(0)
    logits = torch.zeros(len(PROMPTS), 10, requires_grad=True)  # the whole "model"
    opt = torch.optim.Adam([logits], lr=0.3)

    async def policy(td):
        await asyncio.sleep(rng.uniform(0.001, 0.005))  # the inference server's latency
        with torch.no_grad():
            probs = logits[INDEX[td["prompt"]]].softmax(-1)
        return str(int(torch.multinomial(probs, 1)))  # the action (the runner writes it)

    pool = AsyncEnvPool([partial(GuessTextEnv, max_steps=3)] * 8)
    kept = []
    async with pool:
        for it in range(iterations):
            rewards = []
            async with run_episodes(
                pool, policy, PROMPTS, group_size=group_size, emit="groups"
            ) as stream:
                async for group in stream:
                    assert isinstance(group, Group)
                    # train on this group now: its advantages have zero mean
                    adv = group.advantages()
                    logp = torch.stack(
                        [
                            sum(
                                logits[group.prompt_index].log_softmax(-1)[int(t.action["action"])]
                                for t in ep.turns
                            )
                            for ep in group.episodes
                        ]
                    )
                    loss = -(adv * logp).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    rewards.extend(group.rewards.tolist())
                    kept.extend(group.episodes)
            print(
                f"iteration {it:2d}: mean reward {sum(rewards) / len(rewards):.2f} over "
                f"{len(rewards)} episodes"
            )
    reasons = {r: sum(ep.done_reason == r for ep in kept) for r in ("terminated", "truncated")}
    print(f"done reasons: {reasons}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "episodes.jsonl"
        save_episodes(kept, path)
        back = load_episodes(path)
        print(f"wrote and read back {len(back)} episodes ({path.stat().st_size:,} bytes of JSONL)")
        print("first episode:", back[0].turns[0].observation["text"], "->", back[0].done_reason)


if __name__ == "__main__":
    asyncio.run(main())
