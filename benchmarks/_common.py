"""Helpers shared by every benchmark: timing, latency draws, ideal throughput, tables.

This module is imported both by aenv's benchmarks (in aenv's venv) and by the peer workload
scripts under ``benchmarks/peers/`` (in the peer venv, where aenv is not installed), so it
depends on the standard library and numpy only.

Example:
    >>> import numpy as np
    >>> from benchmarks._common import Timer, ideal_throughput, lognormal_latencies
    >>> lat = lognormal_latencies(np.random.default_rng(0), median=0.05, sigma=1.0, n=4)
    >>> lat.shape
    (4,)
    >>> round(ideal_throughput(1024, 0.05, 1.0))
    12422
    >>> with Timer() as t:
    ...     pass
    >>> t.elapsed >= 0.0
    True
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

import numpy as np

__all__ = [
    "Timer",
    "agent_schedule",
    "best_of",
    "expected_latency",
    "format_value",
    "ideal_makespan",
    "ideal_throughput",
    "lognormal_latencies",
    "markdown_table",
    "print_table",
]


def lognormal_latencies(
    rng: np.random.Generator, median: float, sigma: float, n: int
) -> np.ndarray:
    """Draws ``n`` latencies (seconds) from a lognormal law with the given median.

    The law is ``exp(N(log(median), sigma**2))``: its median is ``median`` and its mean
    ``median * exp(sigma**2 / 2)``.

    Args:
        rng: numpy generator the draws come from (seed it for reproducible runs).
        median: median latency in seconds, > 0.
        sigma: standard deviation of the log-latency, >= 0 (0 gives a constant latency).
        n: number of draws, >= 0.

    Returns:
        A float64 array of shape ``(n,)``.
    """
    if median <= 0:
        raise ValueError(f"median must be > 0, got {median}")
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return rng.lognormal(mean=math.log(median), sigma=sigma, size=n)


def expected_latency(median: float, sigma: float) -> float:
    """Returns the mean of the lognormal law of :func:`lognormal_latencies`."""
    return median * math.exp(sigma * sigma / 2.0)


def ideal_throughput(n_envs: int, median: float, sigma: float) -> float:
    """Env-steps per second of ``n_envs`` envs that each wait a lognormal latency per step.

    This is the bound for a framework with zero overhead that re-sends every env the moment
    it returns: ``n_envs / E[latency]`` with ``E[latency] = median * exp(sigma**2 / 2)``.
    """
    return n_envs / expected_latency(median, sigma)


class Timer:
    """Wall-clock timer (``time.perf_counter``) used as a context manager.

    Example:
        >>> with Timer() as t:
        ...     sum(range(10))
        45
        >>> t.elapsed > 0
        True
    """

    def __init__(self) -> None:
        self.start: float = 0.0
        self.elapsed: float = 0.0

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.elapsed = time.perf_counter() - self.start


def agent_schedule(
    seed: int,
    n_episodes: int,
    turns: int,
    policy: tuple[float, float],
    env: tuple[float, float],
) -> tuple[np.ndarray, np.ndarray]:
    """The latencies of an agent-loop benchmark: ``(policy, env)`` arrays of shape
    ``(n_episodes, turns)``, lognormal with the given ``(median, sigma)`` each, drawn from
    one generator seeded by ``seed`` (policy first), so every framework replays the same."""
    rng = np.random.default_rng(seed)
    p = lognormal_latencies(rng, policy[0], policy[1], n_episodes * turns)
    e = lognormal_latencies(rng, env[0], env[1], n_episodes * turns)
    return p.reshape(n_episodes, turns), e.reshape(n_episodes, turns)


def ideal_makespan(durations: Iterable[float], slots: int) -> float:
    """Seconds to run jobs of these durations in order on ``slots`` workers, each worker
    taking the next job the moment it is free, with zero overhead (list scheduling)."""
    import heapq

    free = [0.0] * slots
    end = 0.0
    for d in durations:
        t = heapq.heappop(free) + float(d)
        end = max(end, t)
        heapq.heappush(free, t)
    return end


async def stream_steps(pool: Any, td: Any, duration: float) -> dict[str, float]:
    """The streaming loop every latency benchmark runs on a pool (``pool`` an
    :class:`~aenv.pool.AsyncEnvPool` of envs with a ``(1,)`` action; ``td`` what its reset
    gave): send a step to every
    env, then receive whatever finished (at least one) and send those envs again at once,
    for ``duration`` seconds. Returns the env-steps taken, the seconds and the receive calls."""
    import torch

    n = td.batch_size[0]
    td["env_index"] = torch.arange(n)
    td["action"] = torch.zeros(n, 1)
    steps = recvs = 0
    start = now = time.perf_counter()
    deadline = start + duration
    pool.async_step_send(td)
    while True:
        out = await pool.async_step_recv()
        now = time.perf_counter()
        steps += out.batch_size[0]
        recvs += 1
        if now >= deadline:
            break
        nxt = pool.step_mdp(out)
        nxt["action"] = torch.zeros(out.batch_size[0], 1)
        pool.async_step_send(nxt)
    return {"steps": steps, "elapsed_s": now - start, "recv_calls": recvs}


def best_of(fn: Callable[[], Any], *, repeats: int = 3, warmup: int = 1) -> float:
    """Runs ``fn`` ``warmup`` times untimed, then ``repeats`` times; returns the best seconds."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    best = math.inf
    for _ in range(repeats):
        with Timer() as t:
            fn()
        best = min(best, t.elapsed)
    return best


def format_value(value: Any) -> str:
    """Formats one table cell: thousands separators for large numbers, 3 digits for small."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1 or value == 0:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    columns: dict[str, None] = {}
    for row in rows:
        for key in row:
            columns.setdefault(str(key), None)
    return list(columns)


def markdown_table(title: str, rows: list[dict[str, Any]]) -> str:
    """Renders rows (dicts; columns in first-seen key order) as a titled markdown table (an
    empty title: the table alone, under a heading of the caller's)."""
    columns = _columns(rows)
    lines = [f"### {title}", ""] if title else []
    if not columns:
        lines.append("(no rows)")
        return "\n".join(lines) + "\n"
    cells = [[format_value(row.get(col)) for col in columns] for row in rows]
    widths = [max([len(col)] + [len(r[i]) for r in cells]) for i, col in enumerate(columns)]
    lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |")
    lines.append("| " + " | ".join("-" * w for w in widths) + " |")
    for r in cells:
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
    return "\n".join(lines) + "\n"


def print_table(title: str, rows: list[dict[str, Any]]) -> str:
    """Prints :func:`markdown_table` to stdout and returns the markdown string."""
    text = markdown_table(title, rows)
    print(text, flush=True)
    return text
