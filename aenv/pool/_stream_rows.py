"""Input rows for streamed steps: a sent batch is copied into preallocated buffers, and each
env reads its own row, a TensorDict made once per env and used for every step it is sent.

Splitting a sent batch into per-env TensorDicts made a TensorDict, its dict and one tensor
view per entry for every env and step, and each lived as long as the step (seconds, for a
slow env): the cyclic garbage collector promoted all of them, and its full collections,
which walk every env of the pool, came that much more often. Here a send costs one indexed
copy per entry, whatever the number of envs, and a step in flight holds no input of its own;
the receiver gathers the inputs back with one index per entry. This is the streaming twin
of the whole-batch rows (:mod:`aenv.pool._rows`), planned by the same planner.

An env's row is reused only when its last streamed input has been received (before that,
the receiver still reads it) and the env left it as it was (an env may write into its
input, as it may into a bare env's); otherwise that env gets an input of its own, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import is_
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.envs._rowplan import INPUT_GROUPS, plan_rows
from aenv.pool._stacking import index_tensor

__all__ = ["StreamRows"]

# entries a sent tensordict may hold besides the planned ones: the pool's, not env inputs
_POOL_KEYS = frozenset(("env_index",))


class StreamRows:
    """Preallocated input buffers of a dense pool's envs and each env's row in them.

    Args:
        env: one of the pool's envs (they share their specs).
        n: the number of envs.
        sub_batch: an env's batch size.
    """

    #: whether the rows are a process backend's shared ones (:mod:`aenv.pool._process_stream`)
    shared = False

    def __init__(
        self, env: EnvBase | None, n: int, sub_batch: torch.Size, planned: Any = None
    ) -> None:
        # (``planned``: buffers planned already, as a TensorDict, instead of ``env``'s)
        plan = planned
        if plan is None:
            assert env is not None
            plan = plan_rows(env, INPUT_GROUPS, n)
        self.bufs: dict[str, torch.Tensor] = {}
        if plan is not None and all(type(v) is torch.Tensor for v in plan.values()):
            self.bufs = dict(plan.items())  # type: ignore[arg-type]
        self.keys = frozenset(self.bufs)
        # what a sent entry must be to fill a row: its shape past the batch, dtype, device
        self._expect = {k: (b.shape[1:], b.dtype, b.device) for k, b in self.bufs.items()}
        self.sub_batch = sub_batch
        self.device = plan.device if plan is not None else None
        # numpy views of host buffers: a receive gathers its rows with numpy's take, at
        # about half the cost of a torch index per entry for the few rows it takes
        self._host = host_views(self.bufs)
        # env i's row and the views it was made with (to tell whether the env changed it)
        self._rows: list[TensorDictBase | None] = [None] * n
        self._views: list[tuple[torch.Tensor, ...] | None] = [None] * n
        # 1 while env i's row holds an input whose result has not been received yet
        self.pending = bytearray(n)

    @property
    def ok(self) -> bool:
        """Whether the envs' inputs could be planned (flat tensor entries only)."""
        return bool(self.bufs)

    def stage(
        self, td: TensorDictBase, indices: Sequence[int], single: bool
    ) -> list[TensorDictBase | None] | None:
        """Copy the sent ``td`` (one env's input when ``single``, else one per index along
        dim 0) into the rows of ``indices``; return each env's input: its row, or None for
        an env whose row is still pending (the caller gives it an input of its own). None,
        with nothing written, when ``td`` does not hold exactly the planned entries, shapes
        and dtypes (plus the pool's ``"env_index"``)."""
        if type(td) is not TensorDict:
            return None
        entries = td._tensordict
        bufs = self.bufs
        if entries.keys() != bufs.keys() and entries.keys() - _POOL_KEYS != bufs.keys():
            return None
        if single:
            # (copy_ broadcasts and casts: the entries are checked first)
            for key, (row_shape, dtype, device) in self._expect.items():
                value = entries[key]
                if (
                    type(value) is not torch.Tensor
                    or value.shape != row_shape
                    or value.dtype != dtype
                    or value.device != device
                ):
                    return None
        elif not all(type(entries[key]) is torch.Tensor for key in bufs):
            return None
        free = self._free(indices)
        if not free:
            return [None] * len(indices)
        out: list[TensorDictBase | None] = [None] * len(indices)
        if single:
            i = indices[0]
            out[0] = self._row(i)
            # straight into the row's own views (its entries, in the buffers' order)
            for view, key in zip(self._views[i], bufs):  # type: ignore[arg-type]
                view.copy_(entries[key])
            return out
        every = len(free) == len(indices)
        envs = list(indices) if every else [indices[pos] for pos in free]
        rows = index_tensor(envs)
        src = None if every else index_tensor(free)
        try:
            for key, dst in bufs.items():
                value = entries[key]
                dst.index_copy_(0, rows, value if src is None else value.index_select(0, src))
        except (RuntimeError, IndexError):
            # index_copy_ takes exactly the rows' shape, dtype and device (it neither
            # broadcasts nor casts): anything else is refused there, at no cost per entry
            # to a send that fits. The free rows it wrote to are read by no one.
            return None
        made = self._rows
        got = list(map(made.__getitem__, envs))
        if any(map(is_, got, repeat(None))):
            self._make_rows([i for i, row in zip(envs, got) if row is None])
            got = list(map(made.__getitem__, envs))
        if every:
            return got
        for pos, row in zip(free, got):
            out[pos] = row
        return out

    def _free(self, indices: Sequence[int]) -> list[int]:
        """The positions of ``indices`` whose rows may be written now."""
        pending = self.pending
        if not any(map(pending.__getitem__, indices)):  # (the usual send: checked in C)
            return list(range(len(indices)))
        return [pos for pos, i in enumerate(indices) if not pending[i]]

    def _row(self, i: int) -> TensorDictBase:
        """Env ``i``'s row (kept while intact: a row the env changed was dropped when its
        result came back, see :meth:`release`)."""
        row = self._rows[i]
        if row is not None:
            return row
        return self._keep(i, tuple(buf[i] for buf in self.bufs.values()))

    def _keep(self, i: int, views: tuple[torch.Tensor, ...]) -> TensorDictBase:
        """Env ``i``'s row made of ``views`` (one per buffer, in the buffers' order), kept."""
        row = TensorDict._new_unsafe(
            dict(zip(self.bufs, views)), batch_size=self.sub_batch, device=self.device, nested=False
        )
        self._rows[i], self._views[i] = row, views
        return row

    def _make_rows(self, envs: list[int]) -> None:
        """Make the rows of ``envs`` (none made yet): their views taken from each buffer at
        once (``unbind``, one call for every row) when they are at least half of the rows,
        else one index each. A pool's first send goes to all its envs: an index made a view
        at ~3 us (torch's indexing), ``unbind`` at ~1; making the rows of 16,384 envs of
        six entries in a first send took 250 ms one by one, 130-160 ms at once (collector
        off, a loaded machine)."""
        bufs = self.bufs
        if 2 * len(envs) < len(self._rows):
            for i in envs:
                self._row(i)
            return
        cols = [buf.unbind(0) for buf in bufs.values()]
        for i in envs:
            self._keep(i, tuple(col[i] for col in cols))

    def release(self, indices: Sequence[int], payloads: Sequence[Any]) -> bool:
        """The results of env ``indices[k]``'s input ``payloads[k]`` were received: the
        rows among those inputs are free. Returns whether every input is its env's row as
        it was made (the env neither added nor replaced an entry: the buffers hold what it
        read); a row the env changed is dropped, and the env's next send makes a fresh one."""
        rows, views, pending = self._rows, self._views, self.pending
        whole = True
        for i, payload in zip(indices, payloads):
            row = rows[i]
            if payload is not row or row is None:
                whole = False
                continue
            pending[i] = 0
            made = views[i]
            entries = row._tensordict  # type: ignore[attr-defined]
            # (the row's entries were made in the buffers' order, and replacing one keeps
            # its place: one pass comparing identities, in C)
            if len(entries) != len(made) or not all(map(is_, entries.values(), made)):  # type: ignore[arg-type]
                rows[i] = views[i] = None
                whole = False
        return whole

    def gather(self, idx: np.ndarray, extra: dict[str, Any]) -> TensorDictBase:
        """The rows of ``idx`` (an int64 array) stacked (a copy: one index per entry),
        with the ``extra`` entries (already of the stack's batch size) beside them."""
        out = take_rows(self._host, self.bufs, idx, self.sub_batch, self.device)
        out._tensordict.update(extra)  # type: ignore[attr-defined]
        return out


