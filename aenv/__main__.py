"""Command line: ``python -m aenv demo`` (also the ``aenv`` console script)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aenv", description="aenv command line")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the demo: lockstep vs streaming high-latency envs")
    from aenv._demo import add_arguments

    add_arguments(demo)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from aenv._demo import run_demo

        return run_demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
