"""Tests for the benchmark helpers (``benchmarks/_common.py``) and the peer harness."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest

from benchmarks import _common, _peers
from benchmarks._common import (
    Timer,
    best_of,
    expected_latency,
    ideal_throughput,
    lognormal_latencies,
    markdown_table,
    print_table,
)
from benchmarks._peers import PEER_SCRIPTS, PEERS_DIR, PeerRunError, run_peer


def test_ideal_throughput_formula() -> None:
    assert ideal_throughput(1024, 0.05, 1.0) == pytest.approx(1024 / (0.05 * math.exp(0.5)))
    assert ideal_throughput(10, 0.1, 0.0) == pytest.approx(100.0)
    assert expected_latency(0.02, 2.0) == pytest.approx(0.02 * math.exp(2.0))


def test_lognormal_median_and_mean_match_the_law() -> None:
    lat = lognormal_latencies(np.random.default_rng(1234), median=0.05, sigma=1.0, n=200_000)
    assert lat.shape == (200_000,)
    assert (lat > 0).all()
    assert np.median(lat) == pytest.approx(0.05, rel=0.02)
    assert lat.mean() == pytest.approx(expected_latency(0.05, 1.0), rel=0.03)


def test_lognormal_is_seeded_and_sigma_zero_is_constant() -> None:
    a = lognormal_latencies(np.random.default_rng(7), 0.01, 1.0, 16)
    b = lognormal_latencies(np.random.default_rng(7), 0.01, 1.0, 16)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(lognormal_latencies(np.random.default_rng(0), 0.3, 0.0, 5), 0.3)


@pytest.mark.parametrize(("median", "sigma", "n"), [(0.0, 1.0, 3), (0.1, -1.0, 3), (0.1, 1.0, -1)])
def test_lognormal_rejects_bad_arguments(median: float, sigma: float, n: int) -> None:
    with pytest.raises(ValueError):
        lognormal_latencies(np.random.default_rng(0), median, sigma, n)


def test_timer_and_best_of() -> None:
    with Timer() as t:
        sum(range(1000))
    assert t.elapsed > 0.0
    calls: list[int] = []
    best = best_of(lambda: calls.append(1), repeats=3, warmup=2)
    assert len(calls) == 5
    assert best >= 0.0
    with pytest.raises(ValueError):
        best_of(lambda: None, repeats=0)


def test_print_table_prints_and_returns_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        {"lib": "aenv", "steps/s": 12345.678, "pct": 0.5},
        {"lib": "torchrl", "steps/s": 987, "note": "a|b"},
    ]
    text = print_table("Rollout", rows)
    assert capsys.readouterr().out.strip() == text.strip()
    lines = text.strip().splitlines()
    assert lines[0] == "### Rollout"
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    assert header == ["lib", "steps/s", "pct", "note"]
    assert set(lines[3].replace("|", "").replace(" ", "")) == {"-"}
    assert "12,346" in lines[4] and "0.5" in lines[4]
    assert "987" in lines[5] and "a\\|b" in lines[5]
    # every row has the same number of cells as the header
    assert {line.count(" | ") for line in lines[2:]} == {3}


def test_markdown_table_without_rows() -> None:
    assert "(no rows)" in markdown_table("Empty", [])


def test_format_value() -> None:
    assert _common.format_value(1234567) == "1,234,567"
    assert _common.format_value(0.012345) == "0.0123"
    assert _common.format_value(3.14159) == "3.14"
    assert _common.format_value(None) == ""
    assert _common.format_value(True) == "True"


def test_every_peer_script_exists_and_documents_quick_mode() -> None:
    for script in PEER_SCRIPTS:
        text = (PEERS_DIR / f"{script}.py").read_text()
        assert "quick" in text.split('"""')[1], script


def test_peer_result_parsing_takes_the_last_json_object() -> None:
    out = 'noise\n{"a": 1}\nmore noise {not json\n{"b": 2}\n'
    assert _peers._parse_result(out) == {"b": 2}
    assert _peers._parse_result("no json here\n[1, 2]\n") is None


def test_run_peer_in_current_interpreter_returns_the_json_line() -> None:
    # gym_vector_cartpole needs only gymnasium + numpy, so it runs without the peer venv.
    result = run_peer(
        "gym_vector_cartpole", venv=None, quick=True, kinds=["sync"], steps=20, warmup=0
    )
    assert result["params"]["steps"] == 20 and result["params"]["quick"] is True
    assert result["sync_env_steps_per_s"] > 0
    assert "async_env_steps_per_s" not in result
    assert result["versions"]["gymnasium"]


def test_run_peer_failure_carries_stderr() -> None:
    with pytest.raises(PeerRunError, match="unknown params"):
        run_peer("gym_vector_cartpole", venv=None, no_such_param=1)
    with pytest.raises(PeerRunError, match="no peer script"):
        run_peer("does_not_exist", venv=None)


def test_peerlib_merges_defaults_quick_and_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PEERS_DIR))
    import _peerlib

    defaults = {"steps": 1000, "n": 8}
    quick = {"steps": 10}
    argv = ["x", json.dumps({"quick": True, "n": 2})]
    assert _peerlib.parse_params(argv, defaults, quick) == {"steps": 10, "n": 2, "quick": True}
    assert _peerlib.parse_params(["x", "{}"], defaults, quick)["steps"] == 1000
    sys.modules.pop("_peerlib", None)


@pytest.mark.slow  # skipped by conftest unless AENV_BENCH_PEERS=1
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("script", list(PEER_SCRIPTS))
def test_peer_script_quick_mode(script: str) -> None:
    result = run_peer(script, venv=PEER_SCRIPTS[script], quick=True)
    assert result["params"]["quick"] is True
    assert result["versions"]["torch"].startswith("2.13.0")
    numbers = [v for k, v in result.items() if k.endswith("_per_s")]
    assert numbers and all(v > 0 for v in numbers), result


@pytest.mark.slow  # skipped by conftest unless AENV_BENCH_PEERS=1
def test_peer_versions_pins_torch_and_torchrl() -> None:
    versions = _peers.peer_versions()
    assert versions["torch"].startswith("2.13.0")
    assert versions["torchrl"] == "0.14.1"
    assert versions["tensordict"].startswith("0.14.")
