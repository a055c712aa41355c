"""I/O-free helpers of the pool: splitting a batch into per-env inputs and stacking results.

Both are on the hot path of every whole-batch call, so they work key by key (one
``torch.stack`` per entry, one index per entry) instead of through generic TensorDict
stacking and unbinding, and fall back to tensordict's own where the data is not plain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

from aenv._mdp import NestedKey, fast_stack

__all__ = ["split_inputs", "stack_results", "unbind0"]


def split_inputs(
    td: TensorDictBase,
    indices: Sequence[int],
    keys: Sequence[NestedKey],
    sub_batch: torch.Size,
) -> list[TensorDictBase]:
    """Per-env inputs for ``indices``: the ``keys`` entries of ``td`` at each index.

    A lazy stack along dim 0 hands out its own sub-tensordicts (heterogeneous envs).
    """
    if isinstance(td, LazyStackedTensorDict) and td.stack_dim == 0:
        return [td.tensordicts[i] for i in indices]
    cols: list[tuple[NestedKey, torch.Tensor]] = []
    for key in keys:
        value = td.get(key, None)
        if value is None:
            continue
        if type(value) is not torch.Tensor:  # non-tensor data: every key, env by env
            return [td[i].select(*keys, strict=False) for i in indices]
        cols.append((key, value))
    device = td.device
    if not all(type(k) is str for k, _ in cols):
        out = []
        for i in indices:
            sub = TensorDict(batch_size=sub_batch, device=device)
            for key, value in cols:
                sub.set(key, value[i])
            out.append(sub)
        return out
    # one unbind per entry when every env is selected, one index per env otherwise
    whole = len(indices) == td.batch_size[0]
    parts = [(key, value.unbind(0) if whole else value) for key, value in cols]
    return [
        TensorDict._new_unsafe(
            {key: part[i] for key, part in parts}, batch_size=sub_batch, device=device, nested=False
        )
        for i in indices
    ]


def _entries(td: TensorDictBase) -> dict[str, Any] | None:
    """A plain TensorDict's own entry dict (tensordict's fast path), else None."""
    if type(td) is not TensorDict:
        return None
    entries = getattr(td, "_tensordict", None)
    return entries if isinstance(entries, dict) else None


def index_tensor(values: Sequence[int]) -> torch.Tensor:
    """An int64 tensor of ``values`` (env indices): built through numpy, at a third of
    ``torch.tensor``'s cost for the few indices of a streamed receive."""
    return torch.from_numpy(np.array(values, dtype=np.int64))


def unbind0(td: TensorDictBase) -> list[TensorDictBase]:
    """``td.unbind(0)``, entry by entry for plain TensorDicts (one ``unbind`` per tensor)."""
    entries = _entries(td)
    if entries is None:
        return list(td.unbind(0))
    k = td.batch_size[0]
    cols = {}
    for key, value in entries.items():
        if type(value) is torch.Tensor:
            cols[key] = value.unbind(0)
        elif type(value) is TensorDict:
            cols[key] = unbind0(value)  # type: ignore[assignment]
        else:
            return list(td.unbind(0))
    sub_bs, device = td.batch_size[1:], td.device
    return [
        TensorDict._new_unsafe(
            {key: col[j] for key, col in cols.items()},
            batch_size=sub_bs,
            device=device,
            nested=False,
        )
        for j in range(k)
    ]


def stack_results(tds: Sequence[TensorDictBase], lazy: bool) -> TensorDictBase:
    """Stack per-env results along a new dim 0: dense (a contiguous copy) or lazy."""
    if lazy:
        return LazyStackedTensorDict.lazy_stack(list(tds), dim=0)
    try:
        out = fast_stack(tds, 0)
        if out is not None:
            return out
        return torch.stack(list(tds), dim=0)  # type: ignore[arg-type,return-value]
    except RuntimeError:
        pass
    # Entries some envs lack (a restarted env's "truncated", say): fill them with zeros.
    filled = _fill_missing(tds)
    try:
        return torch.stack(filled, dim=0)  # type: ignore[arg-type,return-value]
    except RuntimeError:
        # shapes that differ from env to env (dynamic specs: an observation that grows) fit
        # no dense stack: a lazy one holds them, as TorchRL's batched envs without buffers
        return LazyStackedTensorDict.lazy_stack(list(tds), dim=0)


def _fill_missing(tds: Sequence[TensorDictBase]) -> list[TensorDictBase]:
    examples: dict[NestedKey, torch.Tensor] = {}
    for td in tds:
        for key in td.keys(True, True):
            if key not in examples:
                value = td.get(key)
                if isinstance(value, torch.Tensor):
                    examples[key] = value
    out = []
    for td in tds:
        missing = [k for k in examples if td.get(k, None) is None]
        if missing:
            td = td.copy()
            for key in missing:
                td.set(key, torch.zeros_like(examples[key]))
        out.append(td)
    return out
