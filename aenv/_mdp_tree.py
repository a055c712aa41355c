"""TensorDict plumbing under the MDP logic of :mod:`aenv._mdp`: key trees, carrying root
entries into the next step's input, merging non-tensor entries, and the fast paths of
``step_mdp`` and stacking over plain TensorDicts. No I/O, no env knowledge."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from tensordict import (
    LazyStackedTensorDict,
    NonTensorData,
    NonTensorStack,
    TensorDict,
    TensorDictBase,
    is_non_tensor,
    is_tensorclass,
)

NestedKey = str | tuple[str, ...]

__all__ = [
    "ExclusionTree",
    "carry",
    "exclusion_tree",
    "fast_clone",
    "fast_stack",
    "fast_step_mdp",
    "fast_update",
    "merge_non_tensor",
    "non_tensor",
    "non_tensor_value",
]


#: the batch size of one env's data (no batch dimensions)
NO_DIMS = torch.Size()
#: types :func:`non_tensor` assembles without looking further
_PLAIN = frozenset({str, bytes, int, float, bool, tuple, list, dict, type(None)})
#: the plain types that are never a NonTensorData (builtins, no subclass)
_SCALARS = frozenset({str, bytes, int, float, bool, type(None)})
#: what a NonTensorData holds besides its data (as tensordict's constructor leaves it)
_FIELDS = ("_tensordict", "_non_tensordict", "_is_initialized")
#: what the empty TensorDict inside a NonTensorData holds (as the constructor leaves it)
_INNER = ("_device", "_tensordict", "_batch_size", "_td_dim_names")


def _assemble(value: Any, batch_size: torch.Size) -> NonTensorData:
    # the empty TensorDict inside, laid out too: TensorDict._new_unsafe took more than half
    # of a call (its compile checks and keyword handling), and text envs make several a step
    inner = object.__new__(TensorDict)
    own = inner.__dict__
    own["_device"] = None
    own["_tensordict"] = {}
    own["_batch_size"] = batch_size
    own["_td_dim_names"] = None
    obj = object.__new__(NonTensorData)
    fields = obj.__dict__
    fields["_tensordict"] = inner
    fields["_non_tensordict"] = {"data": value, "_metadata": None, "_is_non_tensor": True}
    fields["_is_initialized"] = True
    return obj


def _assembles() -> bool:
    """Whether :func:`_assemble` lays a NonTensorData (and the empty TensorDict inside it)
    out exactly as tensordict's constructor does (checked once: another tensordict version
    gets the constructor)."""
    try:
        made, ref = _assemble("probe", torch.Size([2])), NonTensorData("probe", batch_size=[2])
        got, want = vars(made), vars(ref)
        inner, made_inner = want["_tensordict"], got["_tensordict"]
        return (
            tuple(want) == _FIELDS
            and tuple(got) == _FIELDS
            and want["_non_tensordict"] == got["_non_tensordict"]
            and type(inner) is TensorDict
            and tuple(vars(inner)) == _INNER
            and vars(inner) == vars(made_inner)
            and type(vars(inner)["_tensordict"]) is dict
            and made_inner.batch_size == inner.batch_size
            and made_inner.device is None
            and not made_inner.keys()
            and not made_inner.is_locked
            and made.data == "probe"
            and made.batch_size == ref.batch_size
        )
    except Exception:
        return False


_ASSEMBLES = _assembles()


def non_tensor(value: Any, batch_size: Sequence[int] = NO_DIMS) -> NonTensorData:
    """``NonTensorData(value, batch_size=batch_size)`` for a plain python object (text, a
    tuple of token ids, a dict, a chat history) at about a third of the constructor's cost
    (5 against 14 us here): text envs make several per step, thousands of episodes at once.
    The instance is laid out as the constructor lays it out (checked once at import);
    otherwise, and for tensors, TensorDicts and tensorclasses, the constructor runs."""
    if not _ASSEMBLES or (
        type(value) not in _PLAIN
        and (isinstance(value, torch.Tensor | TensorDictBase) or is_tensorclass(value))
    ):
        return NonTensorData(value, batch_size=batch_size)  # type: ignore[arg-type]
    size = batch_size if type(batch_size) is torch.Size else torch.Size(batch_size)
    return _assemble(value, size)


def non_tensor_value(value: Any) -> Any:
    """``value.data`` for a NonTensorData (read from its fields: the attribute goes through
    the tensorclass's lookup, several us), else ``value`` as it is."""
    kind = type(value)
    if kind is NonTensorData:
        fields = value.__dict__.get("_non_tensordict")
        if fields is not None and "data" in fields:
            return fields["data"]
        return value.data
    if kind in _SCALARS:  # text and numbers as they are (the isinstance check costs)
        return value
    if isinstance(value, NonTensorData):
        return value.data
    return value


def _unravel(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def merge_non_tensor(
    new: TensorDictBase, old: TensorDictBase, key: NestedKey, value: Any, mask: torch.Tensor
) -> None:
    """:func:`mask_merge` for a non-tensor entry: element by element over the batch dims
    (strings of the elements the mask leaves out come from ``old``)."""
    prev = old.get(key, None)
    bs = new.batch_size
    n = math.prod(bs)
    if prev is None or not is_non_tensor(prev) or not bs or mask.numel() % n:
        return
    flags = mask.reshape(n, -1).any(-1).tolist()
    current, before = _flatten(value.tolist(), len(bs)), _flatten(prev.tolist(), len(bs))
    if len(current) != n or len(before) != n:
        return
    merged = [c if f else b for c, f, b in zip(current, flags, before)]
    for size in reversed(bs[1:]):
        merged = [merged[i : i + size] for i in range(0, len(merged), size)]
    new.set(key, NonTensorStack.from_list(merged))


def _flatten(values: Any, ndim: int) -> list[Any]:
    for _ in range(ndim - 1):
        values = [v for row in values for v in row]
    return list(values)


ExclusionTree = dict[str, Any]


def exclusion_tree(keys: Iterable[NestedKey]) -> ExclusionTree:
    """A nested dict of keys to skip: ``{"next": True, "agents": {"action": True}}``."""
    tree: ExclusionTree = {}
    for key in keys:
        node = tree
        parts = _unravel(key)
        for part in parts[:-1]:
            child = node.get(part)
            if child is True:
                break
            if child is None:
                child = node[part] = {}
            node = child
        else:
            node[parts[-1]] = True
    return tree


def carry(src: TensorDictBase, dst: TensorDictBase, tree: ExclusionTree) -> None:
    """Copy ``src`` entries missing from ``dst`` into it, skipping ``tree``'s keys."""
    if (
        isinstance(src, LazyStackedTensorDict)
        and isinstance(dst, LazyStackedTensorDict)
        and src.stack_dim == dst.stack_dim
        and len(src.tensordicts) == len(dst.tensordicts)
    ):
        # element by element: the elements' entries may differ (heterogeneous agents)
        for sub_src, sub_dst in zip(src.tensordicts, dst.tensordicts):
            carry(sub_src, sub_dst, tree)
        return
    for key, value in src.items():
        sub = tree.get(key)
        if sub is True or key == "_reset" or key == "_step":
            continue
        existing = dst.get(key, None)
        if existing is value:
            continue
        if isinstance(value, TensorDictBase):
            if existing is None:
                if sub is None:
                    dst.set(key, value.copy())
                else:
                    new = value.empty()
                    carry(value, new, sub)
                    if not new.is_empty():
                        dst.set(key, new)
            elif isinstance(existing, TensorDictBase):
                carry(value, existing, sub or {})
        elif existing is None:
            dst.set(key, value)


#: the entry types :func:`fast_step_mdp` passes on as they are (no isinstance check)
_LEAVES = frozenset({torch.Tensor, NonTensorData})


def fast_step_mdp(
    tensordict: TensorDictBase,
    next_tensordict: TensorDictBase,
    drop_next: frozenset[str],
    drop_root: frozenset[str],
) -> TensorDictBase | None:
    """:func:`step_mdp` (default flags) over plain TensorDicts whose excluded keys are all
    root-level strings; None when it does not apply (the caller then runs ``step_mdp``).

    ``drop_next`` holds the reward keys; ``drop_root`` the keys the root does not carry over
    (``"next"``, ``"_reset"``, ``"_step"``, rewards, done flags and actions). The result is
    the same as ``step_mdp``'s: tensors are shared, nested containers are new (shallow)
    copies, so editing the result never edits the stepped data.
    """
    if type(tensordict) is not TensorDict or type(next_tensordict) is not TensorDict:
        return None
    root = tensordict._tensordict
    out: dict[str, Any] = {}
    for key, value in next_tensordict._tensordict.items():
        if key in drop_next:
            continue
        # (tensors and text skip the isinstance: µs a step)
        if type(value) not in _LEAVES and isinstance(value, TensorDictBase):
            prev = root.get(key)
            value = value.clone(False)
            if prev is not None and prev is not next_tensordict._tensordict[key]:
                if not isinstance(prev, TensorDictBase):
                    return None
                carry(prev, value, {})
        out[key] = value
    for key, value in root.items():
        if key in drop_root or key in out:
            continue
        if type(value) not in _LEAVES and isinstance(value, TensorDictBase):
            value = value.copy()
        out[key] = value
    return TensorDict._new_unsafe(
        out,  # type: ignore[arg-type]
        batch_size=next_tensordict.batch_size,
        device=next_tensordict.device,
        nested=False,
    )


def fast_clone(td: TensorDictBase) -> TensorDictBase:
    """``td.clone()`` for a plain TensorDict of tensors and plain TensorDicts (a per-step
    copy of preallocated rows): rebuilt leaf by leaf, without re-validating what the source
    already satisfies; anything else goes through ``clone``."""
    if type(td) is not TensorDict or td._has_names():
        return td.clone()
    out: dict[str, Any] = {}
    for key, value in td._tensordict.items():
        if type(value) is torch.Tensor:
            out[key] = value.clone()
        elif type(value) is TensorDict:
            out[key] = fast_clone(value)
        else:
            return td.clone()
    return TensorDict._new_unsafe(
        out,  # type: ignore[arg-type]
        batch_size=td.batch_size,
        device=td.device,
        nested=False,
    )


def fast_stack(tds: Sequence[TensorDictBase], dim: int) -> TensorDictBase | None:
    """``torch.stack(tds, dim)`` for plain TensorDicts of one structure, built leaf by leaf.

    Returns None when it does not apply (another kind of tensordict, differing keys or
    devices, named dims, non-tensor leaves): the caller then uses ``torch.stack``. Raises
    ``RuntimeError`` as ``torch.stack`` does when leaves' shapes differ.
    """
    first = tds[0]
    if type(first) is not TensorDict or first._has_names():
        return None
    entries = first._tensordict
    width = len(entries)
    device = first.device
    batch = first.batch_size
    dicts = []
    for td in tds:
        # (a plain TensorDict's own fields, not its properties: this runs once per env
        # of a streamed receive, hundreds at a time)
        if (
            type(td) is not TensorDict
            or len(td._tensordict) != width
            or td._device != device
            or td._batch_size != batch
        ):
            return None
        dicts.append(td._tensordict)
    out: dict[str, Any] = {}
    try:
        for key, value in entries.items():
            if type(value) is torch.Tensor:
                out[key] = torch.stack([d[key] for d in dicts], dim)
            elif type(value) is TensorDict:
                sub = fast_stack([d[key] for d in dicts], dim)
                if sub is None:
                    return None
                out[key] = sub
            else:
                return None
    except (KeyError, TypeError):
        return None
    size = list(batch)
    size.insert(dim, len(tds))
    return TensorDict._new_unsafe(
        out,  # type: ignore[arg-type]
        batch_size=torch.Size(size),
        device=device,
        nested=False,
    )


def fast_update(td: TensorDictBase, out: TensorDictBase) -> TensorDictBase:
    """``td.update(out)``, written into ``td``'s entry dict at once when both are plain
    TensorDicts without names, ``td`` unlocked, of one batch size, on one device (or
    ``td`` on none), and every entry of ``out`` is a tensor or non-tensor data (a reset's
    outputs: prompts, text, flags). TensorDict's update checks each non-tensor entry
    again (about 40 µs for a text env's reset); ``out``'s entries fit ``td`` as they fit
    ``out``, and both paths store them by reference."""
    if (
        type(td) is TensorDict
        and type(out) is TensorDict
        and not td.is_locked
        and not td._has_names()
        and not hasattr(td, "_consolidated")
        and out.batch_size == td.batch_size
        and (td.device is None or out.device == td.device)
    ):
        entries = out._tensordict
        for value in entries.values():
            kind = type(value)
            if kind is not torch.Tensor and kind is not NonTensorData:
                break  # (a sub-tensordict is merged, not replaced: TensorDict's update)
        else:
            td._tensordict.update(entries)
            return td
    return td.update(out)
