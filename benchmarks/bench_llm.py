"""Tool-calling episodes: framework overhead per turn of aenv, verifiers and TorchRL, against a raw loop.

``episodes`` concurrent episodes, each ``turns`` tool turns and a final answer: the model
(a fake OpenAI-compatible server on loopback, ``model_ms`` per completion) asks for one call
of a ``remote`` tool; the tool awaits a loopback tool server whose latency the call sets
(log-uniform in ``tool_ms``, fixed per episode and turn by ``seed``). Both servers run in a
process of their own, so their CPU does not count against the loop being measured.

Three aenv drivers run the same episodes with the same ``ChatClient``:

- ``raw loop``: no aenv env, a list of message dicts, the tool called directly (the
  floor: HTTP, JSON and asyncio costs any framework pays);
- ``ToolEnv``: one ``aenv.llm.ToolEnv`` per episode, awaited by its episode's coroutine
  (History, XML tool-call parsing, concurrent dispatch, TensorDicts);
- ``ToolEnv in AsyncEnvPool``: the same envs in a coroutine ``AsyncEnvPool``, each episode
  awaiting its own env's steps (``pool.step_one``).

Then, in the same run and against the same two servers (still up), each peer's own
tool-calling env runs in its own venv, as a subprocess, one at a time (``PEERS``; drivers in
``benchmarks/peers/``, each documenting how it drives its library):

- ``verifiers 0.3.1 ToolEnv.rollout`` (``peers/verifiers_tool_env.py``, venv
  ``_venvs/verifiers031``): one ``vf.ToolEnv(tools=[remote])``, the tool an async function
  POSTing to the tool server (``httpx``), the model reached through verifiers'
  ``OpenAIChatCompletionsClient`` around ``openai.AsyncOpenAI``; each episode one
  ``await env.rollout(...)``, all gathered on one loop (``env.generate`` without scoring).
- ``TorchRL 0.14.1 ChatEnv(batch) + ExecuteToolsInOrder`` (``peers/torchrl_chat_tools.py``,
  venv ``_venvs/torchrl``): one ``ChatEnv(batch_size=(episodes,))`` with the
  ``ExecuteToolsInOrder`` transform (``ToolRegistry``, ``XMLBlockParser``), driven by
  ``env.rollout``, TorchRL's own loop. Its tools are sync callables the transform runs
  inside ``env.step``, item after item, so a turn's tool latencies add up over the batch.
- ``TorchRL 0.14.1 AsyncEnvPool(ChatEnv + ExecuteToolsInOrder)`` (same script): TorchRL's
  own answer to slow envs, an ``AsyncEnvPool`` (threads) of ``episodes`` one-episode
  ChatEnvs, driven by its ``async_step_send`` / ``async_step_recv`` loop, so the tools of
  different episodes overlap.

TorchRL has no client for OpenAI-compatible servers: its policy stands in for a batched
generation wrapper (vLLM's, Transformers'), sending the prompts it is given to the model
server at once (a thread each, keep-alive connections). Why the comparison is fair: the
same model server (same latency per completion), the same tool server and the same tool
latency per episode and turn, the same episode count, turns and final answer; each
driver's episodes must come back with every tool result and the answer or the run fails.
The model writes each framework's own call syntax (aenv's ``<tool_call>`` JSON, TorchRL's
``<tool name=...>``, OpenAI ``tool_calls`` for verifiers), chosen by the prompt's first
word. Each framework's HTTP client is its own (aenv's ``httpx``-based ``ChatClient``;
verifiers' ``openai`` client and an ``httpx`` tool call; TorchRL a stdlib keep-alive
connection per thread): that is part of what its users pay. Rounds: aenv's drivers and
verifiers warm up once, then the best of ``rounds``; TorchRL's batched env warms up on 4
episodes and runs one measured round (minutes at full size, dominated by its summed tool
latencies).

Peers looked at and not timed: verifiers 0.4.0, the newest, installs but has no
``ToolEnv`` (its stack is ``verifiers.v1``: tasksets, harnesses and runtimes behind its own
CLI and configs, with no entry point taking a list of tools and an OpenAI client); 0.3.1 is
its last release with one. A full run builds a missing peer venv from the pins in
``benchmarks/_peers.py`` (verifiers 0.3.1: about 3 min here); ``--quick`` (CI) uses a peer
venv only if it is already there and otherwise says why it skipped it.

Reported: wall time, the ideal (the slowest episode's sum of latencies: a zero-cost
framework), % of ideal, and overhead per turn in µs (the mean over episodes of measured
minus ideal episode time, per turn), and each driver's extra cost per turn over the raw
loop (the first row). The raw loop runs again after the peers (last row): how far it
moved says how much the machine's load changed during the run. The ``peers`` table says, per peer, that it was timed (and each round's wall time)
or why not.

Run: ``python benchmarks/bench_llm.py [--quick]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks._common import print_table  # noqa: E402

FULL = {"episodes": 256, "turns": 3, "tool_ms": (10, 500), "model_ms": 20, "seed": 0, "rounds": 2}
QUICK = {"episodes": 32, "turns": 2, "tool_ms": (10, 50), "model_ms": 5, "seed": 0, "rounds": 1}


def _latencies(p: dict[str, Any]) -> list[list[float]]:
    """Tool latency (s) per episode and turn, log-uniform in ``tool_ms``."""
    rng = np.random.default_rng(p["seed"])
    lo, hi = (math.log(x / 1000.0) for x in p["tool_ms"])
    return np.exp(rng.uniform(lo, hi, size=(p["episodes"], p["turns"]))).tolist()


def _prompt(dialect: str, episode: int) -> str:
    """An episode's prompt: it names the tool-call syntax the driver's parser reads."""
    return f"{dialect} episode {episode}"


def _model(p: dict[str, Any], lat: list[list[float]]) -> Any:
    """The fake model: ``turns`` calls of ``remote`` (this episode's latencies), then an
    answer. The prompt's first word picks the call syntax of the driver's framework; the
    calls, their arguments and the turn count are the same for every syntax."""

    def model(request: dict[str, Any], index: int) -> dict[str, Any]:
        msgs = request["messages"]
        dialect, _, episode = next(m for m in msgs if m["role"] == "user")["content"].split()
        turn = sum(m["role"] == "tool" for m in msgs)
        if turn >= p["turns"]:
            return {"content": f"done after {turn} calls"}
        args = {"seconds": lat[int(episode)][turn]}
        if dialect == "openai":  # verifiers: OpenAI function calling
            call = {"name": "remote", "arguments": json.dumps(args)}
            return {
                "tool_calls": [{"id": f"c{episode}-{turn}", "type": "function", "function": call}]
            }
        if dialect == "torchrl":  # TorchRL's XMLBlockParser
            return {"content": f'<tool name="remote">{json.dumps(args)}</tool>'}
        call = {"name": "remote", "arguments": args}  # aenv's XMLTagParser
        return {"content": f"<tool_call>{json.dumps(call)}</tool_call>"}

    return model


def _serve(p: dict[str, Any], conn: Any) -> None:
    """In the server process: the model server and the tool server, until told to stop."""
    from aenv.llm import FakeChatServer

    lat = _latencies(p)
    model = FakeChatServer(_model(p, lat), latency_s=p["model_ms"] / 1000.0)
    tools = FakeChatServer(latency_s=lambda req: float(req["seconds"]))
    with model.in_thread(), tools.in_thread():
        conn.send((model.url, tools.url))
        conn.recv()  # stop


# ---------------------------------------------------------------- drivers
async def _raw(p: dict[str, Any], client: Any, remote: Any) -> list[float]:
    from aenv.llm import Message, XMLTagParser

    parser = XMLTagParser()

    async def episode(e: int) -> float:
        start = time.perf_counter()
        msgs: list[dict[str, Any]] = [{"role": "user", "content": _prompt("aenv", e)}]
        while True:
            reply = await client.chat(msgs)
            msgs.append({"role": "assistant", "content": reply.message.content})
            calls = parser(Message("assistant", reply.message.content))
            if not calls:
                return time.perf_counter() - start
            for c in calls:
                result = await remote(**c.call.arguments)  # type: ignore[union-attr]
                msgs.append({"role": "tool", "content": result})

    return list(await asyncio.gather(*(episode(e) for e in range(p["episodes"]))))


async def _direct(p: dict[str, Any], client: Any, tools: list[Any]) -> list[float]:
    from tensordict import NonTensorData, TensorDict

    from aenv import step_mdp
    from aenv.llm import ToolEnv, get_data

    async def episode(e: int) -> float:
        env = ToolEnv(tools, max_turns=p["turns"] + 1)
        start = time.perf_counter()
        td = await env.reset(TensorDict(prompt=NonTensorData(_prompt("aenv", e))))
        while True:
            reply = await client.chat(get_data(td, "history"))
            out = await env.step(td.set("response", NonTensorData(reply.message)))
            if bool(out["next", "done"]):
                return time.perf_counter() - start
            td = step_mdp(out, action_keys=("response",))

    return list(await asyncio.gather(*(episode(e) for e in range(p["episodes"]))))


async def _pooled(p: dict[str, Any], client: Any, tools: list[Any]) -> list[float]:
    from tensordict import NonTensorData, NonTensorStack, TensorDict

    from aenv import AsyncEnvPool, step_mdp
    from aenv.llm import ToolEnv, get_data

    n = p["episodes"]
    async with AsyncEnvPool([lambda: ToolEnv(tools, max_turns=p["turns"] + 1)] * n) as pool:
        start = time.perf_counter()
        first = await pool.reset(
            TensorDict(
                prompt=NonTensorStack.from_list([_prompt("aenv", e) for e in range(n)]),
                batch_size=[n],
            )
        )

        async def episode(e: int) -> float:
            td = first[e]
            while True:
                reply = await client.chat(get_data(td, "history"))
                out = await pool.step_one(e, td.set("response", NonTensorData(reply.message)))
                if bool(out["next", "done"]):
                    return time.perf_counter() - start
                td = step_mdp(out, action_keys=("response",))

        return list(await asyncio.gather(*(episode(e) for e in range(n))))


async def _measure(
    p: dict[str, Any], urls: tuple[str, str], only: tuple[str, ...] | None = None
) -> dict[str, tuple[float, list[float]]]:
    """aenv's drivers and the raw loop (or the ``only`` ones): name -> (best wall time, that
    round's episode times)."""
    from aenv.llm import ChatClient, FunctionTool

    model_url, tool_url = urls
    # the tool server is a second fake server, reached through a ChatClient of its own
    tool_client = ChatClient(tool_url, max_concurrency=None, timeout=120)

    async def remote(seconds: float) -> str:
        res = await tool_client.chat([{"role": "user", "content": "x"}], seconds=seconds)
        assert res.message is not None, res.error
        return res.message.content

    tools = [FunctionTool(remote, name="remote")]
    drivers = {"raw loop": _raw, "ToolEnv": _direct, "ToolEnv in AsyncEnvPool": _pooled}
    drivers = {k: v for k, v in drivers.items() if only is None or k in only}
    best: dict[str, tuple[float, list[float]]] = {}
    try:
        async with ChatClient(model_url, max_concurrency=None, timeout=120) as client:
            # one client and its warm connections for every driver; the first round warms
            # up (connections, imports), then the best of ``rounds`` in rotating order
            for r in range(p["rounds"] + 1):
                k = r % len(drivers)
                names = list(drivers)[k:] + list(drivers)[:k]
                for name in names:
                    driver = drivers[name]
                    t0 = time.perf_counter()
                    each = await driver(p, client, remote if driver is _raw else tools)
                    wall = time.perf_counter() - t0
                    if r and (name not in best or wall < best[name][0]):
                        best[name] = (wall, each)
    finally:
        await tool_client.aclose()
    return {name: best[name] for name in drivers}


# ---------------------------------------------------------------- peers
#: the peers' drivers: row name -> (``benchmarks/peers/<script>.py``, its venv, its params)
PEERS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "verifiers 0.3.1 ToolEnv.rollout": ("verifiers_tool_env", "verifiers031", {}),
    "TorchRL 0.14.1 ChatEnv(batch) + ExecuteToolsInOrder": (
        "torchrl_chat_tools",
        "torchrl",
        {"mode": "batch"},
    ),
    "TorchRL 0.14.1 AsyncEnvPool(ChatEnv + ExecuteToolsInOrder)": (
        "torchrl_chat_tools",
        "torchrl",
        {"mode": "pool"},
    ),
}

