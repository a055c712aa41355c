"""The cyclic garbage collector's policy for big in-process pools: freeze what the build made.

Why. A full collection walks every object the collector tracks, and a pool of thousands of
envs adds its envs, specs and worker tasks to the ~300k objects torch and aenv's modules
already hold. Streamed steps of slow envs keep their objects alive across young
collections, so they are promoted and bring the next full collection sooner: with 4,096
envs of 512 ms, full collections took as much CPU as the steps themselves
(``benchmarks/bench_scale.py``, the ``limit`` table, its ``gc.freeze()`` column).

What. A pool whose envs live in this process (coroutine and thread backends) and that has at
least :data:`FREEZE_FROM` envs (see "From how many envs" below) moves the objects that exist once it is built, and again once
its first whole reset is done, to the collector's permanent generation (:func:`gc.freeze`):
later collections skip them. What the first operations make lazily, once per env, lives as
long as the pool too (a streamed step's input row, an env's worker task, state an env makes
on its first step, such as a random generator): so the pool freezes again each time, after
one of those freezes, as many results as it has envs have come back (whole-batch or
streamed, any operation), :data:`SETTLE_FREEZES` times at most. With 16,384 streamed envs
those objects were ~200k, walked by every full collection. Before the build's freeze it
collects the young generations, so the cyclic garbage the build made (with the collector
paused, :func:`~aenv.pool._build.paused_gc`) is not kept. The later freezes do not collect:
they come while the pool's first operations are in flight, when the young generations hold
everything made since the build, alive (4,096 concurrent episodes of the episode runner:
170-290k objects, walked in 0.06-0.30 s each, in the run's first seconds; no garbage
found). What they freeze that was in flight, reference counting frees when it ends; cyclic
garbage among it waits until the pool closes (bounded as the young generation's is, below).
When the last pool holding a freeze closes, the
objects go back (:func:`gc.unfreeze`), unless something else had frozen objects before
(then they stay as that code left them).

The steps in flight are the other part. A streamed step of a slow env lives for its latency
(a few coroutines, futures and timer handles, its result), longer than the collector's young
generation waits between collections (700 net allocations): at thousands of envs each
young collection walks steps in flight that are still alive, and they are promoted to the
older generations, whose collections then walk them again, scattered over a heap of
gigabytes, at hundreds of nanoseconds an object. A pool's results also come and go in
bursts (a receive frees hundreds at once, which the collector's count of net allocations,
never below zero, does not see), so at the default threshold the young generation was
collected every ~30 steps. So while a freezing pool is open, the young generation is
collected once per :data:`YOUNG_PER_ENV` net allocations per env of the biggest such pool
(its threshold raised, never lowered; the middle generation's, 10 of those, follows): more
than the steps in flight hold, so they die before they are walked. 4,096 streamed envs of
200 ms spent 6.7-14.1 us of collector time per step with a young threshold of 700 and the
middle one raised, 0.7-5.1 with this (``benchmarks/bench_scale.py --limit-one 4096 0.2 aenv
8``, seven runs each on a loaded machine; 0.5-1.1 over 25 s, past the startup freezes).
An episode of the episode runner holds more in flight than a streamed step: its coroutines,
the turn's tensordicts, the episode's turns so far, about 40 objects. At 10 per env, 4,096
concurrent episodes (``bench_scale.py``'s runner rows) had 15-21 young collections of
30-350 ms each in a run (the count of net allocations swings by tens of thousands as
episodes start and end together); at 100, none.

What it costs. Reference counting frees frozen objects as usual; only cyclic garbage among
them waits until the pool closes, and cyclic garbage made while it is open waits longer for
a collection (memory, not time: up to :data:`YOUNG_PER_ENV` objects per env). Freezing and
unfreezing take constant time; the thresholds in force before come back when the last pool
closes, unless other code changed them meanwhile.
``AsyncEnvPool(..., gc_freeze=False)`` turns it off, ``True`` turns it on for any size.

From how many envs. Full collections come once enough objects have outlived two younger
collections, whatever the pool's size, and each walks the whole heap (0.2-0.5 s here, most
of it torch's and aenv's modules). What decides how often is how much a pool holds across
young collections: an episode of the episode runner holds its turns so far, a streamed step
its input and result. The episode runner with no latency (every turn CPU-bound, 4 turns
per episode, ``benchmarks/bench_agents.py``'s envs and policy, ``gc.callbacks`` timing
every collection) had, without the policy: at 16 concurrent episodes no full collection in
32,768 turns; at 32, one (7-11 us per turn); at 64, three (34-46 us per turn); at 256, 18
in 65,536 turns (53-108 us per turn, about half of all its CPU). With the policy none came
at any of these sizes, and its young collections fell from hundreds to a handful. So the
default starts at 64 envs, below which a run rarely meets a full collection.
"""

