"""Tool-calling episodes: aenv's framework overhead per turn, against a raw asyncio loop.

``episodes`` concurrent episodes, each ``turns`` tool turns and a final answer: the model
(a fake OpenAI-compatible server on loopback, ``model_ms`` per completion) asks for one call
of a ``remote`` tool; the tool awaits a loopback tool server whose latency the call sets
(log-uniform in ``tool_ms``, fixed per episode and turn by ``seed``). Both servers run in a
process of their own, so their CPU does not count against the loop being measured.

Three drivers run the same episodes with the same ``ChatClient``:

- ``raw loop``: no aenv env, a list of message dicts, the tool called directly (the
  floor: HTTP, JSON and asyncio costs any framework pays);
- ``ToolEnv``: one ``aenv.llm.ToolEnv`` per episode, awaited by its episode's coroutine
  (History, XML tool-call parsing, concurrent dispatch, TensorDicts);
- ``ToolEnv in AsyncEnvPool``: the same envs in a coroutine ``AsyncEnvPool``, each episode
  awaiting its own env's steps (``pool.step_one``).

Reported: wall time, the ideal (the slowest episode's sum of latencies: a zero-cost
framework), % of ideal, and overhead per turn in µs (the mean over episodes of measured
minus ideal episode time, per turn), and aenv's extra cost per turn over the raw loop.

Peers (issue 18 asks for verifiers' ``ToolEnv`` or TorchRL's chat env with tools in the same
run, each in its own venv) are not timed yet; what each is, here, is checked on every run and
printed as the ``peers`` table (from the venvs under ``benchmarks/_venvs/``):

- verifiers: ``pip install verifiers`` into ``benchmarks/_venvs/verifiers`` works (0.4.0,
  ~100 packages, transformers/openai/anthropic/mcp, no torch, ~3 min here), but 0.4.0 has no
  ``ToolEnv``: its package root exports nothing and its stack is ``verifiers.v1`` (tasksets,
  harnesses, runtimes behind its own CLI and configs), with no entry point that takes a list
  of tools and an OpenAI-compatible client as the drivers above do. The last release before
  that rewrite, 0.3.1, installs into ``benchmarks/_venvs/verifiers031`` (~6 min here, with
  pyarrow and datasets) and has ``ToolEnv(tools=[...], max_turns=...)`` with an async
  ``rollout(input, client, model, sampling_args)``: a same-workload driver against the
  loopback servers is possible there (its tool calls are OpenAI ``tool_calls``, which the
  fake server can return) and is the next step; it was not written in the session that
  found this.
- TorchRL 0.14.1 (``benchmarks/_venvs/torchrl``) has ``torchrl.envs.llm.ChatEnv`` with the
  ``ExecuteToolsInOrder`` transform (``ToolRegistry``, ``XMLBlockParser``), usable in history
  mode without a tokenizer download. Its tools are plain sync callables run in order, item by
  item, inside the batched env's step, so the batch's tool latencies add up (256 episodes x
  3 turns x ~100 ms mean ~ 80 s a round, against ~1.3 s ideal); a driver for it was not
  written yet either.

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


def _model(p: dict[str, Any], lat: list[list[float]]) -> Any:
    def model(request: dict[str, Any], index: int) -> dict[str, Any]:
        msgs = request["messages"]
        episode = int(msgs[0]["content"].split()[-1])
        turn = sum(m["role"] == "tool" for m in msgs)
        if turn >= p["turns"]:
            return {"content": f"done after {turn} calls"}
        call = {"name": "remote", "arguments": {"seconds": lat[episode][turn]}}
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
        msgs: list[dict[str, Any]] = [{"role": "user", "content": f"episode {e}"}]
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
        td = await env.reset(TensorDict(prompt=NonTensorData(f"episode {e}")))
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
                prompt=NonTensorStack.from_list([f"episode {e}" for e in range(n)]),
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


async def _measure(p: dict[str, Any], urls: tuple[str, str]) -> list[dict[str, Any]]:
    from aenv.llm import ChatClient, FunctionTool

    model_url, tool_url = urls
    lat = _latencies(p)
    ideal_each = [sum(row) + (p["turns"] + 1) * p["model_ms"] / 1000.0 for row in lat]
    ideal_wall = max(ideal_each)
    turns = p["turns"] + 1
    rows = []
    # the tool server is a second fake server, reached through a ChatClient of its own
    tool_client = ChatClient(tool_url, max_concurrency=None, timeout=120)

    async def remote(seconds: float) -> str:
        res = await tool_client.chat([{"role": "user", "content": "x"}], seconds=seconds)
        assert res.message is not None, res.error
        return res.message.content

    tools = [FunctionTool(remote, name="remote")]
    drivers = {"raw loop": _raw, "ToolEnv": _direct, "ToolEnv in AsyncEnvPool": _pooled}
    best: dict[str, tuple[float, list[float]]] = {}
    try:
        async with ChatClient(model_url, max_concurrency=None, timeout=120) as client:
            # one client and its warm connections for every driver; the first round warms
            # up (connections, imports), then the best of ``rounds`` in rotating order
            for r in range(p["rounds"] + 1):
                names = list(drivers)[r % 3 :] + list(drivers)[: r % 3]
                for name in names:
                    driver = drivers[name]
                    t0 = time.perf_counter()
                    each = await driver(p, client, remote if driver is _raw else tools)
                    wall = time.perf_counter() - t0
                    if r and (name not in best or wall < best[name][0]):
                        best[name] = (wall, each)
    finally:
        await tool_client.aclose()
    raw_overhead = None
    for name in drivers:
        wall, each = best[name]
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


#: peer venvs and what in them would be the comparable tool-calling env
_PEERS = {
    "verifiers": ("verifiers", "import verifiers as m; from verifiers import ToolEnv"),
    "verifiers031": ("verifiers", "import verifiers as m; from verifiers import ToolEnv"),
    "torchrl": (
        "torchrl",
        "import torchrl as m; from torchrl.envs.llm import ChatEnv; "
        "from torchrl.envs.llm.transforms import ExecuteToolsInOrder",
    ),
}


def peer_status() -> list[dict[str, Any]]:
    """For each peer venv: installed or not, its version, whether its tool-calling env
    imports (checked in the venv's own interpreter), and that it was not timed."""
    import subprocess

    rows = []
    for venv, (package, probe) in _PEERS.items():
        python = ROOT / "benchmarks" / "_venvs" / venv / "bin" / "python"
        row: dict[str, Any] = {"venv": f"_venvs/{venv}", "package": package}
        if not python.exists():
            rows.append({**row, "version": "-", "tool_env_imports": "no venv", "timed": "no"})
            continue
        code = f"import importlib.metadata as md; print(md.version({package!r}))\n"
        version = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=300
        ).stdout.strip()
        probed = subprocess.run(
            [str(python), "-c", probe], capture_output=True, text=True, timeout=300
        )
        last = (probed.stderr.strip().splitlines() or [""])[-1]
        status = "yes" if probed.returncode == 0 else last[:70]
        rows.append({**row, "version": version or "-", "tool_env_imports": status, "timed": "no"})
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
        rows = asyncio.run(_measure(p, urls))
    finally:
        parent.send("stop")
        server.join(30)
        if server.is_alive():
            server.kill()
    print_table(
        f"{p['episodes']} tool-calling episodes, {p['turns']} tool turns + answer, "
        f"tool latency {p['tool_ms'][0]}-{p['tool_ms'][1]} ms, model {p['model_ms']} ms",
        rows,
    )
    peers = peer_status()
    print_table("peers (see the module doc)", peers)
    return {"": rows, "peers": peers}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes")
    run(quick=ap.parse_args().quick)
