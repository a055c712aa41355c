"""Run every aenv benchmark against its peers in one run; write RESULTS.md and plots.

Each ``bench_*.py`` module states what it compares and exposes ``run(quick) -> rows``
(a list of dicts, or a dict of such lists). Peers (TorchRL, Gymnasium vector envs) run in
their own venv through ``benchmarks/_peers.py``, created on first use.

Run: ``python benchmarks/run_all.py [--quick] [--out DIR] [--only NAME ...]``
(the full run writes ``benchmarks/RESULTS.md`` and ``benchmarks/*.png``; ``--quick`` uses
small sizes and writes to ``--out``, a temporary folder by default). With ``--only``, an
existing ``RESULTS.md`` keeps every other section: each benchmark run replaces its own
section's table (up to its ``command`` line), and the notes written under it stay.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import markdown_table, print_table  # noqa: E402

BENCHMARKS = [
    ("rollout", "bench_rollout", "Single-env rollout (issue target: aenv >= 5x TorchRL)"),
    ("serial", "bench_serial", "SerialEnv of 8 cheap envs (target: >= 10x TorchRL)"),
    (
        "pool_latency",
        "bench_pool_latency",
        "1,024 high-latency envs, streaming (target: >= 90% of ideal)",
    ),
    (
        "parallel",
        "bench_parallel",
        "CPU-bound CartPole on processes, and latency envs through processes",
    ),
    ("gym", "bench_gym", "GymEnv CartPole-v1 rollout vs TorchRL GymEnv vs raw gymnasium"),
    (
        "gymnasium_bridge",
        "bench_gymnasium_bridge",
        "aenv envs as gymnasium envs (to_gymnasium, make_gymnasium_vector) vs plain gymnasium",
    ),
    (
        "collector",
        "bench_collector",
        "Streaming collector vs lockstep vs TorchRL (256 latency envs)",
    ),
    (
        "agents",
        "bench_agents",
        "Agent loops: 256 episodes x 8 turns, LLM and env latency (targets: >= 95% of ideal, "
        ">= 1.8x lockstep)",
    ),
    (
        "scale",
        "bench_scale",
        "Scale: envs per process, latency spread, startup, memory, cost growth",
    ),
    (
        "scaling",
        "bench_scaling",
        "8 CPU-bound envs on 2 processes/cores against the limit, as the cost of a step grows",
    ),
    (
        "llm",
        "bench_llm",
        "256 tool-calling episodes against loopback model and tool servers (overhead per turn)",
    ),
    (
        "torchrl_bridge",
        "bench_torchrl_bridge",
        "TorchRL bridge, each direction: cost per step over the wrapped env alone (needs torchrl "
        "here or AENV_TORCHRL_PYTHON)",
    ),
    (
        "ray",
        "bench_ray",
        "Ray backend vs process backend: per-step overhead, CartPole, 64 latency envs, startup",
    ),
]


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "tensordict", "gymnasium", "anyio", "numpy", "uvloop"):
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception:
            out[name] = "not installed"
    try:
        from benchmarks._peers import peer_versions

        out.update({f"peer {k}": v for k, v in peer_versions().items()})
    except Exception:
        pass
    return out


def _machine() -> str:
    try:
        import psutil

        mem = f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except ImportError:
        mem = "?"
    return f"{platform.platform()}, {os.cpu_count()} CPUs, {mem} RAM, no GPU used"


def _plots(results: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    scale = results.get("scale")
    if isinstance(scale, dict):
        rows = scale.get("scale") or []
        if rows:
            fig, ax = plt.subplots(figsize=(6, 4))
            xs = [r["envs"] for r in rows]
            ax.loglog(xs, [r["env-steps/s"] for r in rows], "o-", label="aenv coroutine pool")
            ax.loglog(xs, [r["ideal"] for r in rows], "k--", label="ideal N / latency")
            ax.set_xlabel("number of envs (50 ms latency each)")
            ax.set_ylabel("env-steps/s")
            ax.set_title("Throughput vs number of envs")
            ax.legend()
            fig.tight_layout()
            fig.savefig(out / "scale_envs.png", dpi=100)
            plt.close(fig)
            made.append("scale_envs.png")
        # the streaming loop against its limit at a fixed ideal rate (4.85k env-steps/s)
        rows = [r for r in scale.get("limit") or [] if r["N / E[latency]"] < 6000]
        if rows:
            fig, ax = plt.subplots(figsize=(6, 4))
            xs = [r["envs"] for r in rows]
            for col, style in (
                ("limit %", "k--"),
                ("aenv %", "o-"),
                ("aenv, gc_freeze=False %", "s-"),
            ):
                ax.semilogx(xs, [r[col] for r in rows], style, label=col.removesuffix(" %"))
            ax.set_xlabel("number of envs (median latency grows with N: same ideal rate)")
            ax.set_ylabel("% of ideal env-steps/s")
            ax.set_title("Streaming loop vs its limit")
            ax.legend()
            fig.tight_layout()
            fig.savefig(out / "scale_limit.png", dpi=100)
            plt.close(fig)
            made.append("scale_limit.png")
        rows = scale.get("spread") or []
        if rows:
            fig, ax = plt.subplots(figsize=(6, 4))
            xs = [r["sigma"] for r in rows]
            ax.plot(xs, [r["streaming % ideal"] for r in rows], "o-", label="streaming")
            ax.plot(xs, [r["lockstep % ideal"] for r in rows], "s-", label="lockstep")
            ax.set_xlabel("latency spread sigma (lognormal, median 20 ms)")
            ax.set_ylabel("% of ideal throughput")
            ax.set_ylim(0, 105)
            ax.set_title("Throughput vs latency spread")
            ax.legend()
            fig.tight_layout()
            fig.savefig(out / "latency_spread.png", dpi=100)
            plt.close(fig)
            made.append("latency_spread.png")
    startup: list[tuple[str, float]] = []
    if isinstance(scale, dict):
        for r in scale.get("startup") or []:
            startup.append(
                (f"aenv {r['backend']} ({r['envs']} envs)", r["startup to first reset (s)"])
            )
    for r in results.get("parallel") or []:
        if isinstance(r, dict) and "startup (s)" in r:
            startup.append((str(r.get("framework", r.get("name", "?"))), r["startup (s)"]))
    if startup:
        fig, ax = plt.subplots(figsize=(7, 0.5 * len(startup) + 1.5))
        ax.barh([s[0] for s in startup], [s[1] for s in startup])
        ax.set_xlabel("seconds to first reset")
        ax.set_title("Startup time")
        fig.tight_layout()
        fig.savefig(out / "startup.png", dpi=100)
        plt.close(fig)
        made.append("startup.png")
    scaling = results.get("scaling")
    if isinstance(scaling, dict) and len(scaling.get("% of the limit") or []) > 1:
        from benchmarks.bench_scaling import plot

        plot(scaling["% of the limit"], out / "scaling.png")
        made.append("scaling.png")
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; CI runs this")
    parser.add_argument("--out", type=Path, default=None, help="where RESULTS.md and plots go")
    parser.add_argument("--only", nargs="*", default=None, help="benchmark names to run")
    args = parser.parse_args()
    out = args.out or (
        Path(tempfile.mkdtemp(prefix="aenv-bench-")) if args.quick else ROOT / "benchmarks"
    )
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    failures: dict[str, str] = {}
    sections = []
    for name, module, title in BENCHMARKS:
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        try:
            mod = importlib.import_module(f"benchmarks.{module}")
            res = mod.run(quick=args.quick)
        except Exception:
            failures[name] = traceback.format_exc()
            print(f"!! {name} failed:\n{failures[name]}", file=sys.stderr)
            sections.append(f"## {title}\n\nFAILED:\n\n```\n{failures[name][-3000:]}\n```\n")
            continue
        results[name] = res
        elapsed = time.perf_counter() - t0
        groups = res if isinstance(res, dict) else {"": res}
        text = [f"## {title}\n"]
        for sub, rows in groups.items():
            heading = f"{title} — {sub}" if sub else title
            print_table(heading, rows)
            text.append((f"### {sub}\n\n" if sub else "") + markdown_table("", rows).strip() + "\n")
        text.append(
            f"_({elapsed:.0f} s, command: `python benchmarks/{module}.py{' --quick' if args.quick else ''}`)_\n"
        )
        sections.append("\n".join(text))
    plots = []
    try:
        plots = _plots(results, out)
    except Exception:
        failures["plots"] = traceback.format_exc()
        print(f"!! plots failed:\n{failures['plots']}", file=sys.stderr)
    versions = ", ".join(f"{k} {v}" for k, v in _versions().items())
    header = [
        "# aenv benchmark results\n",
        f"Machine: {_machine()}. Versions: {versions}.\n",
        "Numbers are from one run on a shared, noisy machine: read the ratios, not the absolute times. "
        f"Mode: {'quick (small sizes)' if args.quick else 'full'}. "
        "Produced by `python benchmarks/run_all.py" + (" --quick" if args.quick else "") + "`.\n",
    ]
    header += [f"![{p}]({p})\n" for p in plots]
    path = out / "RESULTS.md"
    if args.only and path.exists():
        path.write_text(merge_sections(path.read_text(), sections))
    else:
        sections += _kept_sections(path)
        path.write_text("\n".join(header + sections))
    print(f"\nwrote {out / 'RESULTS.md'}" + (f" and {', '.join(plots)}" if plots else ""))
    if failures:
        print(f"FAILED benchmarks: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


#: sections other scripts write into RESULTS.md between their markers (the reliability table
#: of ``benchmarks/reliability.py``, from the full fault suite): kept when the file is rewritten
_KEPT = (("<!-- reliability:start -->", "<!-- reliability:end -->"),)


def _kept_sections(path: Path) -> list[str]:
    if not path.exists():
        return []
    text = path.read_text()
    kept = []
    for start, end in _KEPT:
        a, b = text.find(start), text.find(end)
        if a >= 0 and b > a:
            kept.append(text[a : b + len(end)] + "\n")
    return kept


#: the last line of a section's generated part: its run time and command
_COMMAND_LINE = re.compile(r"^_\(\d+ s, command: `python benchmarks/[^`]*`\)_\n?", re.M)


def merge_sections(text: str, sections: list[str]) -> str:
    """``text`` (a RESULTS.md) with each of ``sections`` (``"## title"`` first) in place of
    the generated part of the section of the same title: its heading, the tables under it
    and their command line (see :func:`_generated_end`). What follows (notes, later runs'
    tables) is kept, even where no command line ends the tables; a section the file lacks
    is added at the end."""
    for section in sections:
        heading = section.split("\n", 1)[0] + "\n"
        new = section if section.endswith("\n") else section + "\n"
        if text.startswith(heading):
            start = 0
        else:
            at = text.find("\n" + heading)
            if at < 0:
                text = text.rstrip("\n") + "\n\n" + new
                continue
            start = at + 1
        following = text.find("\n## ", start + len(heading))
        limit = len(text) if following < 0 else following + 1
        end = _generated_end(text, start + len(heading), limit)
        text = text[:start] + new + text[end:]
    return text


def _generated_end(text: str, at: int, limit: int) -> int:
    """Where a section's generated part (from ``at``, after its heading, to ``limit``)
    ends: its sub-headings, tables, blank lines, a failed run's report, and the command
    line right after them; the first other line (a note written later) is kept."""
    fenced = False
    while at < limit:
        eol = text.find("\n", at, limit)
        nxt = limit if eol < 0 else eol + 1
        line = text[at:nxt].rstrip("\n")
        if fenced or line.startswith("```"):
            fenced = fenced != line.startswith("```")
        elif _COMMAND_LINE.match(line):
            return nxt
        elif line.strip() and not line.startswith(("### ", "|", "FAILED")):
            return at
        at = nxt
    return limit


if __name__ == "__main__":
    sys.exit(main())