from __future__ import annotations

import gc

__all__ = ["FREEZE_FROM", "GcFreeze"]

#: the pool size from which the freeze is on by default (``gc_freeze=None``)
FREEZE_FROM = 64
#: the freezes a pool makes once as many results as it has envs came back (see above)
SETTLE_FREEZES = 2
#: net allocations per env of the freezing pools between two collections of the young
#: generation (see above: 2 per env left streamed steps in flight to be walked, 5 and 20 did
#: not; the episode runner's episodes in flight needed more than 10)
YOUNG_PER_ENV = 100

_holders: set[int] = set()  # the ids of the GcFreeze objects holding a freeze
_ours = False  # the permanent generation was empty when the first holder froze
# the collector's thresholds before the first holder raised them, and those it set
_thresholds: tuple[tuple[int, ...], tuple[int, ...]] | None = None


class GcFreeze:
    """One pool's part in the freeze (see the module docstring)."""

    __slots__ = ("_n", "_reset_frozen", "_settles", "countdown", "on")

    def __init__(self, option: bool | None, num_envs: int, in_process: bool) -> None:
        if option is not None and not isinstance(option, bool):
            raise TypeError(f"gc_freeze must be True, False or None, got {option!r}")
        self.on = in_process and (option if option is not None else num_envs >= FREEZE_FROM)
        self._reset_frozen = False  # the first whole reset has joined the freeze
        self._n = num_envs
        self._settles = SETTLE_FREEZES  # the result-count freezes left to make
        #: the results still to come back before the next freeze (0: none planned); the
        #: pool calls :meth:`results` only while it is set
        self.countdown = 0

    def _freeze(self) -> None:
        gc.freeze()
        self.countdown = self._n if self._settles and self._n else 0

    def built(self) -> None:
        """The pool's envs are built: freeze them (collecting the young garbage first)."""
        global _ours, _thresholds
        if not self.on:
            return
        if not _holders:
            _ours = gc.get_freeze_count() == 0
        _holders.add(id(self))
        before = gc.get_threshold()
        want = YOUNG_PER_ENV * self._n
        if before[0] and want > before[0]:  # (0: automatic collection off, left so)
            gc.set_threshold(want, *before[1:])
            _thresholds = (_thresholds[0] if _thresholds else before, gc.get_threshold())
        gc.collect(1)  # (the build's garbage: see the module docstring)
        self._freeze()

    def reset_done(self) -> None:
        """A whole reset finished: the first one's worker tasks and results join the freeze."""
        if self.on and id(self) in _holders and not self._reset_frozen:
            self._reset_frozen = True
            self._freeze()

    def results(self, k: int) -> None:
        """``k`` results came back (called while :attr:`countdown` is set): once as many as
        the pool has envs did since the last freeze, freeze what their first operations
        made."""
        self.countdown -= k
        if self.countdown <= 0 and id(self) in _holders:
            self._settles -= 1
            self._freeze()

    def release(self) -> None:
        """The pool closed: the last holder gives the frozen objects back to the collector."""
        global _ours, _thresholds
        if id(self) not in _holders:
            return
        _holders.discard(id(self))
        self.countdown = 0
        if _holders:
            return
        if _thresholds is not None:
            before, ours = _thresholds
            _thresholds = None
            if gc.get_threshold() == ours:
                gc.set_threshold(*before)
        if _ours:
            _ours = False
            gc.unfreeze()
