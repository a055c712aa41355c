"""The cyclic garbage collector's policy for big in-process pools: freeze what the build made.

Why. A full collection walks every object the collector tracks, and a pool of thousands of
envs adds its envs, specs and worker tasks to the ~300k objects torch and aenv's modules
already hold. Streamed steps of slow envs keep their objects alive across young
collections, so they are promoted and bring the next full collection sooner: with 4,096
envs of 512 ms, full collections took as much CPU as the steps themselves
(``benchmarks/bench_scale.py``, the ``limit`` table, its ``gc.freeze()`` column).

What. A pool whose envs live in this process (coroutine and thread backends) and that has at
least :data:`FREEZE_FROM` envs moves the objects that exist once it is built, and again once
its first whole reset is done, to the collector's permanent generation (:func:`gc.freeze`):
later collections skip them. Before each freeze it collects the young generations, so
garbage made by the build or the reset is not kept. When the last pool holding a freeze closes, the
objects go back (:func:`gc.unfreeze`), unless something else had frozen objects before
(then they stay as that code left them).

What it costs. Reference counting frees frozen objects as usual; only cyclic garbage among
them waits until the pool closes. Freezing and unfreezing take constant time.
``AsyncEnvPool(..., gc_freeze=False)`` turns it off, ``True`` turns it on for any size.
"""

from __future__ import annotations

import gc

__all__ = ["FREEZE_FROM", "GcFreeze"]

#: the pool size from which the freeze is on by default (``gc_freeze=None``)
FREEZE_FROM = 1024

_holders: set[int] = set()  # the ids of the GcFreeze objects holding a freeze
_ours = False  # the permanent generation was empty when the first holder froze


class GcFreeze:
    """One pool's part in the freeze (see the module docstring)."""

    __slots__ = ("_reset_frozen", "on")

    def __init__(self, option: bool | None, num_envs: int, in_process: bool) -> None:
        if option is not None and not isinstance(option, bool):
            raise TypeError(f"gc_freeze must be True, False or None, got {option!r}")
        self.on = in_process and (option if option is not None else num_envs >= FREEZE_FROM)
        self._reset_frozen = False  # the first whole reset has joined the freeze

    def built(self) -> None:
        """The pool's envs are built: freeze them (collecting the young garbage first)."""
        global _ours
        if not self.on:
            return
        if not _holders:
            _ours = gc.get_freeze_count() == 0
        _holders.add(id(self))
        gc.collect(1)
        gc.freeze()

    def reset_done(self) -> None:
        """A whole reset finished: the first one's worker tasks and results join the freeze."""
        if self.on and id(self) in _holders and not self._reset_frozen:
            self._reset_frozen = True
            gc.collect(1)
            gc.freeze()

    def release(self) -> None:
        """The pool closed: the last holder gives the frozen objects back to the collector."""
        global _ours
        if id(self) not in _holders:
            return
        _holders.discard(id(self))
        if not _holders and _ours:
            _ours = False
            gc.unfreeze()