#: peers looked at and not timed, with why
NOT_TIMED = {
    "verifiers 0.4.0 (newest)": (
        "installs (benchmarks/_venvs/verifiers), but has no ToolEnv: its stack is verifiers.v1 "
        "(tasksets, harnesses, runtimes behind its CLI), with no entry point that takes a "
        "list of tools and an OpenAI client; 0.3.1, its last release with ToolEnv, is timed"
    ),
}


def _peer_params(p: dict[str, Any], peer: str, urls: tuple[str, str]) -> dict[str, Any]:
    """The params of ``peer``'s driver: this run's sizes and the servers' URLs."""
    extra = PEERS[peer][2]
    base = {"model_url": urls[0], "tool_url": urls[1], "episodes": p["episodes"]}
    base.update(turns=p["turns"], rounds=p["rounds"], **extra)
    if extra.get("mode") == "batch":
        # one measured round (after a 4-episode warm-up batch): its tools run one after
        # another, so a full round takes minutes and its noise is small beside its cost
        base.update(rounds=1, warmup=4)
    return base


def run_peers(
    p: dict[str, Any], urls: tuple[str, str], *, quick: bool
) -> tuple[dict[str, tuple[float, list[float]]], list[dict[str, Any]]]:
    """Runs each peer's driver in its venv against the servers at ``urls``.

    A full run builds a missing peer venv (pinned, through ``benchmarks/_peers.py``); quick
    mode uses one only if it is already there. Returns the timed peers as ``_measure``
    does, and one status row per peer (timed, or why not).

    Raises:
        PeerRunError: a driver failed in a peer venv that is there and imports.
    """
    from benchmarks._peers import PeerRunError, ensure_peer_venv, peer_venv_problem, run_peer

    timed: dict[str, tuple[float, list[float]]] = {}
    status: list[dict[str, Any]] = []
    for name, (script, venv, _) in PEERS.items():
        row = {"peer": name, "venv": f"_venvs/{venv}", "driver": f"peers/{script}.py"}
        if quick and (problem := peer_venv_problem(venv)) is not None:
            status.append({**row, "status": f"skipped (quick mode builds no venv): {problem}"})
            continue
        try:
            ensure_peer_venv(venv)
        except PeerRunError as exc:  # no network, no wheel: say so, time the others
            status.append({**row, "status": f"venv not built: {str(exc).splitlines()[0][:200]}"})
            continue
        # a driver that fails on a working venv is a bug: it raises (CI's quick run sees it)
        out = run_peer(script, venv=venv, timeout=1800, **_peer_params(p, name, urls))
        each = [float(x) for x in out["episode_s"]]
        if len(each) != p["episodes"]:
            raise RuntimeError(f"{script} reported {len(each)} episodes, not {p['episodes']}")
        timed[name] = (float(out["wall_s"]), each)
        walls = ", ".join(f"{w:.2f}" for w in out["round_walls_s"])
        status.append({**row, "status": f"timed (measured rounds' wall s: {walls})"})
    for name, why in NOT_TIMED.items():
        status.append({"peer": name, "venv": "-", "driver": "-", "status": f"not timed: {why}"})
    return timed, status


