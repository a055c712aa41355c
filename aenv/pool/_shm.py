"""Shared-memory slots of the process backend: one input and two output slots per env.

The parent plans a layout from the specs its workers sent (:func:`plan_layout`), makes one
anonymous shared region for all of a pool's workers (:func:`make_region`: a ``memfd`` on
Linux, an unlinked file elsewhere, so nothing is left behind whatever happens to either
process) and passes its descriptor to each worker once. Both sides then view the region as tensors
(:func:`map_slots`). A step writes its input (action, state, the last observation and done
flags) into the env's ``"in"`` slot and its result
comes back in the ``"next"`` (or ``"reset"``) slot: only a tiny message crosses the pipe.

Like envs (same keys, shapes, dtypes) have their slots laid out as rows of one block per
leaf (:class:`Block`), across workers: a whole batch's results are one view per leaf, read
in place (:meth:`StackedBlocks.rows`) and copied once by whoever keeps them.

A region holds :data:`BANKS` copies of that layout (banks), one after the other: a
whole-batch command names the bank it uses, so that while the workers run a step on one
bank, the parent writes the next steps' inputs into the others (an overlapped rollout takes
them in turn, up to ``BANKS - 1`` steps ahead), and reads a step's results once it has
sent the ones after it (see :meth:`~aenv.pool._process.ProcessBackend.launch`).
Every other use is bank 0. A bank is a suffix view of the region
(``flat[b * bank_size:]``) handed to :func:`map_slots` / :func:`map_blocks`.

An env whose specs hold non-tensor leaves or dynamic (-1) dims, or a device other than the
CPU, gets no slots: its data travels pickled. A result that does not fit its slot (a key
more or less, another shape or dtype) is pickled too (:meth:`Slot.write` says so), so the
slots are an optimisation that never changes what comes back.
"""

from __future__ import annotations

import mmap
import operator
import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._rowplan import INPUT_GROUPS, RESET_GROUPS, STEP_GROUPS
from aenv.envs._utils import EnvMetaData

__all__ = [
    "Block",
    "Slot",
    "StackedBlocks",
    "carried_keys",
    "carry_pairs",
    "make_region",
    "map_blocks",
    "map_region",
    "map_slots",
    "plan_layout",
    "slice_blocks",
]

_ALIGN = 64
#: Copies of the slot layout in a region (bank ``b`` starts at ``b * bank_size``): the
#: step in flight and up to ``BANKS - 1`` steps armed after it (an overlapped rollout's:
#: the workers run them without the parent). 4 on 2 cores, 8 envs: the workers rang 97% of
#: the chained steps (2 banks: 60-90%), with a wake-up of the parent every 2.5 steps (3
#: banks: 95%, every 1.3 steps).
BANKS = 4
#: Slot kinds: the step input, the step result ("next" content), the reset result.
KINDS = ("in", "next", "reset")

# (key, dtype name, shape, byte offset) for each leaf of a slot
Leaf = tuple[Any, str, tuple[int, ...], int]
# per env: batch size and, per kind, its leaves
EnvLayout = tuple[tuple[int, ...], dict[str, list[Leaf]]]
# per group of like envs: their indices (row order), their batch size and, per kind, the
# leaves' blocks (shape ``(rows, *leaf_shape)``)
GroupLayout = tuple[list[int], tuple[int, ...], dict[str, list[Leaf]]]


#: the spec groups each slot kind holds: a step's input is what a bare env's step gets (the
#: last observation and done flags as well as the action and state: an env may read them)
_KIND_GROUPS = {"in": INPUT_GROUPS, "next": STEP_GROUPS, "reset": RESET_GROUPS}


