"""A worker's doorbell: the wake-up and completion signal of a stacked whole-batch step.

A stacked step (:meth:`~aenv.pool._process.ProcessBackend.launch`) has its inputs
and results in the shared-memory rows already; what is left to exchange is "go" and
"done". Sending them as pickled frames over the worker's socket cost each side a pickle,
a frame and a socket write per batch (the write that wakes the other end being the
dearest single item of the parent's batch step). The doorbell carries them instead: a small
shared page and an ``eventfd`` go counter per worker, and the pool's tally (below).

* go: the parent writes the op, the bank, one byte per env of the worker (whether it steps,
  and whether it first carries its input's observation and done flags over from the bank
  before's results: a chained step's, see :meth:`~aenv.pool._shm.StackedBlocks.carry`)
  into the page, then the call's sequence number, then adds 1 to the go counter.
* frames: after each frame it writes to the worker's socket, the parent writes how many it
  wrote so far into the page. Rung, the worker reads its socket first only when a frame
  waits there (a cancel or replace sent before it took the call must be seen first), which
  spares it a read per step.
* done: once every env answered with its results in the rows, the worker writes each
  env's outcome flag (0: not part of it, 1: in the rows, 2: in the rows and reset), then
  the sequence number into its page. Only the last of the call's workers to finish wakes
  the parent (:class:`Tally`): one wake-up per call at most, however many workers it
  rang (none for a call whose last worker rang a chained call with another armed after
  it, below).

Everything else (failures, pickled results, streamed batches, cancels, crashes) keeps the
socket, so a call whose envs do not all answer in the rows comes back as a ``"b"`` frame
as before (that worker still counts as finished in the tally).

The tally (:class:`Tally`, one per pool): a done counter the parent's loop watches and a
counter of tokens (an ``eventfd`` in semaphore mode, whose reads take one token or fail,
atomically across processes). Ringing a call on ``k`` workers, the parent first takes any
token left (a call given up, a worker that died; not needed, and skipped, when every worker
of the call before answered it on its page: each of them took a token or rang), then puts
``k - 1`` tokens in. A worker
that finished its share takes a token; the one that finds none is the last, and adds 1 to
the done counter. Woken, the parent reads every worker's page for answers it has not
taken. What can go wrong only adds wake-ups: a worker still finishing a call given up may
take a token meant for the next call (the next call's last two workers both ring), and
for a worker that died the parent takes its token itself (then reads the pages).

Chained calls (an overlapped rollout's step ``t + 1``, sent the moment step ``t`` came back
whole: :meth:`~aenv.pool._process.ProcessBackend.launch` with ``after``) may be rung by the
workers themselves, the parent off the path between the two steps. The banks are taken in
turn (:data:`~aenv.pool._shm.BANKS` of them): a call is chained on the bank after its
call's, so up to ``BANKS - 1`` calls may be armed ahead of the call in flight, each after
the one before, and the workers run them one after the other without the parent. The parent
writes the chained call into every worker's page ahead of time (its sequence number, op and
whether its envs carry, in the area of the call's bank), then arms it: the call after which it is
chained and its own number into the pool's page, then one token into the bank's chain
counter (an ``eventfd`` in semaphore mode). The last worker of call ``t`` (the one that
finds no tally token) rings the chained call when ``t`` was the call it is armed after and
every worker of the pool answered ``t`` on its page with every env's results in the rows
(each worker writes the number of the call it so answered into the pool's page before it
takes a token; a failure, a pickled result, an env left out leave it unwritten), and when it
takes the chain's token: then it puts the call's tally tokens in, writes the number into
the pool's page as rung on that bank and adds 1 to every worker's go counter (it has all of
them, its own included), before it wakes the parent for ``t``, which it does not where two
calls are armed after the one it rang (the last worker of a later call wakes the parent,
while the workers still have a call armed to run, and it takes every call answered since,
oldest first). The parent, woken, takes the chain's token back to disarm it (a call that
failed, one given up, one the workers did not ring because the parent armed it too late):
whoever takes the token owns the ring, so the call is rung once, by a worker or by the
parent, or never. A worker looks at the pool's page again once it holds the token: a worker
stalled since its first look may take the token of a call armed after another call since
(the one it saw was taken back), and hands it back. The parent that finds no token waits
for the call marked rung or the token back (a worker holds it a few instructions), as long
as every worker lives. A rung worker takes such a call
from its page when the pool's page says it was rung on its bank; each env that call ``t``
reset (its outcome byte on the page) carries from its ``"reset"`` row. Answers are kept per
bank on the page, so a worker may answer ``t + 1`` (and the calls after it, one per bank)
before the parent took ``t``; a bank is armed again only once the parent took its call.

Measured on a 2-core machine (see ``benchmarks/RESULTS.md``), an eventfd or a pipe
wake-up costs about half a socket write, and a shared-memory flag with a short spin before
sleeping was slower at every cost per step (the spinner takes a core from the workers), so
the doorbell sleeps at once.

The page: ``<q`` go sequence at 0, op at 8, bank at 9, ``<q`` frames sent at 16, per bank
an armed call's op (a byte each from 24), then whether it carries (a byte each), then per
bank ``<q`` done sequence and armed sequence (from the next multiple of 8), then one byte
per env of the worker (:data:`STEPS`, :data:`CARRY_NEXT`, :data:`CARRY_RESET` bits), then
per bank one outcome byte per env. The pool's page: ``<q`` workers at 0, per bank ``<q``
armed after, armed sequence and rung (from 8), then per worker ``<q`` the call it last
answered whole in the rows.
The pages' writes are ordered with the counters' by the eventfd syscalls (each takes the
counter's lock: a worker's answer is seen by whoever takes its token or is woken after it).
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import struct
import time
import weakref
from collections.abc import Callable, Sequence

from aenv.pool._shm import BANKS

__all__ = ["CARRY_NEXT", "CARRY_RESET", "MAX_PEERS", "OPS", "STEPS", "STEP_BITS", "Bell", "Tally"]

#: op names by their code in the page
OPS = ("step", "step_and_maybe_reset")
_CODE = {op: k for k, op in enumerate(OPS)}
_SEQ = struct.Struct("<q")
_GO, _OP, _BANK, _SENT, _ARMED_OP, _ARMED_CARRY = 0, 8, 9, 16, 24, 24 + BANKS
_DONE = 24 + 2 * BANKS + (-2 * BANKS) % 8
_ARMED = _DONE + 8 * BANKS
_MASK = _ARMED + 8 * BANKS
#: one ``<q`` per bank (the page's done and armed sequences, the pool page's rung ones), read
#: together
_PER_BANK = struct.Struct(f"<{BANKS}q")
# the pool's page: workers, per bank the call armed after, the call armed and the call rung,
# then per worker the call last answered whole in the rows
_WORKERS, _AFTER = 0, 8
_CHAINED = _AFTER + 8 * BANKS
_RUNG = _CHAINED + 8 * BANKS
_WHOLE = _RUNG + 8 * BANKS
#: the most workers a chained call is rung by (their go counters travel in one message)
MAX_PEERS = 240
#: an env's byte: it steps; before, it carries its input over from the bank before's
#: ``"next"`` row, or from its ``"reset"`` row (it was reset)
STEPS, CARRY_NEXT, CARRY_RESET = 1, 2, 4
#: a byte of the page, reduced to its :data:`STEPS` bit (``bytes.translate``)
STEP_BITS = bytes(b & STEPS for b in range(256))


def _close(fds: list[int], page: mmap.mmap | None) -> None:
    if page is not None:
        with contextlib.suppress(Exception):
            page.close()
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class Tally:
    """A pool's tally of finished workers and its chained calls' arming (see the module
    docstring): the parent's side.

    ``fds``: the done counter's, the tokens', the pool page's and the banks' chain
    counters' descriptors, sent to every worker with its doorbell's.
    """

    def __init__(self) -> None:
        fds: list[int] = []
        page = None
        try:
            fds.append(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))
            fds.append(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC | os.EFD_SEMAPHORE))
            fds.append(os.memfd_create("aenv-tally", os.MFD_CLOEXEC))
            os.ftruncate(fds[2], mmap.PAGESIZE)
            for _ in range(BANKS):
                fds.append(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC | os.EFD_SEMAPHORE))
            page = mmap.mmap(fds[2], mmap.PAGESIZE)
        except BaseException:
            _close(fds, None)
            raise
        self.fds = fds
        self.done_fd, self.tokens_fd, self.page_fd = fds[:3]
        self.chain_fds = fds[3 : 3 + BANKS]
        #: the pool's page (see the module docstring)
        self.page = page
        self._finalizer = weakref.finalize(self, _close, self.fds, page)
        #: the parent's loop watching the done counter
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def attach(self, loop: asyncio.AbstractEventLoop, on_done: Callable[[], None]) -> None:
        """Watch the done counter from ``loop`` (moving from a previous loop if any)."""
        if self.loop is loop or self.closed:
            return
        self.detach()
        loop.add_reader(self.done_fd, on_done)
        self.loop = loop

    def detach(self) -> None:
        """Stop watching the done counter (from a loop that may already be closed)."""
        loop, self.loop = self.loop, None
        if loop is not None and not loop.is_closed() and not self.closed:
            loop.remove_reader(self.done_fd)

    def close(self) -> None:
        """Stop watching and close the descriptors (idempotent)."""
        if not self.closed:
            self.detach()
        self._finalizer()

    def arm(self, workers: int, drained: bool = False) -> None:
        """A call is about to be rung on ``workers`` workers: the last to finish rings.
        ``drained``: every worker rung for the call before answered it on its page, so
        each took its token or rang (none is left to take back)."""
        fd = self.tokens_fd
        if not drained:
            try:
                while True:  # (tokens left by a call given up or a worker that died)
                    os.eventfd_read(fd)
            except BlockingIOError:
                pass
        if workers > 1:
            os.eventfd_write(fd, workers - 1)

    def stand_in(self) -> None:
        """Finish for a rung worker that died: take its token (the pages are read next)."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.tokens_fd)

    def take(self) -> None:
        """Reset the done counter (the parent was woken: it reads the pages next)."""
        try:
            os.eventfd_read(self.done_fd)
        except BlockingIOError:
            pass

    def set_workers(self, workers: int) -> None:
        """The pool's workers, each answering whole calls into its entry of the page
        (worker ids ``0 .. workers - 1``)."""
        _SEQ.pack_into(self.page, _WORKERS, workers)

    def arm_chain(self, bank: int, after: int, seq: int) -> None:
        """Arm call ``seq`` (written into every worker's page already, see
        :meth:`Bell.arm`) on ``bank``: the last worker of call ``after`` rings it, when
        every worker answered ``after`` whole in the rows. One call is armed per bank at
        a time (the one before was rung or disarmed)."""
        page = self.page
        _SEQ.pack_into(page, _CHAINED + 8 * bank, seq)
        _SEQ.pack_into(page, _AFTER + 8 * bank, after)
        os.eventfd_write(self.chain_fds[bank], 1)

    def disarm(self, bank: int, alive: Callable[[], bool] | None = None) -> bool:
        """Take the call armed on ``bank`` back: True when it was still armed (it will not
        be rung by a worker), False when a worker rang it.

        A worker that took the token and has not yet marked the call rung (or handed the
        token back: it was a later arm's, see :meth:`Bell._ring_chained`) holds it for a
        few instructions; the parent waits for either, yielding the CPU, as long as
        ``alive()`` says every worker lives (a worker dead with the token rang the call or
        not: either way its death fails the calls in flight)."""
        fd, page = self.chain_fds[bank], self.page
        seq = _SEQ.unpack_from(page, _CHAINED + 8 * bank)[0]
        tries = 0
        while True:
            try:
                os.eventfd_read(fd)
            except BlockingIOError:
                if _SEQ.unpack_from(page, _RUNG + 8 * bank)[0] == seq:
                    return False
            else:
                _SEQ.pack_into(page, _AFTER + 8 * bank, 0)
                return True
            tries += 1
            if tries < 64:
                os.sched_yield()
                continue
            if alive is not None and not alive():
                return False
            time.sleep(0.0002)


