"""bench_llm's peer drivers (``benchmarks/peers/``): each runs a 2-episode workload in its own
venv against loopback model and tool servers and reports well-formed figures.

A peer whose venv is not built here is skipped, with the reason; nothing is installed.
"""

from __future__ import annotations

import functools
import math

import pytest

from aenv.llm import FakeChatServer
from benchmarks import bench_llm
from benchmarks._peers import peer_venv_problem, run_peer

# the import probe of a peer venv costs seconds: once per venv
_problem = functools.cache(peer_venv_problem)

P = {"episodes": 2, "turns": 2, "tool_ms": (10, 30), "model_ms": 2, "seed": 3, "rounds": 1}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("peer", list(bench_llm.PEERS))
def test_peer_driver_runs_the_workload(peer: str) -> None:
    script, venv, _ = bench_llm.PEERS[peer]
    problem = _problem(venv)
    if problem is not None:
        pytest.skip(f"{peer}: {problem} (python benchmarks/bench_llm.py builds it)")
    lat = bench_llm._latencies(P)
    model = FakeChatServer(bench_llm._model(P, lat), latency_s=P["model_ms"] / 1000.0)
    tools = FakeChatServer(latency_s=lambda req: float(req["seconds"]))
    params = bench_llm._peer_params(P, peer, ("", ""))
    warmup = 1 if script == "torchrl_chat_tools" else P["episodes"]
    if script == "torchrl_chat_tools":
        params.update(warmup=1, rounds=1)
    with model.in_thread(), tools.in_thread():
        params.update(model_url=model.url, tool_url=tools.url)
        out = run_peer(script, venv=venv, timeout=200, **params)
        # every episode ran its tool calls on the tool server: warm-up + measured rounds
        episodes_run = warmup + P["episodes"]
        assert tools.completions == episodes_run * P["turns"]
        assert model.completions == episodes_run * (P["turns"] + 1)
        asked = [b["seconds"] for b in tools.bodies]
    assert sorted(asked[-P["episodes"] * P["turns"] :]) == sorted(x for row in lat for x in row)
    each = out["episode_s"]
    assert len(each) == P["episodes"] and all(math.isfinite(x) for x in each)
    # each episode waited at least on its own servers: its tools' and its model's latencies
    for took, row in zip(each, lat):
        assert took >= sum(row) + (P["turns"] + 1) * P["model_ms"] / 1000.0
    assert out["wall_s"] >= max(each) - 1e-6
    assert len(out["round_walls_s"]) == 1
    rows = bench_llm._rows(P, {peer: (out["wall_s"], each)})
    assert rows[0]["driver"] == peer and 0 < rows[0]["pct_of_ideal"] <= 100


def test_quick_mode_skips_an_absent_peer_venv_with_its_reason(monkeypatch) -> None:
    from benchmarks import _peers

    missing = _peers.PeerVenv(name="no-such-peer", requirements=("x==1",), check="import x")
    monkeypatch.setitem(_peers.PEER_VENVS, "no-such-peer", missing)
    monkeypatch.setattr(bench_llm, "PEERS", {"absent": ("verifiers_tool_env", "no-such-peer", {})})
    timed, status = bench_llm.run_peers(P, ("http://127.0.0.1:1/v1",) * 2, quick=True)
    assert timed == {}
    assert status[0]["peer"] == "absent"
    assert status[0]["status"].startswith("skipped") and "no venv at" in status[0]["status"]
    assert all(r["status"].startswith("not timed") for r in status[1:])
