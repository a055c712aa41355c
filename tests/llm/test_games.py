"""The built-in text envs: guess-the-number and LLMHashingEnv."""

from __future__ import annotations

import re
from functools import partial

import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from aenv import AsyncEnvPool, acheck_env_specs
from aenv.llm import GuessNumberEnv, LLMHashingEnv, get_data, get_text


def bisect_policy(bounds):
    """Binary search from each env's feedback (bounds: per env [lo, hi], updated)."""

    def policy(td):
        hist = get_data(td, "history")
        guesses = []
        for i, h in enumerate(hist):
            lo, hi = bounds[i]
            if len(h) > 1:
                last_guess = int(re.search(r"-?\d+", h[-2].content).group())
                if h[-1].content == "higher":
                    lo = last_guess + 1
                elif h[-1].content == "lower":
                    hi = last_guess - 1
            bounds[i] = [lo, hi]
            guesses.append(str((lo + hi) // 2))
        return td.set("response", NonTensorStack.from_list(guesses))

    return policy


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_bisection_solves_guess_the_number(backend):
    opts = {"num_workers": 1, "start_method": "forkserver"} if backend == "process" else {}
    n = 4
    async with AsyncEnvPool(
        [partial(GuessNumberEnv, low=1, high=100, max_turns=7)] * n, backend=backend, **opts
    ) as pool:
        await pool.set_seed(3)
        td = await pool.reset()
        policy = bisect_policy([[1, 100] for _ in range(n)])
        solved = torch.zeros(n, dtype=torch.bool)
        for _ in range(7):
            out = await pool.step(policy(td))
            solved |= out["next", "reward"].squeeze(-1) == 1.0
            if bool(out["next", "done"].all()):
                break
            td = pool.step_mdp(out)
    assert bool(solved.all())  # log2(100) < 7 guesses
    final = get_data(out["next"], "history")
    assert all(h[-1].content == "correct" for h in final)


async def test_guess_feedback_and_truncation():
    env = GuessNumberEnv(low=1, high=10, max_turns=2)
    td = await env.reset(TensorDict(answer=NonTensorData(4)))
    td["response"] = NonTensorData("no idea")
    out = await env.step(td)
    assert get_data(out["next"], "history")[-1].content == "Answer with a number."
    td = out["next"].clone()
    td["response"] = NonTensorData("I say 9")
    out = await env.step(td)
    assert get_data(out["next"], "history")[-1].content == "lower"
    assert out["next", "truncated"].item() and out["next", "reward"].item() == 0.0
    with pytest.raises(ValueError, match="high"):
        GuessNumberEnv(low=5, high=1)


async def test_secret_follows_the_seed():
    async def secret(seed):
        env = GuessNumberEnv()
        await env.set_seed(seed)
        await env.reset()
        return env.secret

    assert await secret(1) == await secret(1)
    assert len({await secret(s) for s in range(10)}) > 1


async def test_hash_identifies_the_sequence_whatever_the_path():
    env = LLMHashingEnv(prompt="ab")
    await acheck_env_specs(env)
    td = await env.reset()
    td["action"] = torch.tensor(ord("c"))
    via_step = (await env.step(td))["next"]
    via_reset = await env.reset(TensorDict(text=NonTensorData("abc")))
    assert get_text(via_step, "text") == "abc" == get_text(via_reset, "text")
    assert via_step["hash"].item() == via_reset["hash"].item()
    assert via_step["hash"].item() == LLMHashingEnv.hash_tokens(b"abc")
    assert via_step["hash"].item() != LLMHashingEnv.hash_tokens(b"acb")
    td = via_reset.clone()
    td["action"] = torch.tensor(300)
    with pytest.raises(ValueError, match="token id"):
        await env.step(td)


@pytest.mark.timeout(120)
async def test_hashing_env_in_a_process_pool_with_eos():
    fns = [partial(LLMHashingEnv, prompt=p, eos_token=ord("."), max_tokens=3) for p in ("x", "yy")]
    async with AsyncEnvPool(
        fns, backend="process", num_workers=1, start_method="forkserver"
    ) as pool:
        td = await pool.reset()
        outs = []
        for ch in ("a", "."):
            td["action"] = torch.tensor([ord(ch)] * 2)
            out = await pool.step(td)
            outs.append(out)
            td = pool.step_mdp(out)
    assert get_text(outs[-1]["next"], "text") == ["xa.", "yya."]
    assert outs[-1]["next", "terminated"].squeeze(-1).tolist() == [True, True]
    assert outs[-1]["next", "hash"].squeeze(-1).tolist() == [
        LLMHashingEnv.hash_tokens(b"xa."),
        LLMHashingEnv.hash_tokens(b"yya."),
    ]