class Bell:
    """One worker's doorbell (see the module docstring).

    Args:
        n: the number of envs the worker holds.
        fds: the page's, the go counter's, and the pool's (:attr:`Tally.fds`)
            descriptors (the worker's side, received from the parent); None makes a new
            page and go counter and takes the others from ``tally`` (the parent's side).
        tally: the pool's :class:`Tally` (the parent's side).
    """

    def __init__(
        self, n: int, fds: Sequence[int] | None = None, tally: Tally | None = None
    ) -> None:
        self.n = n
        size = mmap.PAGESIZE * (1 + (_MASK + (1 + BANKS) * n) // mmap.PAGESIZE)
        pool = None
        if fds is None:
            assert tally is not None
            page_fd = os.memfd_create("aenv-bell", os.MFD_CLOEXEC)
            try:
                os.ftruncate(page_fd, size)
                go = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            except BaseException:
                os.close(page_fd)
                raise
            own = [page_fd, go]
            fds = [*own, *tally.fds]
        else:
            for fd in fds:
                os.set_blocking(fd, False)
            own = list(fds)
            pool = mmap.mmap(fds[4], mmap.PAGESIZE)
        #: what goes to the worker: page, go counter, then the pool's (Tally.fds)
        self.fds = list(fds)
        self.page_fd, self.go_fd, self.done_fd, self.tokens_fd = self.fds[:4]
        self.chain_fds = self.fds[5 : 5 + BANKS]
        self.page = mmap.mmap(self.page_fd, size)
        #: the pool's page (the worker's side)
        self.pool = pool
        self._res = _MASK + n
        self._all = bytes([STEPS]) * n
        self._carry_all = bytes([STEPS | CARRY_NEXT]) * n
        #: the last sequence number taken from the page (go on the worker, done on the parent)
        self.taken = 0
        #: per bank, the last done sequence number taken (the parent's side)
        self._seen = [0] * BANKS
        #: the worker's id and every worker's go counter, its own included (the worker's
        #: side: it rings the chained calls it finds armed, see :meth:`link`)
        self.wid = -1
        self.peers: list[int] = []
        # (the parent's side closes only its page and go counter: the tally is the pool's)
        self._finalizer = weakref.finalize(self, _close, own, self.page)
        if pool is not None:
            weakref.finalize(self, pool.close)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @staticmethod
    def available() -> bool:
        """Whether this platform has what the doorbell needs (Linux's eventfd, memfd)."""
        return hasattr(os, "eventfd") and hasattr(os, "memfd_create")

    def close(self) -> None:
        """Unmap the page and close the descriptors (idempotent)."""
        self._finalizer()

    # ------------------------------------------------------------------ parent side
    def note_sent(self, sent: int) -> None:
        """``sent`` frames were written to the worker's socket so far."""
        _SEQ.pack_into(self.page, _SENT, sent)

    def ring(self, seq: int, op: str, bank: int, flags: bytes | None) -> None:
        """Start call ``seq``: ``op`` on bank ``bank``, one byte of :data:`STEPS` /
        :data:`CARRY_NEXT` / :data:`CARRY_RESET` bits per env in ``flags`` (every env
        steps, nothing carried, when None)."""
        page = self.page
        page[_OP] = _CODE[op]
        page[_BANK] = bank
        n = self.n
        page[_MASK : _MASK + n] = self._all if flags is None else flags
        _SEQ.pack_into(page, _GO, seq)
        os.eventfd_write(self.go_fd, 1)

    def arm(self, seq: int, op: str, bank: int, carry: bool) -> None:
        """Write call ``seq`` (every env steps ``op`` on ``bank``; ``carry``: each first
        carries its input over from the bank before's results) into the page, for a worker
        to ring (see :meth:`Tally.arm_chain`)."""
        page = self.page
        page[_ARMED_OP + bank] = _CODE[op]
        page[_ARMED_CARRY + bank] = carry
        _SEQ.pack_into(page, _ARMED + 8 * bank, seq)

    def take_done(self) -> tuple[int, bytes] | None:
        """The oldest completed call not taken yet: its sequence number and one outcome
        byte per env; None when there is none."""
        page, seen = self.page, self._seen
        bank, seq = -1, 0
        for b, done in enumerate(_PER_BANK.unpack_from(page, _DONE)):
            if done != seen[b] and (bank < 0 or done < seq):
                bank, seq = b, done
        if bank < 0:
            return None
        seen[bank] = seq
        if seq > self.taken:
            self.taken = seq
        at = self._res + bank * self.n
        return seq, page[at : at + self.n]

    def answered(self) -> int:
        """The sequence number of the latest call the worker answered (a look at the page:
        nothing is taken, the done counter is left as it is)."""
        page = self.page
        return int(max(_PER_BANK.unpack_from(page, _DONE)))

    # ------------------------------------------------------------------ worker side
    def link(self, wid: int, peers: list[int]) -> None:
        """The worker's id, and every worker's go counter (its own included): it rings the
        chained calls armed after the calls it finishes last (see :meth:`finished`)."""
        self.wid, self.peers = wid, peers

    def sent(self) -> int:
        """The number of socket frames the parent had written when it rang last."""
        return int(_SEQ.unpack_from(self.page, _SENT)[0])

    def take_go(self) -> tuple[int, str, int, bytes] | None:
        """The call rung and not taken yet: sequence number, op, bank, one byte of flags
        per env (see :meth:`ring`); None when there is none (taken already). A chained call
        a worker rang (see :meth:`arm`) carries each env's input from the bank before's
        ``"next"`` row, or its ``"reset"`` row where the call before reset it."""
        try:
            os.eventfd_read(self.go_fd)
        except BlockingIOError:
            pass
        page = self.page
        seq = _SEQ.unpack_from(page, _GO)[0]
        if seq > self.taken:
            self.taken = seq
            return seq, OPS[page[_OP]], page[_BANK], page[_MASK : _MASK + self.n]
        pool = self.pool
        if pool is None:
            return None
        bank, seq, taken = -1, 0, self.taken
        rung = _PER_BANK.unpack_from(pool, _RUNG)
        # (the oldest call rung on its bank and not taken)
        for b, armed in enumerate(_PER_BANK.unpack_from(page, _ARMED)):
            if armed > taken and armed == rung[b] and (bank < 0 or armed < seq):
                bank, seq = b, armed
        if bank < 0:
            return None
        self.taken = seq
        n = self.n
        if not page[_ARMED_CARRY + bank]:
            return seq, OPS[page[_ARMED_OP + bank]], bank, self._all
        at = self._res + (bank - 1) % BANKS * n
        before = page[at : at + n]  # (the call chained after: its outcomes)
        flags = self._carry_all
        if 2 in before:
            flags = bytes(STEPS | (CARRY_RESET if o == 2 else CARRY_NEXT) for o in before)
        return seq, OPS[page[_ARMED_OP + bank]], bank, flags

    def answer(self, seq: int, outcomes: bytes, bank: int = 0) -> None:
        """Call ``seq`` on ``bank`` is done, every env's results in the rows: ``outcomes``
        has one byte per env (0: not in the call, 1: done, 2: done and reset)."""
        page = self.page
        at = self._res + bank * self.n
        page[at : at + self.n] = outcomes
        _SEQ.pack_into(page, _DONE + 8 * bank, seq)
        pool = self.pool
        if pool is not None and self.wid >= 0 and 0 not in outcomes:
            _SEQ.pack_into(pool, _WHOLE + 8 * self.wid, seq)
        self.finished(seq, bank)

    def finished(self, seq: int = 0, bank: int = 0) -> None:
        """This worker is done with the call rung last (answered on the page or over the
        socket): the last of its workers to finish wakes the parent (see :class:`Tally`),
        and first rings the call chained to it (``seq`` on ``bank``, answered whole on the
        page) when it is armed (see the module docstring)."""
        try:
            os.eventfd_read(self.tokens_fd)
        except BlockingIOError:
            if seq and self.peers and self._ring_chained(seq, (bank + 1) % BANKS):
                return  # (the parent is woken by a later call: see _ring_chained)
            os.eventfd_write(self.done_fd, 1)

    def _ring_chained(self, after: int, bank: int) -> bool:
        """Ring the call armed on ``bank`` after call ``after`` when every worker answered
        ``after`` whole and this worker takes its token (see the module docstring). True
        when it rang it and two more calls are armed after that one: the parent need not
        be woken for ``after`` (the last worker of a later call wakes it, for all of them,
        while the workers still have a call armed to run)."""
        pool = self.pool
        assert pool is not None
        if _SEQ.unpack_from(pool, _AFTER + 8 * bank)[0] != after:
            return False
        workers = _SEQ.unpack_from(pool, _WORKERS)[0]
        if workers != len(self.peers):
            return False
        for at in range(_WHOLE, _WHOLE + 8 * workers, 8):
            if _SEQ.unpack_from(pool, at)[0] != after:
                return False
        fd = self.chain_fds[bank]
        try:
            os.eventfd_read(fd)
        except BlockingIOError:
            return False  # (disarmed by the parent)
        if _SEQ.unpack_from(pool, _AFTER + 8 * bank)[0] != after:
            # the token of a call armed since the look above (the one this worker saw was
            # taken back, a stall of this worker ago): not this call's to ring, handed back
            os.eventfd_write(fd, 1)
            return False
        rung = _SEQ.unpack_from(pool, _CHAINED + 8 * bank)[0]
        _SEQ.pack_into(pool, _RUNG + 8 * bank, rung)
        if workers > 1:
            os.eventfd_write(self.tokens_fd, workers - 1)
        for fd in self.peers:
            os.eventfd_write(fd, 1)
        # (the parent's lead: woken before the workers run out of armed calls, it arms
        # the next ones while they run the last two)
        for _ in range(2):
            bank = (bank + 1) % BANKS
            if _SEQ.unpack_from(pool, _AFTER + 8 * bank)[0] != rung:
                return False
            rung = _SEQ.unpack_from(pool, _CHAINED + 8 * bank)[0]
        return True