def _rows(p: dict[str, Any], runs: dict[str, tuple[float, list[float]]]) -> list[dict[str, Any]]:
    """The table: each driver's wall time, % of ideal and overhead per turn (first: raw)."""
    lat = _latencies(p)
    ideal_each = [sum(row) + (p["turns"] + 1) * p["model_ms"] / 1000.0 for row in lat]
    ideal_wall = max(ideal_each)
    turns = p["turns"] + 1
    rows = []
    raw_overhead = None
    for name, (wall, each) in runs.items():
        overhead = float(np.mean([m - i for m, i in zip(each, ideal_each)])) / turns * 1e6
        if raw_overhead is None:
            raw_overhead = overhead
        rows.append(
            {
                "driver": name,
                "episodes": p["episodes"],
                "turns": turns,
                "wall_s": wall,
                "ideal_s": ideal_wall,
                "pct_of_ideal": 100.0 * ideal_wall / wall,
                "overhead_per_turn_us": overhead,
                "extra_vs_raw_us": overhead - raw_overhead,
            }
        )
    return rows


def run(quick: bool = False) -> dict[str, list[dict[str, Any]]]:
    p = dict(QUICK if quick else FULL)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(p, child), daemon=True)
    server.start()
    try:
        if not parent.poll(120):
            raise RuntimeError("the benchmark's server process did not start")
        urls = parent.recv()
        runs = asyncio.run(_measure(p, urls))
        # the peers after aenv, against the same servers (still up), one at a time
        peers, status = run_peers(p, urls, quick=quick)
        if peers:
            # the raw loop again: the machine's load may have changed while the peers ran
            (again,) = asyncio.run(_measure(p, urls, only=("raw loop",))).values()
            peers["raw loop, again after the peers"] = again
    finally:
        parent.send("stop")
        server.join(30)
        if server.is_alive():
            server.kill()
    rows = _rows(p, {**runs, **peers})
    print_table(
        f"{p['episodes']} tool-calling episodes, {p['turns']} tool turns + answer, "
        f"tool latency {p['tool_ms'][0]}-{p['tool_ms'][1]} ms, model {p['model_ms']} ms",
        rows,
    )
    print_table("peers (see the module doc)", status)
    return {"": rows, "peers": status}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes")
    run(quick=ap.parse_args().quick)
