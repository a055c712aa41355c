"""Whole trajectories out of collected frames (TorchRL's ``trajs_per_batch``).

I/O-free: the collector hands every batch it collects to a :class:`TrajectoryBatcher`,
which keeps each trajectory's frames until the frame whose ``("next", "done")`` is set, and
hands out batches of complete trajectories, padded (with a mask) or concatenated.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase, pad

from aenv._mdp import NestedKey, time_named

__all__ = ["OutOfFrames", "TrajectoryBatcher"]


class OutOfFrames(Exception):
    """Ends a collector's iteration when ``total_frames`` ran out before another
    trajectory was complete (the frames of the unfinished ones are dropped)."""


_FORMATS = ("padded", "cat")


class TrajectoryBatcher:
    """Assembles complete trajectories across batches and hands them out N at a time.

    Args:
        trajs_per_batch: trajectories per batch handed out.
        traj_format: ``"padded"`` (``[N, longest]``, zero-padded along time, with a boolean
            ``("collector", "mask")``) or ``"cat"`` (``[sum of lengths]``, one trajectory
            after another, each ending on its done frame).
        prefix: where the trajectory ids are (``(prefix, "traj_ids")``).
        done_key: the done entry under ``"next"`` that ends a trajectory.

    Example:
        >>> batcher = TrajectoryBatcher(2, "padded")
        >>> batcher.add(batch)  # frames of any number of trajectories, finished or not
        >>> if batcher.ready():
        ...     trajs = batcher.pop()  # [2, longest]
    """

    def __init__(
        self,
        trajs_per_batch: int,
        traj_format: str | None = "padded",
        prefix: str = "collector",
        done_key: NestedKey = "done",
    ) -> None:
        if trajs_per_batch < 1:
            raise ValueError(f"trajs_per_batch must be >= 1, got {trajs_per_batch}")
        traj_format = traj_format or "padded"
        if traj_format not in _FORMATS:
            raise ValueError(f"traj_format must be one of {_FORMATS}, got {traj_format!r}")
        self.trajs_per_batch = trajs_per_batch
        self.traj_format = traj_format
        self.prefix = prefix
        self.done_key = done_key
        self._partial: dict[int, list[TensorDictBase]] = {}
        self._complete: list[TensorDictBase] = []

    def add(self, batch: TensorDictBase) -> None:
        """Take a collected batch (``[*env_dims, time]`` or a flat streamed one)."""
        flat = batch.reshape(-1)
        if flat._has_names():
            flat = flat.copy()
            flat.names = None  # type: ignore[assignment]
        ids = flat.get((self.prefix, "traj_ids"))
        ids = ids.reshape(flat.numel(), -1)[:, 0]
        done = flat.get(("next", self.done_key)).reshape(flat.numel(), -1).any(-1)
        for tid in dict.fromkeys(ids.tolist()):  # in order of first frame
            rows = (ids == tid).nonzero().squeeze(-1)
            # a trajectory's frames are contiguous per env: split at its done frames
            start = 0
            ends = done[rows].nonzero().squeeze(-1).tolist()
            for end in ends:
                self._finish(tid, flat[rows[start : end + 1]])
                start = end + 1
            if start < rows.numel():
                self._partial.setdefault(tid, []).append(flat[rows[start:]])

    def _finish(self, tid: int, last: TensorDictBase) -> None:
        parts = [*self._partial.pop(tid, []), last]
        self._complete.append(TensorDict.cat(parts, 0) if len(parts) > 1 else parts[0])

    def ready(self) -> bool:
        """Whether ``trajs_per_batch`` complete trajectories are waiting."""
        return len(self._complete) >= self.trajs_per_batch

    @property
    def num_complete(self) -> int:
        """Complete trajectories waiting to be handed out."""
        return len(self._complete)

    def clear(self) -> None:
        """Drop every partial and complete trajectory (after a reset of the envs)."""
        self._partial.clear()
        self._complete.clear()

    def pop(self) -> TensorDictBase:
        """The next ``trajs_per_batch`` complete trajectories."""
        if not self.ready():
            raise ValueError(
                f"{len(self._complete)} complete trajectories, {self.trajs_per_batch} needed"
            )
        trajs = self._complete[: self.trajs_per_batch]
        del self._complete[: self.trajs_per_batch]
        if self.traj_format == "cat":
            return TensorDict.cat(trajs, 0)
        longest = max(t.numel() for t in trajs)
        rows = []
        for t in trajs:
            t = t.clone()
            t.set((self.prefix, "mask"), torch.ones(t.numel(), dtype=torch.bool))
            rows.append(pad(t, [0, longest - t.numel()]))
        return time_named(TensorDict.stack(rows, 0))
