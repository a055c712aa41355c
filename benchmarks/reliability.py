"""Run the full fault suite and write its reliability table into benchmarks/RESULTS.md.

    python benchmarks/reliability.py            # full suite (AENV_FAULTS=full), ~15-30 min
    AENV_SOAK_STEPS=20000 python benchmarks/reliability.py --no-write   # a shorter try

The suite (``tests/faults``) writes its figures to a JSON report; this script turns them
into the table between the ``reliability`` markers of RESULTS.md (its own section).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- reliability:start -->", "<!-- reliability:end -->"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} ms"


def table(data: dict, passed: bool, command: str) -> str:
    lines = [
        START,
        "## Reliability (fault suite)",
        "",
        f"`{command}` ({datetime.date.today().isoformat()}, this 2-core VM, shared and noisy): "
        f"the full fault suite ({'passed' if passed else 'FAILED'}) and its soak.",
        "",
        "| backend | steps | faults injected | recovered | results lost | time to detect "
        "(median / max) | growth per 100k steps (RSS MB, fds, threads, tasks, children) "
        "| steps/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in data.get("soak", []):
        g = r["growth_per_100k"]
        lines.append(
            f"| {r['backend']} | {r['steps']:,} | {r['faults_injected']} | {r['recovered']} | "
            f"{r['lost']} | {_ms(r['detect_ms_median'])} / {_ms(r['detect_ms_max'])} | "
            f"{g['rss_mb']:+.1f}, {g['fds']:+.0f}, {g['threads']:+.0f}, {g['tasks']:+.0f}, "
            f"{g['children']:+.0f} | {r['steps_per_s']:,.0f} |"
        )
    crashes = data.get("crashes", []) + data.get("hangs", [])
    if crashes:
        lines += [
            "",
            "Crashes and hangs (one step each; time from the call to its typed error or "
            "truncated result, step timeout 0.5 s for hangs):",
            "",
            "| backend | fault | policy | time to detect |",
            "| --- | --- | --- | --- |",
        ]
        for r in crashes:
            fault = r.get("kind") or f"{r['hang']} hang"
            lines.append(
                f"| {r['backend']} | {fault} | {r['policy']} | {_ms(1000 * r['detect_s'])} |"
            )
    cancels = data.get("cancels", [])
    if cancels:
        lines += [
            "",
            "Cancels at random moments (seeded): steps sent / received / cancelled / lost:",
            "",
        ]
        for r in cancels:
            lines.append(
                f"- {r['backend']}: {r['sent']} / {r['received']} / {r['cancelled']} / "
                f"**{r['lost']}** ({r['receiver_cancels']} receivers cancelled mid-wait)"
            )
    intr = data.get("interrupts", [])
    if intr:
        lines += ["", "Ctrl-C at random moments during sync facade calls:", ""]
        for r in intr:
            lines.append(
                f"- {r['backend']} ({r['loop']}): {r['calls']} calls, {r['interrupted']} "
                f"interrupted, stale results {r['stale']}, exception groups {r['groups']}, "
                f"other errors {len(r['other'])}"
            )
    lines.append(END)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "faults.json"
        env = {**os.environ, "AENV_FAULTS": "full", "AENV_FAULTS_REPORT": str(report)}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/faults"]
        proc = subprocess.run(cmd, cwd=ROOT, env=env)
        data = json.loads(report.read_text()) if report.exists() else {}
    text = table(data, proc.returncode == 0, "python benchmarks/reliability.py")
    print(text)
    if not args.no_write:
        results = ROOT / "benchmarks" / "RESULTS.md"
        old = results.read_text() if results.exists() else ""
        if START in old and END in old:
            new = old[: old.index(START)] + text + old[old.index(END) + len(END) + 1 :]
        else:
            new = old.rstrip("\n") + "\n\n" + text
        results.write_text(new)
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