def _zero_leaves(meta: EnvMetaData, kind: str) -> list[tuple[Any, torch.Tensor]] | None:
    inp, out = meta.specs["input_spec"], meta.specs["output_spec"]
    leaves: list[tuple[Any, torch.Tensor]] = []
    seen = set()
    for group in _KIND_GROUPS[kind]:
        spec = inp[group] if group in ("full_action_spec", "full_state_spec") else out[group]
        if spec is None:
            continue
        for key in spec.keys(True, True):
            if key in seen:  # (a key in two groups: one slot leaf)
                continue
            seen.add(key)
            leaf = spec[key]
            if any(d < 0 for d in leaf.shape):
                return None
            value = leaf.zero()
            if type(value) is not torch.Tensor:
                return None
            leaves.append((key, value))
    return leaves


def plan_layout(
    metas: dict[int, EnvMetaData],
) -> tuple[dict[int, EnvLayout | None], list[GroupLayout], int]:
    """Byte layout of the slots of one worker's envs in one region.

    Envs whose slots have the same leaves (keys, dtypes, shapes) and batch size form a
    group; each leaf of a group is one contiguous block with one row per env (in the order
    of ``metas``), so a whole batch reads back with one copy per leaf. Returns the layout
    per env index (``None`` for pickled-only envs), the groups, and the region's size in
    bytes.
    """
    layout: dict[int, EnvLayout | None] = {}
    signatures: dict[Any, list[tuple[int, dict[str, list[Leaf]]]]] = {}
    for index, meta in metas.items():
        if meta.device is not None and torch.device(meta.device).type != "cpu":
            layout[index] = None
            continue
        try:
            kinds = {kind: _zero_leaves(meta, kind) for kind in KINDS}
        except Exception:
            layout[index] = None
            continue
        if any(v is None for v in kinds.values()):
            layout[index] = None
            continue
        leaves = {
            kind: [
                (
                    key,
                    str(value.dtype).removeprefix("torch."),
                    tuple(value.shape),
                    value.numel() * value.element_size(),
                )
                for key, value in kind_leaves or ()
            ]
            for kind, kind_leaves in kinds.items()
        }
        sig = (tuple(meta.batch_size), tuple((k, tuple(v)) for k, v in leaves.items()))
        signatures.setdefault(sig, []).append((index, leaves))
    groups: list[GroupLayout] = []
    offset = 0
    for (batch_size, _), members in signatures.items():
        rows = len(members)
        blocks: dict[str, list[Leaf]] = {}
        per_env: list[dict[str, list[Leaf]]] = [{} for _ in members]
        for kind in KINDS:
            blocks[kind] = []
            for env_leaves in per_env:
                env_leaves[kind] = []
            for key, dtype_name, shape, nbytes in members[0][1][kind]:
                blocks[kind].append((key, dtype_name, (rows, *shape), offset))
                for row, env_leaves in enumerate(per_env):
                    env_leaves[kind].append((key, dtype_name, shape, offset + row * nbytes))
                offset += -(-max(nbytes * rows, 1) // _ALIGN) * _ALIGN
        for (index, _), env_leaves in zip(members, per_env):
            layout[index] = (batch_size, env_leaves)
        groups.append(([index for index, _ in members], batch_size, blocks))
    return layout, groups, max(offset, _ALIGN)


def make_region(size: int) -> int:
    """An anonymous shared file of ``size`` bytes; returns its descriptor (close it later)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("aenv-slots", os.MFD_CLOEXEC)
    else:  # pragma: no cover - non-Linux
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.NamedTemporaryFile(dir=folder, delete=False) as f:
            fd = os.dup(f.fileno())
            os.unlink(f.name)
    os.ftruncate(fd, size)
    return fd


def map_region(fd: int, size: int) -> torch.Tensor:
    """The region as a flat uint8 tensor (the mapping lives as long as the tensor)."""
    mm = mmap.mmap(fd, size)
    return torch.frombuffer(mm, dtype=torch.uint8)


class Slot:
    """One slot: a TensorDict whose leaves view the shared region.

    :meth:`write` copies a result in (False when it does not fit: pickle it instead);
    :meth:`read` returns a private copy.
    """

    __slots__ = ("batch_size", "by_key", "dsts", "flat_keys", "lent", "n", "sig", "td")

    def __init__(self, flat: torch.Tensor, batch_size: tuple[int, ...], leaves: list[Leaf]) -> None:
        self.batch_size = torch.Size(batch_size)
        self.td = TensorDict(batch_size=self.batch_size)
        self.by_key: dict[Any, torch.Tensor] = {}
        for key, dtype_name, shape, offset in leaves:
            view = _view(flat, dtype_name, shape, offset)
            self.td.set(key, view)
            self.by_key[key] = view
        self.n = len(self.by_key)
        self.dsts = list(self.by_key.values())
        # what a value must be to fit each leaf (dtypes are singletons: compared by identity)
        self.sig = [(key, dst.dtype, dst.shape) for key, dst in self.by_key.items()]
        # plain string keys: the fast paths read a TensorDict's entry dict directly
        self.flat_keys = all(type(key) is str for key in self.by_key)
        #: the view :meth:`lend` hands out again while it holds the slot's tensors alone
        self.lent: TensorDictBase | None = None

    def _sources(self, entries: dict[str, Any]) -> list[torch.Tensor] | None:
        srcs = []
        tensor = torch.Tensor
        for key, dtype, shape in self.sig:
            value = entries.get(key)
            if type(value) is not tensor or value.dtype is not dtype or value.shape != shape:
                return None
            srcs.append(value)
        return srcs

    def _copy_in(self, entries: dict[str, Any]) -> bool:
        """Copy a plain TensorDict's entries in, one per leaf, if all fit (else nothing)."""
        srcs = self._sources(entries)
        if srcs is None:
            return False
        _copy_all(self.dsts, srcs)
        return True

    def write(self, td: TensorDictBase) -> bool:
        """Copy ``td`` into the slot if it has exactly the slot's keys, shapes and dtypes."""
        if td.batch_size != self.batch_size:
            return False
        if self.flat_keys and type(td) is TensorDict:
            entries = td._tensordict
            return len(entries) == self.n and self._copy_in(entries)
        by_key = self.by_key
        n = 0
        for key, value in td.items(True, True):
            dst = by_key.get(key)
            if (
                dst is None
                or type(value) is not torch.Tensor
                or value.shape != dst.shape
                or value.dtype != dst.dtype
            ):
                return False
            dst.copy_(value)
            n += 1
        return n == self.n

    def write_input(self, td: TensorDictBase) -> bool:
        """Copy the slot's keys of ``td`` in (a step input: its action, state, observation
        and done flags; entries no spec names stay behind). False when a slot key is
        missing or does not fit, or ``td`` carries a ``"_step"`` mask (pickle it instead:
        the env then gets what was given, as a bare env would)."""
        if td.batch_size != self.batch_size:
            return False
        if self.flat_keys and type(td) is TensorDict:
            entries = td._tensordict
            return "_step" not in entries and self._copy_in(entries)
        if "_step" in td.keys():
            return False
        pairs = []
        for key, dst in self.by_key.items():
            value = td.get(key, None)
            if (
                type(value) is not torch.Tensor
                or value.shape != dst.shape
                or value.dtype != dst.dtype
            ):
                return False
            pairs.append((dst, value))
        for dst, value in pairs:
            dst.copy_(value)
        return True

    def view(self) -> TensorDictBase:
        """A shallow copy: a new TensorDict over the slot's tensors (entries added to it do
        not land in the slot)."""
        if self.flat_keys:
            return TensorDict._new_unsafe(
                dict(self.td._tensordict), batch_size=self.batch_size, nested=False
            )
        return self.td.copy()

    def lend(self) -> TensorDictBase:
        """:meth:`view` for a call that is over before the next one starts (a worker's
        inline step): the same TensorDict as last time while it still holds exactly the
        slot's tensors, unlocked, with the slot's batch size and no device or dim names
        (a TensorDict costs more to build than a lean env step's bookkeeping); a new view
        when the env changed it (its input is its own to change, as a bare env's is)."""
        td = self.lent
        if td is not None:
            entries = td._tensordict
            if (
                len(entries) == self.n
                and not td._is_locked
                and td._batch_size == self.batch_size
                and td._device is None
                and td._td_dim_names is None
                and all(map(operator.is_, entries.values(), self.dsts))
            ):
                return td
        if not self.flat_keys:
            return self.view()
        td = self.lent = self.view()
        return td

    def read(self) -> TensorDictBase:
        return self.td.clone()


def _copy_all(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    if not dsts:  # a slot with no tensors (an env without observation, action or reward)
        return
    if _FOREACH_COPY is not None:
        _FOREACH_COPY(dsts, srcs)
    else:  # pragma: no cover - older torch
        for dst, src in zip(dsts, srcs):
            dst.copy_(src)


_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)


def _cols(cols: list[tuple[Any, list[torch.Tensor]]]) -> list[list[Any]]:
    return [views for _, views in cols]


def _as_numpy(view: torch.Tensor) -> np.ndarray | None:
    """A numpy array over the same memory as ``view``; None for a dtype numpy lacks."""
    try:
        return view.numpy()
    except (TypeError, RuntimeError):
        return None


def _numpy_cols(cols: list[tuple[Any, list[torch.Tensor]]]) -> list[list[Any]] | None:
    out: list[list[Any]] = []
    for _, views in cols:
        arrays = [_as_numpy(view) for view in views]
        if any(a is None for a in arrays):
            return None
        out.append(arrays)
    return out


def carry_pairs(slot_in: Slot, slot_next: Slot, slot_reset: Slot) -> list[tuple[Any, Any, Any]]:
    """One env's carried input leaves (see :func:`carried_keys`) with the result leaves
    they come from, as ``(in, next, reset)`` numpy arrays (torch tensors for a dtype numpy
    lacks). A worker told to carry (:mod:`aenv.pool._process_bell`) copies one of the two
    sources into the input before the step, as :meth:`StackedBlocks.carry` does here."""
    out: list[tuple[Any, Any, Any]] = []
    for key in carried_keys(slot_in.by_key.items(), slot_next.by_key, slot_reset.by_key):
        dst, nxt, rst = slot_in.by_key[key], slot_next.by_key[key], slot_reset.by_key[key]
        a, b, c = _as_numpy(dst), _as_numpy(nxt), _as_numpy(rst)
        out.append((dst, nxt, rst) if a is None or b is None or c is None else (a, b, c))
    return out


def carry_blocks(pairs: list[list[tuple[Any, Any, Any]]]) -> list[tuple[Any, Any, Any]] | None:
    """Envs' :func:`carry_pairs` (in their rows' order) as one ``(in, next, reset)`` triple
    of numpy blocks per leaf, row ``j`` over env ``j``'s arrays: where every env has the
    same numpy leaves and each leaf's rows lie at one stride from each other (a group of
    like envs, :func:`plan_layout`). None otherwise (or for a single env)."""
    if len(pairs) < 2 or any(len(p) != len(pairs[0]) for p in pairs):
        return None
    out = []
    for k in range(len(pairs[0])):
        triple = []
        for part in range(3):
            arrays = [p[k][part] for p in pairs]
            first = arrays[0]
            if type(first) is not np.ndarray or not first.flags.c_contiguous:
                return None
            start = first.ctypes.data
            stride = arrays[1].ctypes.data - start
            if stride < first.nbytes:
                return None
            for j, a in enumerate(arrays):
                if (
                    type(a) is not np.ndarray
                    or a.dtype != first.dtype
                    or a.shape != first.shape
                    or a.strides != first.strides
                    or a.ctypes.data != start + j * stride
                ):
                    return None
            triple.append(
                np.lib.stride_tricks.as_strided(
                    first, (len(arrays), *first.shape), (stride, *first.strides)
                )
            )
        out.append((triple[0], triple[1], triple[2]))
    return out


def carried_keys(
    inputs: Any, nxt: dict[Any, torch.Tensor], rst: dict[Any, torch.Tensor]
) -> list[Any]:
    """The input leaves a step's results give the next step (observation, done flags):
    those ``(key, tensor)`` of ``inputs`` that the reset and the step both give, alike.
    An overlapped rollout stages only the actions and has these carried over."""
    out = []
    for key, dst in inputs:
        a, b = nxt.get(key), rst.get(key)
        if a is None or b is None:
            continue
        if dst.dtype == a.dtype == b.dtype and dst.shape == a.shape == b.shape:
            out.append(key)
    return out


class Block:
    """One kind of slot of a group of like envs, as one batched view: row ``r`` is the
    slot of the group's ``r``-th env. :meth:`read_rows` copies some rows out at once."""

    __slots__ = ("batch_size", "flat_keys", "td", "views")

    def __init__(self, flat: torch.Tensor, batch_size: tuple[int, ...], leaves: list[Leaf]) -> None:
        self.batch_size = torch.Size(batch_size)
        rows = leaves[0][2][0] if leaves else 0
        self.td = TensorDict(batch_size=(rows, *batch_size))
        self.views: list[tuple[Any, torch.Tensor]] = []
        for key, dtype_name, shape, offset in leaves:
            view = _view(flat, dtype_name, shape, offset)
            self.td.set(key, view)
            self.views.append((key, view))
        self.flat_keys = all(type(key) is str for key, _ in self.views)

    def read_rows(self, start: int, stop: int) -> list[TensorDictBase]:
        """Private copies of rows ``start:stop``, one TensorDict per env."""
        if not self.flat_keys:
            from aenv.pool._stacking import unbind0

            return unbind0(self.td[start:stop].clone())
        cols = [(key, view[start:stop].clone().unbind(0)) for key, view in self.views]
        batch_size = self.batch_size
        return [
            TensorDict._new_unsafe(
                {key: col[j] for key, col in cols}, batch_size=batch_size, nested=False
            )
            for j in range(stop - start)
        ]


def _view(flat: torch.Tensor, dtype_name: str, shape: tuple[int, ...], offset: int) -> torch.Tensor:
    dtype = getattr(torch, dtype_name)
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    return flat[offset : offset + nbytes].view(dtype).view(shape)


def map_slots(flat: torch.Tensor, layout: EnvLayout | None) -> dict[str, Slot] | None:
    """The slots of one env over a mapped region (None for a pickled-only env)."""
    if layout is None:
        return None
    batch_size, kinds = layout
    return {kind: Slot(flat, batch_size, leaves) for kind, leaves in kinds.items()}


def map_blocks(flat: torch.Tensor, group: GroupLayout) -> dict[str, Block]:
    """The blocks of one group of like envs over a mapped region."""
    _, batch_size, kinds = group
    return {kind: Block(flat, batch_size, leaves) for kind, leaves in kinds.items()}


def slice_blocks(blocks: dict[str, Block], start: int, stop: int) -> dict[str, Block]:
    """Rows ``start:stop`` of ``blocks`` as blocks of their own (views of the same memory):
    one worker's share of blocks laid out for the whole pool."""
    out = {}
    for kind, block in blocks.items():
        part = Block.__new__(Block)
        part.batch_size = block.batch_size
        part.flat_keys = block.flat_keys
        part.views = [(key, view[start:stop]) for key, view in block.views]
        part.td = TensorDict(batch_size=(stop - start, *block.batch_size))
        for key, view in part.views:
            part.td.set(key, view)
        out[kind] = part
    return out


class StackedBlocks:
    """The blocks of several workers whose envs, together, are a whole pool in order: part
    ``k`` holds envs ``start_k:stop_k`` in its block rows, and every part has the same
    leaves. A whole batch's inputs go in with one copy per leaf and part, its results come
    out as one stacked tensor per leaf (no per-env TensorDicts on either side).

    Build it with :meth:`plan`, which returns None when the pool is not laid out that way
    (pickled-only envs, unlike envs, nested keys).

    ``whole``: blocks whose rows are every env of the pool, the parts being slices of them
    (one region for all workers, see :meth:`~aenv.pool._process.ProcessBackend.start`): a
    batch's inputs then go in with one copy per leaf, and its results can be read in place
    (:meth:`rows`: no copy at all; the consumer copies what it keeps).
    """

    __slots__ = (
        "batch_size",
        "carried",
        "dsts",
        "expected",
        "in_keys",
        "kinds",
        "n",
        "np_in",
        "np_kinds",
        "partial",
        "single",
        "slices",
        "whole",
        "whole_in",
    )

    def __init__(
        self,
        parts: list[tuple[dict[str, Block], int, int]],
        whole: dict[str, Block] | None = None,
    ) -> None:
        first = parts[0][0]
        self.n = parts[-1][2]
        if whole is None and len(parts) == 1:
            whole = first
        self.single = whole is not None
        # kind -> the whole pool's rows (the leaves as one view each), or None
        self.whole: dict[str, TensorDictBase] | None = None
        if whole is not None:
            self.whole = {
                kind: TensorDict._new_unsafe(
                    dict(block.views),
                    batch_size=(self.n, *block.batch_size),
                    nested=False,  # type: ignore[arg-type]
                )
                for kind, block in whole.items()
            }
        self.slices = [(start, stop) for _, start, stop in parts]
        self.batch_size = torch.Size((self.n, *first["in"].batch_size))
        # kind -> [(key, [view of each part])]
        self.kinds: dict[str, list[tuple[str, list[torch.Tensor]]]] = {}
        for kind in first:
            cols = []
            for j, (key, _) in enumerate(first[kind].views):
                cols.append((key, [blocks[kind].views[j][1] for blocks, _, _ in parts]))
            self.kinds[kind] = cols
        self.in_keys = [key for key, _ in self.kinds["in"]]
        self.expected = [
            (views[0].dtype, torch.Size((self.n, *views[0].shape[1:])))
            for _, views in self.kinds["in"]
        ]
        self.dsts = [view for _, views in self.kinds["in"] for view in views]
        # an overlapped rollout stages only the actions and has the rest carried over
        # (:meth:`carry`) once the step before has come back
        firsts = {
            kind: {key: views[0][0] for key, views in cols} for kind, cols in self.kinds.items()
        }
        self.carried = frozenset(
            carried_keys(
                [(key, views[0][0]) for key, views in self.kinds["in"]],
                firsts["next"],
                firsts["reset"],
            )
        )
        #: the last write left the carried leaves out (they hold stale values)
        self.partial = False
        #: per kind, each leaf's parts as numpy arrays (None: some dtype numpy lacks)
        self.np_kinds: dict[str, list[list[Any]] | None] = {
            kind: _numpy_cols(cols) for kind, cols in self.kinds.items()
        }
        self.np_in = self.np_kinds["in"]
        if whole is not None:
            # (the whole rows' leaves, as a single part: what the copies in go through, all
            # leaves in one _foreach_copy_, about half of a numpy copy per leaf for a step's
            # five tiny leaves)
            self.whole_in = [(key, [view]) for key, view in whole["in"].views]
            self.dsts = [view for _, views in self.whole_in for view in views]
            self.np_in = None

    @classmethod
    def plan(
        cls,
        parts: list[tuple[dict[str, Block], int, int]],
        whole: dict[str, Block] | None = None,
    ) -> StackedBlocks | None:
        """``parts``: each worker's blocks and the env range its rows hold, in env order;
        ``whole``: the blocks the parts slice, when they are one set for the whole pool."""
        if not parts or parts[0][1] != 0:
            return None
        signature = None
        for k, (blocks, start, stop) in enumerate(parts):
            if k and start != parts[k - 1][2]:
                return None
            sig = []
            for kind in KINDS:
                block = blocks.get(kind)
                if block is None or not block.flat_keys or block.td.batch_size[0] != stop - start:
                    return None
                sig.append(
                    (
                        kind,
                        block.batch_size,
                        [(key, v.dtype, v.shape[1:]) for key, v in block.views],
                    )
                )
            if signature is None:
                signature = sig
            elif sig != signature:
                return None
        return cls(parts, whole)

    def write_inputs(self, td: TensorDictBase) -> bool:
        """Copy the input leaves of the whole batch ``td`` into the blocks; False (nothing
        written) when one is missing or does not fit, or ``td`` is not a plain TensorDict
        of the pool's batch size. (A ``"_step"`` mask is the pool's: which envs step is the
        call's ``indices``.)"""
        if type(td) is not TensorDict or td.batch_size != self.batch_size:
            return False
        entries = td._tensordict
        for key, (dtype, shape) in zip(self.in_keys, self.expected):
            value = entries.get(key)
            if type(value) is not torch.Tensor or value.dtype is not dtype or value.shape != shape:
                if value is None and key in self.carried:
                    return self._write_partial(entries)
                return False
        self._copy_in(self._in_cols(), entries, self.np_in, None)
        self.partial = False
        return True

    def _in_cols(self) -> list[tuple[str, list[torch.Tensor]]]:
        """The input leaves' views the copies in go through (one per part, or one in all)."""
        return self.whole_in if self.whole is not None else self.kinds["in"]

    def _copy_in(
        self,
        cols: list[tuple[str, list[torch.Tensor]]],
        entries: dict[str, Any],
        arrays: list[list[Any]] | None,
        skip: frozenset[str] | None,
    ) -> None:
        """Copy ``entries`` (checked already) into the parts' views of ``cols``: through
        numpy where ``arrays`` has the parts' numpy views (a tiny copy into a slice costs a
        tenth of torch's there), else with one ``_foreach_copy_`` for every leaf."""
        slices = self.slices
        if arrays is not None:
            for (key, _), views in zip(cols, arrays):
                if skip is not None and key in skip:
                    continue
                value = entries[key]
                if value.requires_grad:
                    value = value.detach()
                src = value.numpy()
                if self.single:
                    views[0][...] = src
                else:
                    for view, (start, stop) in zip(views, slices):
                        view[...] = src[start:stop]
            return
        dsts: list[Any] = []
        srcs: list[Any] = []
        for key, views in cols:
            if skip is not None and key in skip:
                continue
            value = entries[key]
            if value.requires_grad:
                value = value.detach()
            dsts.extend(views)
            if self.single:
                srcs.append(value)
            else:
                srcs.extend(value[start:stop] for start, stop in slices)
        _copy_all(dsts, srcs)

    def stager(self, rows: dict[str, torch.Tensor]) -> Callable[[int], None] | None:
        """A function staging row ``t`` of ``rows`` (key -> ``(T, n, ...)``: a rollout's
        random actions, every input leaf but the carried ones) into the input leaves, as
        :meth:`write_inputs` of an input without its carried leaves does (the call is
        then sent after a :meth:`carry`): planned once, so that a step's staging is one
        numpy copy per leaf and part. None where ``rows`` are not exactly those leaves,
        of their dtypes and shapes, or numpy cannot view them."""
        pairs: list[tuple[Any, Any]] = []
        wanted = {key for key in self.in_keys if key not in self.carried}
        if set(rows) != wanted:
            return None
        whole = None if self.whole is None else self.whole["in"]._tensordict  # type: ignore[attr-defined]
        for (key, views), (dtype, shape) in zip(self.kinds["in"], self.expected):
            if key not in wanted:
                continue
            src = rows[key]
            if src.dtype is not dtype or src.shape[1:] != shape or src.requires_grad:
                return None
            parts = [whole[key]] if whole is not None else views
            slices = [(0, self.n)] if whole is not None else self.slices
            for view, (start, stop) in zip(parts, slices):
                dst, rows_np = _as_numpy(view), _as_numpy(src[:, start:stop])
                if dst is None or rows_np is None:
                    return None
                pairs.append((dst, rows_np))

        def stage(t: int) -> None:
            for dst, src in pairs:
                dst[...] = src[t]
            self.partial = True

        return stage

    def _write_partial(self, entries: dict[str, Any]) -> bool:
        """:meth:`write_inputs` of an input without (some of) the carried leaves: the
        others go in and :attr:`partial` is set, so that the blocks are sent only after a
        :meth:`carry` (here, or by the workers). False (nothing written) when another leaf
        is missing or misfits."""
        for key, (dtype, shape) in zip(self.in_keys, self.expected):
            if key in self.carried:
                continue
            value = entries.get(key)
            if type(value) is not torch.Tensor or value.dtype is not dtype or value.shape != shape:
                return False
        self._copy_in(self._in_cols(), entries, self.np_in, self.carried)
        self.partial = True
        return True

    def carry(
        self, src: StackedBlocks, resets: list[bool] | None, parts: list[int] | None = None
    ) -> None:
        """Fill the carried input leaves from the results in ``src`` (the bank before) of
        the step before: each env's ``"next"`` values, or its ``"reset"`` ones where
        ``resets`` flags it (what ``step_mdp`` and the resets make the next input). Only
        the parts ``parts`` (all when None): a worker rung with its share carries the rest
        itself (:func:`carry_pairs`)."""
        in_cols: list[list[Any]]
        next_cols: list[list[Any]]
        reset_cols: list[list[Any]]
        arrays = (self.np_kinds["in"], src.np_kinds["next"], src.np_kinds["reset"])
        use_np = arrays[0] is not None and arrays[1] is not None and arrays[2] is not None
        if use_np:
            in_cols, next_cols, reset_cols = arrays  # type: ignore[assignment]
        else:
            in_cols, next_cols, reset_cols = (
                _cols(self.kinds["in"]),
                _cols(src.kinds["next"]),
                _cols(src.kinds["reset"]),
            )
        nxt = dict(zip([key for key, _ in src.kinds["next"]], next_cols))
        rst = dict(zip([key for key, _ in src.kinds["reset"]], reset_cols))
        for part, (start, stop) in enumerate(self.slices):
            if parts is not None and part not in parts:
                continue
            rows = [r - start for r in range(start, stop) if resets is not None and resets[r]]
            for (key, _), views in zip(self.kinds["in"], in_cols):
                if key not in self.carried:
                    continue
                dst, from_next, from_reset = views[part], nxt[key][part], rst[key][part]
                if use_np:
                    dst[...] = from_next
                    if rows:
                        dst[rows] = from_reset[rows]
                else:
                    dst.copy_(from_next)
                    if rows:
                        index = torch.tensor(rows)
                        dst.index_copy_(0, index, from_reset.index_select(0, index))
        self.partial = False

    def rows(self, kind: str) -> TensorDictBase | None:
        """Every env's ``kind`` slot in place (the shared rows themselves, valid until the
        next call on this bank writes them), when one view per leaf holds the whole pool;
        else None (:meth:`read` copies the parts together)."""
        return None if self.whole is None else self.whole[kind]

    def read(self, kind: str) -> TensorDictBase:
        """A private copy of every env's ``kind`` slot, stacked: one tensor per leaf."""
        # (torch here: a cat of a few tiny views costs what numpy's concatenate and the
        # wrapping back into a tensor cost)
        if self.whole is not None:
            fields = {key: view.clone() for key, view in self.whole[kind].items()}
        else:
            fields = {key: torch.cat(views) for key, views in self.kinds[kind]}
        return TensorDict._new_unsafe(fields, batch_size=self.batch_size, nested=False)  # type: ignore[arg-type]
