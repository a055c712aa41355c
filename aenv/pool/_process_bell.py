"""A worker's doorbell: the wake-up and completion signal of a stacked whole-batch step.

A stacked step (:meth:`~aenv.pool._process.ProcessBackend.launch`) has its inputs
and results in the shared-memory rows already; what is left to exchange is "go" and
"done". Sending them as pickled frames over the worker's socket cost each side a pickle,
a frame and a socket write per batch (the write that wakes the other end being the
dearest single item of the parent's batch step). The doorbell carries them instead: a small
shared page and an ``eventfd`` go counter per worker, and the pool's tally (below).

* go: the parent writes the op, the bank, one byte per env of the worker (whether it steps,
  and whether it first carries its input's observation and done flags over from the other
  bank's results: a chained step's, see :meth:`~aenv.pool._shm.StackedBlocks.carry`)
  into the page, then the call's sequence number, then adds 1 to the go counter.
* frames: after each frame it writes to the worker's socket, the parent writes how many it
  wrote so far into the page. Rung, the worker reads its socket first only when a frame
  waits there (a cancel or replace sent before it took the call must be seen first), which
  spares it a read per step.
* done: once every env answered with its results in the rows, the worker writes each
  env's outcome flag (0: not part of it, 1: in the rows, 2: in the rows and reset), then
  the sequence number into its page. Only the last of the call's workers to finish wakes
  the parent (:class:`Tally`): one wake-up per call, however many workers it rang.

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

Measured on a 2-core machine (see ``benchmarks/RESULTS.md``), an eventfd or a pipe
wake-up costs about half a socket write, and a shared-memory flag with a short spin before
sleeping was slower at every cost per step (the spinner takes a core from the workers), so
the doorbell sleeps at once.

The page: ``<q`` go sequence at 0, op at 8, bank at 9, ``<q`` done sequence at 16, ``<q``
frames sent at 24, then one byte per env of the worker (:data:`STEPS`, :data:`CARRY_NEXT`,
:data:`CARRY_RESET` bits), then one outcome byte per env. The page's writes are ordered
with the counters' by the eventfd syscalls (each takes the counter's lock: a worker's
answer is seen by whoever takes its token or is woken after it).
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import struct
import weakref
from collections.abc import Callable, Sequence

__all__ = ["CARRY_NEXT", "CARRY_RESET", "OPS", "STEPS", "STEP_BITS", "Bell", "Tally"]

#: op names by their code in the page
OPS = ("step", "step_and_maybe_reset")
_CODE = {op: k for k, op in enumerate(OPS)}
_SEQ = struct.Struct("<q")
_GO, _OP, _BANK, _DONE, _SENT, _MASK = 0, 8, 9, 16, 24, 32
#: an env's byte: it steps; before, it carries its input over from the other bank's
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
    """A pool's tally of finished workers (see the module docstring): the parent's side.

    ``fds``: the done counter's and the tokens' descriptors, sent to every worker with its
    doorbell's.
    """

    def __init__(self) -> None:
        done = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            tokens = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC | os.EFD_SEMAPHORE)
        except BaseException:
            os.close(done)
            raise
        self.fds = [done, tokens]
        self.done_fd, self.tokens_fd = self.fds
        self._finalizer = weakref.finalize(self, _close, self.fds, None)
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


class Bell:
    """One worker's doorbell (see the module docstring).

    Args:
        n: the number of envs the worker holds.
        fds: the page's, the go counter's, the pool's done counter's and tokens'
            descriptors (the worker's side, received from the parent); None makes a new
            page and go counter and takes the others from ``tally`` (the parent's side).
        tally: the pool's :class:`Tally` (the parent's side).
    """

    def __init__(
        self, n: int, fds: Sequence[int] | None = None, tally: Tally | None = None
    ) -> None:
        self.n = n
        size = mmap.PAGESIZE * (1 + (_MASK + 2 * n) // mmap.PAGESIZE)
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
        #: what goes to the worker: page, go counter, done counter, tokens
        self.fds = list(fds)
        self.page_fd, self.go_fd, self.done_fd, self.tokens_fd = self.fds
        self.page = mmap.mmap(self.page_fd, size)
        self._res = _MASK + n
        self._all = bytes([STEPS]) * n
        #: the last sequence number taken from the page (go on the worker, done on the parent)
        self.taken = 0
        # (the parent's side closes only its page and go counter: the tally is the pool's)
        self._finalizer = weakref.finalize(self, _close, own, self.page)

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

    def take_done(self) -> tuple[int, bytes] | None:
        """The latest completed call not taken yet: its sequence number and one outcome
        byte per env; None when there is none."""
        seq = _SEQ.unpack_from(self.page, _DONE)[0]
        if seq == self.taken:
            return None
        self.taken = seq
        return seq, self.page[self._res : self._res + self.n]

    def answered(self) -> int:
        """The sequence number of the latest call the worker answered (a look at the page:
        nothing is taken, the done counter is left as it is)."""
        return int(_SEQ.unpack_from(self.page, _DONE)[0])

    # ------------------------------------------------------------------ worker side
    def sent(self) -> int:
        """The number of socket frames the parent had written when it rang last."""
        return int(_SEQ.unpack_from(self.page, _SENT)[0])

    def take_go(self) -> tuple[int, str, int, bytes] | None:
        """The call rung and not taken yet: sequence number, op, bank, one byte of flags
        per env (see :meth:`ring`); None when there is none (taken already)."""
        try:
            os.eventfd_read(self.go_fd)
        except BlockingIOError:
            pass
        seq = _SEQ.unpack_from(self.page, _GO)[0]
        if seq <= self.taken:
            return None
        self.taken = seq
        page = self.page
        return seq, OPS[page[_OP]], page[_BANK], page[_MASK : _MASK + self.n]

    def answer(self, seq: int, outcomes: bytes) -> None:
        """Call ``seq`` is done, every env's results in the rows: ``outcomes`` has one
        byte per env (0: not in the call, 1: done, 2: done and reset)."""
        self.page[self._res : self._res + self.n] = outcomes
        _SEQ.pack_into(self.page, _DONE, seq)
        self.finished()

    def finished(self) -> None:
        """This worker is done with the call rung last (answered on the page or over the
        socket): the last of its workers to finish wakes the parent (see :class:`Tally`)."""
        try:
            os.eventfd_read(self.tokens_fd)
        except BlockingIOError:
            os.eventfd_write(self.done_fd, 1)
