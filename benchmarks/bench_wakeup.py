"""Wake-up mechanisms between a parent and 2 worker processes, as the process backend uses them.

Each round the parent wakes both workers, each does ``work`` us of busy CPU (a batch step's
share: 4 envs of about 0, 17, 128 and 1,100 us), then signals back; the parent waits in
``epoll`` as its event loop does. Mechanisms: a Unix socket pair (what the backend's frames
use), a pipe, an ``eventfd`` (the doorbell's, :mod:`aenv.pool._process_bell`), and a
shared-memory flag that both sides spin on for up to 50 us before sleeping on an eventfd.
Rounds interleave the mechanisms; each cell is the best of 2 runs: wall us per round and
the parent's thread CPU us per round.

Run: ``python benchmarks/bench_wakeup.py``.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import select
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import print_table  # noqa: E402

KINDS = ("socket", "pipe", "eventfd", "spin")
WORK_US = (0, 68, 512, 4400)
SPIN_S = 50e-6
_Q = struct.Struct("<q")


def _busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def _worker(kind: str, wid: int, work: float, rfd: int, wfd: int, page_fd: int) -> None:
    page = mmap.mmap(page_fd, 4096) if page_fd >= 0 else None
    seq = 0
    while True:
        if kind in ("socket", "pipe"):
            if not os.read(rfd, 64):
                return
        elif kind == "eventfd":
            os.eventfd_read(rfd)
        else:
            assert page is not None
            seq += 1
            end = time.perf_counter() + SPIN_S
            while _Q.unpack_from(page, 0)[0] < seq and time.perf_counter() < end:
                pass
            while 0 <= _Q.unpack_from(page, 0)[0] < seq:
                page[16 + wid] = 1  # asleep: the parent writes the eventfd
                if _Q.unpack_from(page, 0)[0] < seq and select.select([rfd], [], [], 0.002)[0]:
                    os.eventfd_read(rfd)
                page[16 + wid] = 0
            if _Q.unpack_from(page, 0)[0] < 0:
                return
        _busy(work)
        if kind in ("socket", "pipe"):
            os.write(wfd, b"d")
        else:
            if page is not None:
                _Q.pack_into(page, 32 + 8 * wid, seq)
            os.eventfd_write(wfd, 1)


def _run(kind: str, work: float, rounds: int) -> tuple[float, float]:
    ctx = multiprocessing.get_context("fork")
    page_fd, page = -1, None
    if kind == "spin":
        page_fd = os.memfd_create("bench-wakeup")
        os.ftruncate(page_fd, 4096)
        page = mmap.mmap(page_fd, 4096)
    procs, wr, rd, keep = [], [], [], []
    for wid in range(2):
        if kind == "socket":
            a, b = socket.socketpair()
            keep += [a, b]
            args: tuple[Any, ...] = (b.fileno(), b.fileno())
            wr.append(a.fileno())
            rd.append(a.fileno())
        elif kind == "pipe":
            r1, w1 = os.pipe()
            r2, w2 = os.pipe()
            args = (r1, w2)
            wr.append(w1)
            rd.append(r2)
        else:
            e1, e2 = os.eventfd(0), os.eventfd(0)
            args = (e1, e2)
            wr.append(e1)
            rd.append(e2)
        procs.append(ctx.Process(target=_worker, args=(kind, wid, work, *args, page_fd)))
    for proc in procs:
        proc.start()
    ep = select.epoll()
    for fd in rd:
        ep.register(fd, select.EPOLLIN)

    def one(seq: int) -> None:
        if page is not None:
            _Q.pack_into(page, 0, seq)
            for wid in range(2):
                if page[16 + wid]:
                    os.eventfd_write(wr[wid], 1)
            end = time.perf_counter() + SPIN_S
            while (
                time.perf_counter() < end
                and min(_Q.unpack_from(page, 32)[0], _Q.unpack_from(page, 40)[0]) < seq
            ):
                pass
        else:
            for fd in wr:
                if kind == "eventfd":
                    os.eventfd_write(fd, 1)
                else:
                    os.write(fd, b"g")
        left = 2
        while left:
            for fd, _ in ep.poll(5.0):
                if kind in ("eventfd", "spin"):
                    left -= os.eventfd_read(fd)
                else:
                    left -= len(os.read(fd, 64))

    try:
        for seq in range(1, 101):
            one(seq)
        t, c = time.perf_counter(), time.thread_time()
        for seq in range(101, 101 + rounds):
            one(seq)
        wall, cpu = time.perf_counter() - t, time.thread_time() - c
    finally:
        if page is not None:
            _Q.pack_into(page, 0, -1)
        for proc in procs:
            proc.kill()
            proc.join()
        ep.close()
        for sock in keep:
            sock.close()
    return wall / rounds * 1e6, cpu / rounds * 1e6


def run() -> dict[str, list[dict[str, Any]]]:
    rows = []
    for work in WORK_US:
        rounds = max(40, int(0.3e6 / (work + 100)))
        best: dict[str, tuple[float, float]] = {}
        for _ in range(2):
            for kind in KINDS:
                wall, cpu = _run(kind, work, rounds)
                old = best.get(kind)
                best[kind] = (wall, cpu) if old is None else (min(old[0], wall), min(old[1], cpu))
        row: dict[str, Any] = {"worker busy per round": f"{work} us"}
        for kind in KINDS:
            row[kind] = f"{best[kind][0]:,.0f} wall / {best[kind][1]:,.0f} parent CPU"
        rows.append(row)
    return {"us per round (wall / parent thread CPU)": rows}


def main() -> None:
    if not (hasattr(os, "eventfd") and hasattr(os, "memfd_create")):
        sys.exit("needs Linux (eventfd, memfd_create)")
    for title, rows in run().items():
        print_table(title, rows)


if __name__ == "__main__":
    main()
