"""Shared-memory slots of the process backend: one input and two output slots per env.

The parent plans a layout from the specs its workers sent (:func:`plan_layout`), makes one
anonymous shared region per worker (:func:`make_region`: a ``memfd`` on Linux, an unlinked
file elsewhere, so nothing is left behind whatever happens to either process) and passes
its descriptor to the worker once. Both sides then view the region as tensors
(:func:`map_slots`). A step writes its action into the env's ``"in"`` slot and its result
comes back in the ``"next"`` (or ``"reset"``) slot: only a tiny message crosses the pipe.

An env whose specs hold non-tensor leaves or dynamic (-1) dims, or a device other than the
CPU, gets no slots: its data travels pickled. A result that does not fit its slot (a key
more or less, another shape or dtype) is pickled too (:meth:`Slot.write` says so), so the
slots are an optimisation that never changes what comes back.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._utils import EnvMetaData

__all__ = ["Slot", "make_region", "map_region", "map_slots", "plan_layout"]

_ALIGN = 64
#: Slot kinds: the step input, the step result ("next" content), the reset result.
KINDS = ("in", "next", "reset")

# (key, dtype name, shape, byte offset) for each leaf of a slot
Leaf = tuple[Any, str, tuple[int, ...], int]
# per env: batch size and, per kind, its leaves
EnvLayout = tuple[tuple[int, ...], dict[str, list[Leaf]]]


def _zero_leaves(meta: EnvMetaData, kind: str) -> list[tuple[Any, torch.Tensor]] | None:
    inp, out = meta.specs["input_spec"], meta.specs["output_spec"]
    if kind == "in":
        specs = [inp["full_action_spec"], inp["full_state_spec"]]
    elif kind == "next":
        specs = [out["full_observation_spec"], out["full_reward_spec"], out["full_done_spec"]]
    else:
        specs = [out["full_observation_spec"], out["full_done_spec"]]
    leaves: list[tuple[Any, torch.Tensor]] = []
    for spec in specs:
        if spec is None:
            continue
        for key in spec.keys(True, True):
            leaf = spec[key]
            if any(d < 0 for d in leaf.shape):
                return None
            value = leaf.zero()
            if type(value) is not torch.Tensor:
                return None
            leaves.append((key, value))
    return leaves


def plan_layout(metas: dict[int, EnvMetaData]) -> tuple[dict[int, EnvLayout | None], int]:
    """Byte layout of the slots of some envs in one region; ``None`` for pickled-only envs.

    Returns the layout per env index and the region's size in bytes.
    """
    layout: dict[int, EnvLayout | None] = {}
    offset = 0
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
        planned: dict[str, list[Leaf]] = {}
        for kind, leaves in kinds.items():
            entries = []
            for key, value in leaves or ():
                entries.append(
                    (key, str(value.dtype).removeprefix("torch."), tuple(value.shape), offset)
                )
                nbytes = value.numel() * value.element_size()
                offset += -(-max(nbytes, 1) // _ALIGN) * _ALIGN
            planned[kind] = entries
        layout[index] = (tuple(meta.batch_size), planned)
    return layout, max(offset, _ALIGN)


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

    __slots__ = ("batch_size", "by_key", "n", "td")

    def __init__(self, flat: torch.Tensor, batch_size: tuple[int, ...], leaves: list[Leaf]) -> None:
        self.batch_size = torch.Size(batch_size)
        self.td = TensorDict(batch_size=self.batch_size)
        self.by_key: dict[Any, torch.Tensor] = {}
        for key, dtype_name, shape, offset in leaves:
            dtype = getattr(torch, dtype_name)
            numel = 1
            for d in shape:
                numel *= d
            nbytes = numel * torch.empty((), dtype=dtype).element_size()
            view = flat[offset : offset + nbytes].view(dtype).view(shape)
            self.td.set(key, view)
            self.by_key[key] = view
        self.n = len(self.by_key)

    def write(self, td: TensorDictBase) -> bool:
        """Copy ``td`` into the slot if it has exactly the slot's keys, shapes and dtypes."""
        if td.batch_size != self.batch_size:
            return False
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
        """Copy the slot's keys of ``td`` in (a step input: other entries, such as the
        observation a streamed send carries along, are not the env's input and stay
        behind, as in the seeds' ParallelEnv). False when a slot key is missing or does not
        fit, or ``td`` carries a ``"_step"`` mask (pickle it instead)."""
        if td.batch_size != self.batch_size or "_step" in td.keys():
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

    def read(self) -> TensorDictBase:
        return self.td.clone()


def map_slots(flat: torch.Tensor, layout: EnvLayout | None) -> dict[str, Slot] | None:
    """The slots of one env over a mapped region (None for a pickled-only env)."""
    if layout is None:
        return None
    batch_size, kinds = layout
    return {kind: Slot(flat, batch_size, leaves) for kind, leaves in kinds.items()}
