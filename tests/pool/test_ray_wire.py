"""The Ray backend's direct channel (:mod:`aenv.pool._ray_wire`), with the actor class run in
this process: no cluster is needed (only Ray's node address lookup), so the token check,
the frames and the pushed results are tested in milliseconds, over real sockets (the actor's
Unix socket, which a driver on its host takes, and its TCP one)."""

from __future__ import annotations

import asyncio
import os
import socket
from functools import partial

import cloudpickle
import pytest
import torch
from _support.ray import SKIP_REASON

from aenv.pool._backend import Failure
from aenv.pool._channel import ChannelClosed
from aenv.pool._ray_actor import EnvActor, pack, unpack
from aenv.pool._ray_wire import dial, send_frame
from aenv.testing import CountingEnv, FailingEnv

pytest.importorskip("ray", reason=SKIP_REASON)
pytestmark = pytest.mark.timeout(60)

TOKEN = b"0123456789abcdef"


async def frames_from(chan, loop, want: int) -> list:
    """At least ``want`` frames from ``chan`` (read as the driver reads them)."""
    got: list = []
    ready = asyncio.Event()

    def on_readable() -> None:
        try:
            got.extend(chan.read_frames())
        except ChannelClosed:
            got.append("EOF")
        if len(got) >= want:
            ready.set()

    chan.attach(loop, on_readable)
    try:
        await asyncio.wait_for(ready.wait(), 10)
    finally:
        chan.detach()
    return got


async def test_token_frames_and_pushed_results():
    fns = [partial(CountingEnv, max_steps=3), partial(FailingEnv, fail_after=0)]
    actor = EnvActor(cloudpickle.dumps(fns), [4, 5], [], True, TOKEN)
    pid, metas, broken, address = await actor.ready()
    assert pid == os.getpid() and sorted(metas) == [4, 5] and not broken
    assert (await actor.ready())[3] == address  # (asked again: the same channel)
    loop = asyncio.get_running_loop()

    host, port, local = address
    assert local is not None  # (Linux: an abstract Unix socket beside the TCP one)

    # a connection without the token is closed, on either socket, and the actor goes on
    # listening
    for family, where in ((None, (host, port)), (socket.AF_UNIX, "\0" + local)):
        if family is None:
            stranger = socket.create_connection(where, timeout=5)
        else:
            stranger = socket.socket(family, socket.SOCK_STREAM)
            stranger.settimeout(5)
            stranger.connect(where)
        stranger.sendall(b"x" * len(TOKEN))
        stranger.settimeout(5)
        assert await loop.run_in_executor(None, stranger.recv, 1) == b""
        stranger.close()

    # this driver is on the actor's host: it takes the Unix socket
    chan = await loop.run_in_executor(None, dial, address, TOKEN)
    assert chan.sock.family == socket.AF_UNIX
    try:
        # resets of both envs in one frame: their results pushed back in one frame
        send_frame(
            chan, ("x", [(4, 1, "reset", pack((None, {}))), (5, 2, "reset", pack((None, {})))])
        )
        (frame,) = await frames_from(chan, loop, 1)
        assert frame[0] == "r" and [(i, seq) for i, seq, _ in frame[1]] == [(4, 1), (5, 2)]
        assert unpack(frame[1][0][2])["observation"].tolist() == [0.0]

        # a whole-batch step of both (env 5 raises on its first step): per-env outcomes,
        # the failure with the actor's traceback
        td = torch.stack([unpack(frame[1][k][2]) for k in range(2)])
        td["action"] = torch.ones(2, 1)
        send_frame(chan, ("s", 7, "step", pack(td), None, None, False))
        (answer,) = await frames_from(chan, loop, 1)
        assert answer[:2] == ("S", 7)
        kind, outcomes = unpack(answer[2])
        assert kind == "L" and outcomes[0]["observation"].tolist() == [1.0]
        assert isinstance(outcomes[1], Failure) and "_mocks.py" in outcomes[1].traceback

        # once connected, the actor no longer listens, on either socket
        with pytest.raises(OSError):
            socket.create_connection((host, port), timeout=5).close()
        with pytest.raises(OSError), socket.socket(socket.AF_UNIX) as late:
            late.connect("\0" + local)
    finally:
        chan.close()
        await actor.close()


async def test_a_driver_off_the_actors_host_dials_its_tcp_address():
    """Where nothing listens under the actor's Unix name (another host, or another network
    namespace), ``dial`` connects to the TCP address."""
    actor = EnvActor(cloudpickle.dumps([partial(CountingEnv, max_steps=3)]), [0], [], False, TOKEN)
    host, port, _ = (await actor.ready())[3]
    loop = asyncio.get_running_loop()
    chan = await loop.run_in_executor(None, dial, (host, port, "aenv-nobody-listens"), TOKEN)
    try:
        assert chan.sock.family in (socket.AF_INET, socket.AF_INET6)
        send_frame(chan, ("x", [(0, 1, "reset", pack((None, {})))]))
        (frame,) = await frames_from(chan, loop, 1)
        assert frame[0] == "r" and unpack(frame[1][0][2])["observation"].tolist() == [0.0]
    finally:
        chan.close()
        await actor.close()
