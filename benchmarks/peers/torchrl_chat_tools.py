"""TorchRL 0.14's ``ChatEnv`` with its tool transform, on bench_llm's loopback servers.

The workload of ``benchmarks/bench_llm.py``: ``episodes`` episodes, each ``turns`` calls of a
``remote`` tool and a final answer. The model is bench_llm's fake OpenAI-compatible server,
the tool its loopback tool server (the latency of each call is in the call's arguments, set
by the model per episode and turn). Only this script's process runs TorchRL.

Two ways TorchRL's users run it (``mode``), both with history-mode ``ChatEnv``s under
``TransformedEnv(..., ExecuteToolsInOrder(ToolRegistry([...]), XMLBlockParser()))``:

- ``batch``: one ``ChatEnv(batch_size=(episodes,))`` driven by ``env.rollout(turns + 1,
  policy, tensordict=reset_td, auto_reset=False)``, TorchRL's own loop. The transform runs
  the tools inside ``env.step``, item after item, so a turn's tool latencies add up over
  the batch; every episode ends with the batch's last step, so each episode's time is the
  rollout's wall time.
- ``pool``: TorchRL's ``AsyncEnvPool`` (threading backend, ``stack="lazy"``: histories
  differ in length) of ``episodes`` ``ChatEnv(batch_size=(1,))``, driven by its
  ``async_step_send`` / ``async_step_recv`` loop: whatever envs have finished a step get
  their next reply and are sent again, so the tools of different episodes overlap (one
  thread per env). An episode's time ends when its last step is received.

TorchRL has no model client for an OpenAI-compatible server, so the policy stands in for
a batched generation wrapper (vLLM's or Transformers'): it sends the prompts it is given
to the model server at once (a thread each, keep-alive connections), then writes
``("history", "full")`` = prompt + reply, as those wrappers do. The tools are what TorchRL
takes: sync callables (``ToolService``), here a keep-alive POST to the tool server.

Reported: ``episode_s`` (per episode, best round), ``wall_s`` and the wall time of every
round; a warm-up run of ``warmup`` episodes comes first.

Params (JSON object in argv[1]):
    model_url, tool_url (str): the servers' base URLs (``http://127.0.0.1:PORT/v1``).
    episodes (int): concurrent episodes (the batch). Default 256; quick 32.
    turns (int): tool turns per episode (the model answers after them). Default 3; quick 2.
    rounds (int): measured rounds, best wall time kept. Default 1.
    warmup (int): episodes in the warm-up run. Default 4.
    mode (str): ``batch`` or ``pool`` (above). Default ``batch``.

Run: ``benchmarks/_venvs/torchrl/bin/python benchmarks/peers/torchrl_chat_tools.py
'{"model_url": "...", "tool_url": "..."}'`` (bench_llm starts the servers and runs it).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import _peerlib
from _loopback_http import JsonPoster

DEFAULTS: dict[str, Any] = {
    "model_url": "",
    "tool_url": "",
    "episodes": 256,
    "turns": 3,
    "rounds": 1,
    "warmup": 4,
    "mode": "batch",
}
QUICK: dict[str, Any] = {"episodes": 32, "turns": 2}


class RemoteTool:
    """A TorchRL ``ToolService``: one keep-alive POST to the loopback tool server."""

    name = "remote"
    schema_in = {"seconds": float}
    schema_out = {"result": str}

    def __init__(self, poster: JsonPoster) -> None:
        self.poster = poster

    def __call__(self, seconds: float, **kwargs: Any) -> dict[str, Any]:
        reply = self.poster.post(
            "/chat/completions",
            {"model": "tool", "messages": [{"role": "user", "content": "x"}], "seconds": seconds},
        )
        return {"result": reply["choices"][0]["message"]["content"]}


def _make_env(n: int, tool: JsonPoster) -> Any:
    from torchrl.envs import TransformedEnv
    from torchrl.envs.llm import ChatEnv
    from torchrl.envs.llm.transforms import ExecuteToolsInOrder, ToolRegistry, XMLBlockParser

    return TransformedEnv(
        ChatEnv(batch_size=(n,), input_mode="history"),
        ExecuteToolsInOrder(ToolRegistry([RemoteTool(tool)]), XMLBlockParser()),
    )


class Policy:
    """Stands in for a batched generation wrapper: all prompts go to the model at once."""

    def __init__(self, model: JsonPoster, threads: int) -> None:
        self.model = model
        self.pool = ThreadPoolExecutor(max_workers=threads)

    def _generate(self, chat: list[dict[str, Any]]) -> str:
        msgs = [{"role": m["role"], "content": m["content"]} for m in chat]
        reply = self.model.post("/chat/completions", {"model": "fake", "messages": msgs})
        return str(reply["choices"][0]["message"]["content"])

    def replies(self, prompts: list[Any]) -> list[Any]:
        """``prompts``: Histories of shape ``[1, T_i]`` or one ``[B, T]``; one reply each."""
        from tensordict import lazy_stack
        from torchrl.data.llm import History

        chats = [chat for prompt in prompts for chat in prompt.tolist()]
        contents = iter(self.pool.map(self._generate, chats))
        out = []
        for prompt in prompts:
            reply = [
                History(role="assistant", content=next(contents)) for _ in range(prompt.shape[0])
            ]
            out.append(prompt.extend(lazy_stack(reply).unsqueeze(-1), inplace=False, dim=-1))
        return out

    def __call__(self, td: Any) -> Any:
        prompt = td["history"].prompt
        td["history"].full = self.replies([prompt])[0]
        return td

    def close(self) -> None:
        self.pool.shutdown()


def _check(e: int, chat: list[dict[str, Any]], turns: int) -> None:
    """The run must have done the work: ``turns`` tool results, then the model's answer."""
    roles = [m["role"] for m in chat]
    if roles.count("tool") != turns or not chat[-1]["content"].startswith("done after"):
        raise RuntimeError(f"episode {e} ended wrong: {chat[-3:]}")