def host_views(bufs: dict[str, torch.Tensor]) -> dict[str, np.ndarray] | None:
    """numpy views of ``bufs`` where all are host tensors numpy can view, else None: a
    receive gathers its rows with numpy's take, at about half the cost of a torch index
    per entry for the few rows it takes."""
    if not all(b.device.type == "cpu" for b in bufs.values()):
        return None
    try:
        return {k: b.numpy() for k, b in bufs.items()}
    except (TypeError, RuntimeError):  # (a dtype numpy lacks: bfloat16)
        return None


def take_rows(
    host: dict[str, np.ndarray] | None,
    bufs: dict[str, torch.Tensor],
    idx: np.ndarray,
    sub_batch: torch.Size,
    device: torch.device | None,
) -> TensorDictBase:
    """Rows ``idx`` (an int64 array) of the buffers ``bufs`` (``host``: their
    :func:`host_views`), copied into a new TensorDict: one take per entry."""
    entries: dict[Any, Any]
    if host is not None:
        entries = {k: torch.from_numpy(a.take(idx, 0)) for k, a in host.items()}
    else:
        index = torch.from_numpy(idx).to(device)
        entries = {k: buf.index_select(0, index) for k, buf in bufs.items()}
    return TensorDict._new_unsafe(
        entries, batch_size=(len(idx), *sub_batch), device=device, nested=False
    )