def _batch(
    episode_ids: list[int], p: dict[str, Any], model: JsonPoster, tool: JsonPoster
) -> list[float]:
    """One batched ChatEnv run over ``episode_ids``; each episode's time (s)."""
    from tensordict import TensorDict

    n, turns = len(episode_ids), int(p["turns"])
    env = _make_env(n, tool)
    policy = Policy(model, n)
    try:
        start = time.perf_counter()
        td = env.reset(
            TensorDict(query=[f"torchrl episode {e}" for e in episode_ids], batch_size=(n,))
        )
        out = env.rollout(turns + 1, policy=policy, tensordict=td, auto_reset=False)
        wall = time.perf_counter() - start
    finally:
        policy.close()
        env.close()
    for e, chat in zip(episode_ids, out[:, -1]["history"].full.tolist()):
        _check(e, chat, turns)
    return [wall] * n


def _pool(
    episode_ids: list[int], p: dict[str, Any], model: JsonPoster, tool: JsonPoster
) -> list[float]:
    """One AsyncEnvPool run over ``episode_ids``; each episode's time (s)."""
    from functools import partial

    from tensordict import TensorDict, lazy_stack
    from torchrl.envs import AsyncEnvPool

    n, turns = len(episode_ids), int(p["turns"])
    pool = AsyncEnvPool([partial(_make_env, 1, tool)] * n, backend="threading", stack="lazy")
    policy = Policy(model, n)

    def act(tds: list[Any]) -> Any:
        fulls = policy.replies([td["history"].prompt for td in tds])
        for td, full in zip(tds, fulls):
            td["history"].full = full
        return lazy_stack(tds)

    steps = [0] * n
    ends: dict[int, float] = {}
    try:
        start = time.perf_counter()
        query = [[f"torchrl episode {e}"] for e in episode_ids]
        td = pool.reset(TensorDict(query=query, batch_size=(n, 1)))
        pool.async_step_send(act([td[i] for i in range(n)]))
        while len(ends) < n:
            out = pool.async_step_recv()
            again = []
            for j in range(out.shape[0]):
                one = out[j]
                i = one["env_index"]
                i = int(i.tolist()[0] if hasattr(i, "tolist") else i)
                steps[i] += 1
                if steps[i] < turns + 1:
                    again.append(pool.step_mdp(one))
                    continue
                ends[i] = time.perf_counter() - start
                _check(episode_ids[i], one["next", "history"].prompt.tolist()[0], turns)
            if again:
                pool.async_step_send(act(again))
    finally:
        policy.close()
        pool.close()
    return [ends[i] for i in range(n)]


def workload(p: dict[str, Any]) -> dict[str, Any]:
    if not p["model_url"] or not p["tool_url"]:
        raise SystemExit("model_url and tool_url are required (bench_llm starts the servers)")
    if p["mode"] not in ("batch", "pool"):
        raise SystemExit(f"mode must be 'batch' or 'pool', got {p['mode']!r}")
    model, tool = JsonPoster(p["model_url"]), JsonPoster(p["tool_url"])
    try:
        n = int(p["episodes"])
        drive = {"batch": _batch, "pool": _pool}[p["mode"]]
        drive(list(range(min(int(p["warmup"]), n))), p, model, tool)
        runs = []
        for _ in range(int(p["rounds"])):
            t0 = time.perf_counter()
            each = drive(list(range(n)), p, model, tool)
            runs.append((time.perf_counter() - t0, each))
    finally:
        model.close()
        tool.close()
    wall, each = min(runs, key=lambda r: r[0])
    return {
        "driver": f"TorchRL ChatEnv + ExecuteToolsInOrder ({p['mode']})",
        "episode_s": each,
        "wall_s": wall,
        "round_walls_s": [r[0] for r in runs],
    }


if __name__ == "__main__":
    _peerlib.run_main(workload, DEFAULTS, QUICK)
