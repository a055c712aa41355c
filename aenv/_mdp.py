"""I/O-free TensorDict logic shared by every env, pool, transform and collector.

Nothing here awaits or touches a backend: these are plain functions over TensorDicts and
key lists, so sync and async paths (and every backend) call the same code.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from tensordict import (
    LazyStackedTensorDict,
    TensorDict,
    TensorDictBase,
    is_non_tensor,
)

from aenv._mdp_tree import (
    ExclusionTree,
    carry,
    exclusion_tree,
    fast_stack,
    fast_step_mdp,
    merge_non_tensor,
    non_tensor,
)
from aenv.exceptions import SpecError

NestedKey = str | tuple[str, ...]

__all__ = [
    "NestedKey",
    "any_true",
    "complete_done",
    "done_groups",
    "entry",
    "exclusion_tree",
    "fast_step_mdp",
    "fast_stack",
    "getter",
    "mask_merge",
    "pad_mask",
    "prefix_of",
    "put",
    "put_text",
    "reduce_mask",
    "reset_keys_from_done_keys",
    "step_mdp",
    "terminated_or_truncated",
    "time_named",
    "unravel",
    "with_next",
    "writable",
]


def unravel(key: NestedKey) -> tuple[str, ...]:
    """Return a nested key as a tuple of strings."""
    return (key,) if isinstance(key, str) else tuple(key)


def getter(td: TensorDictBase) -> Any:
    """A ``get(key) -> value | None`` for ``td``'s own entries.

    On a plain :class:`~tensordict.TensorDict` and a string key this reads its entry dict
    directly (tens of times cheaper than ``td.get``, which matters on per-step paths); on any
    other kind of tensordict, or a nested key, it is ``td.get(key, None)``.
    """
    if type(td) is TensorDict:
        entries = td._tensordict
        fallback = td.get

        def get(key: NestedKey) -> Any:
            if type(key) is str:
                return entries.get(key)
            return fallback(key, None)

        return get
    return functools.partial(td.get, default=None)


def entry(td: TensorDictBase, key: NestedKey) -> Any:
    """``td.get(key, None)``; a string key of a plain TensorDict is read from its entry dict
    (one read: :func:`getter` serves several reads of one tensordict)."""
    if type(td) is TensorDict and type(key) is str:
        return td._tensordict.get(key)
    return td.get(key, None)


def _ravel(key: tuple[str, ...]) -> NestedKey:
    return key[0] if len(key) == 1 else key


def prefix_of(key: NestedKey) -> tuple[str, ...]:
    """Return the parent path of a nested key (``()`` for a root key)."""
    return unravel(key)[:-1]


def done_groups(done_keys: Iterable[NestedKey]) -> dict[tuple[str, ...], list[str]]:
    """Group done-like leaf keys by their parent path: ``{prefix: [leaf names]}``."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for key in done_keys:
        key_t = unravel(key)
        groups.setdefault(key_t[:-1], []).append(key_t[-1])
    return groups


def reset_keys_from_done_keys(done_keys: Iterable[NestedKey]) -> list[NestedKey]:
    """One ``"_reset"`` key per level that holds done entries, root first."""
    prefixes = sorted(done_groups(done_keys), key=len)
    return [_ravel((*p, "_reset")) for p in prefixes]


def writable(td: TensorDictBase) -> bool:
    """Whether entries may be written into ``td``'s entry dict directly (what the per-step
    helpers below check first): a plain, unlocked, unconsolidated
    :class:`~tensordict.TensorDict`. Each helper still checks that the value fits."""
    return (
        type(td) is TensorDict
        and not td.is_locked
        and "_consolidated" not in td.__dict__  # (hasattr would raise inside: slower)
    )


def put(td: TensorDictBase, key: str, value: torch.Tensor | TensorDictBase) -> None:
    """``td.set(key, value)`` for a tensor (or TensorDict) already shaped for ``td`` (a
    per-step helper).

    On a :func:`writable` TensorDict whose batch size the value starts with, and whose
    device (if any) it is on, this writes the entry dict directly; anything else goes
    through ``td.set`` and its checks.
    """
    if writable(td):
        bs = td.batch_size
        dev = td.device
        if value.shape[: len(bs)] == bs and (dev is None or value.device == dev):
            td._tensordict[key] = value
            return
    td.set(key, value)


def put_text(td: TensorDictBase, key: str, value: Any) -> None:
    """``td.set_non_tensor(key, value)`` for a plain python value, not a tensor or
    tensordict (a per-step helper: a step's error entries under ``on_error="observe"``, an
    agent's text action). On a :func:`writable` TensorDict
    with no device, the entry dict gets the :class:`~tensordict.NonTensorData`
    ``set_non_tensor`` would make, at about a quarter of its cost; anything else goes
    through ``set_non_tensor``."""
    if td.device is None and writable(td):
        td._tensordict[key] = non_tensor(value, td.batch_size)
    else:
        td.set_non_tensor(key, value)


def set_next(td: TensorDictBase, nxt: TensorDictBase) -> TensorDictBase:
    """``td.set("next", nxt)`` for a step's result (a per-step helper); returns ``td``.

    When ``td`` is :func:`writable` and ``nxt`` a plain TensorDict of its batch size, on
    its device (if it has one), neither with dim names, ``set`` would store ``nxt`` as it
    is: this writes the entry dict directly (a few µs less per step). Anything else goes
    through ``td.set``.
    """
    if type(nxt) is TensorDict and writable(td):
        bs, dev = td.batch_size, td.device
        if (
            nxt.batch_size == bs
            and (dev is None or nxt.device == dev)
            and not (bs and (td._has_names() or nxt._has_names()))
        ):
            td._tensordict["next"] = nxt
            return td
    return td.set("next", nxt)


def with_next(td: TensorDictBase, nxt: TensorDictBase) -> TensorDictBase:
    """``td.copy().set("next", nxt)``: a shallow copy of a step's input with its ``"next"``
    (what "reset what is done" reads), built without a copy's checks when ``td`` is an
    unlocked plain :class:`~tensordict.TensorDict` and ``nxt`` one of its batch size."""
    if (
        type(td) is TensorDict
        and type(nxt) is TensorDict
        and not td.is_locked
        and not td._has_names()
        and nxt.batch_size == td.batch_size
        and (td.device is None or nxt.device == td.device)
    ):
        entries = dict(td._tensordict)
        entries["next"] = nxt
        return TensorDict._new_unsafe(entries, td.batch_size, td.device, nested=False)  # type: ignore[arg-type]
    return td.copy().set("next", nxt)


def any_true(flag: torch.Tensor) -> bool:
    """``bool(flag.any())``, reading a one-element CPU tensor directly (ten times cheaper)."""
    if flag.numel() == 1 and flag.is_cpu:
        return bool(flag.item())
    return bool(flag.any())


def _all_false_singletons(names: list[str], *flags: Any) -> bool:
    """Whether each of a level's declared flags is present as a one-element CPU tensor
    holding False (then the level is already complete: nothing to add or fix).

    Reading one element is far cheaper than the union and the writes; most steps of most
    envs end here.
    """
    given = 0
    for flag in flags:
        if flag is None:
            continue
        if not isinstance(flag, torch.Tensor) or flag.numel() != 1 or not flag.is_cpu:
            return False
        if flag.item():
            return False
        given += 1
    return given == len(names)


def _check_undeclared(get: Any, prefix: tuple[str, ...], names: list[str]) -> None:
    """Refuse a done flag the spec lacks: left alone, it would be dropped and the episode
    run past its end (an env returning ``truncated`` without declaring it)."""
    for flag in ("done", "terminated", "truncated"):
        if flag not in names and get(flag) is not None:
            key = _ravel((*prefix, flag))
            raise SpecError(
                f"the env's output has a {key!r} entry, but its done spec declares only "
                f"{[_ravel((*prefix, n)) for n in names]}; declare it in full_done_spec "
                f"(for truncated: env.add_truncated_keys()) so that it is not ignored"
            )


def _fill_false(sub: TensorDictBase, names: list[str], zero: torch.Tensor) -> bool:
    """Write a fresh False tensor like ``zero`` (``zeros_like``: a µs less than a clone, every
    reset) as each declared flag of a level that has none (what the completion below gives
    it, in the same order), straight into the entry dict of an unlocked plain TensorDict
    that ``zero`` fits (as :func:`put` checks, once for the three entries). False, writing
    nothing, for any other tensordict."""
    if type(sub) is not TensorDict or sub.is_locked:
        return False
    bs, dev = sub.batch_size, sub.device
    if zero.shape[: len(bs)] != bs or (dev is not None and zero.device != dev):
        return False
    entries = sub._tensordict
    for name in ("terminated", "done", "truncated"):
        if name in names:
            entries[name] = torch.zeros_like(zero)
    return True


def complete_done(
    td: TensorDictBase,
    groups: dict[tuple[str, ...], list[str]],
    zeros: dict[tuple[str, ...], torch.Tensor] | None = None,
) -> TensorDictBase:
    """Complete done/terminated/truncated in place, level by level.

    Every level gets ``terminated`` (a copy of ``done`` where the env gave none) and ``done``
    (the union of ``terminated`` and ``truncated``). ``zeros`` gives, per level, a False
    tensor to use where a level has no entry at all.
    """
    for prefix, names in groups.items():
        sub = td.get(prefix, None) if prefix else td
        if sub is None:
            continue
        get = sub._tensordict.get if type(sub) is TensorDict else getter(sub)  # root-level names
        if len(names) < 3:
            _check_undeclared(get, prefix, names)
        has_term = "terminated" in names
        done: Any = get("done") if "done" in names else None
        term: Any = get("terminated") if has_term else None
        trunc: Any = get("truncated") if "truncated" in names else None
        if _all_false_singletons(names, done, term, trunc):
            continue  # every declared flag given, one CPU element each, all False: complete
        if done is None and term is None and trunc is None and zeros is not None:
            zero = zeros.get(prefix)
            if zero is not None and _fill_false(sub, names, zero):
                continue  # no flag given (a reset's output): each declared one False
        if term is None:
            if done is not None:
                term = done.clone()
            elif zeros is not None and prefix in zeros:
                term = zeros[prefix].clone()
            else:
                continue
            if has_term:
                put(sub, "terminated", term)
            if done is None:
                done = term.clone() if trunc is None else term | trunc
            elif trunc is not None:
                done = done | trunc
            else:
                done = None  # given, and term is its copy: nothing to change
        elif done is None:
            done = term.clone() if trunc is None else term | trunc
        else:
            done = done | term if trunc is None else done | term | trunc
        if done is not None and "done" in names:
            put(sub, "done", done)
        if trunc is None and "truncated" in names:
            put(sub, "truncated", torch.zeros_like(term))
    return td


def reduce_mask(mask: torch.Tensor, done_shape: torch.Size | Sequence[int]) -> torch.Tensor:
    """Drop the trailing singleton dim a ``"_reset"`` / done mask carries (shape ``(*b, 1)``)."""
    if mask.ndim and len(done_shape) and done_shape[-1] == 1 and mask.shape[-1] == 1:
        return mask.squeeze(-1)
    return mask


def pad_mask(mask: torch.Tensor, ndim: int) -> torch.Tensor:
    """View ``mask`` with trailing singleton dims up to ``ndim`` dims (for broadcasting)."""
    return mask.reshape(tuple(mask.shape) + (1,) * (ndim - mask.ndim))


def _expand_mask(mask: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
    """View ``mask`` so it broadcasts over ``target``; None when it cannot."""
    if target.shape[: mask.ndim] != mask.shape:
        return None
    return pad_mask(mask, target.ndim)


def mask_merge(
    new: TensorDictBase,
    old: TensorDictBase | None,
    mask: torch.Tensor,
    *,
    skip: Sequence[NestedKey] = (),
) -> TensorDictBase:
    """Where ``mask`` is False, put ``old``'s values into ``new`` (zeros when ``old`` lacks one).

    ``mask`` has the leading shape of the entries it governs (batch dims, plus agent dims
    for a nested level). Entries whose leading shape does not match are left as they are.
    Non-tensor entries are merged element-wise when they are stacks, else kept.
    """
    skip_set = {unravel(k) for k in skip}
    for key in list(new.keys(include_nested=True, leaves_only=True)):
        key_t = unravel(key)
        if key_t in skip_set or key_t[-1] in ("_reset", "_step"):
            continue
        value = new.get(key)
        if not isinstance(value, torch.Tensor):
            continue
        m = _expand_mask(mask, value)
        if m is None:
            continue
        prev = old.get(key, None) if old is not None else None
        if not isinstance(prev, torch.Tensor) or prev.shape != value.shape:
            prev = torch.zeros_like(value)
        elif prev.dtype != value.dtype:
            prev = prev.to(value.dtype)
        new.set(key, torch.where(m, value, prev))
    if old is not None:
        # non-tensor entries (strings...) are not leaves of keys(): merged element-wise
        for key in list(new.keys(include_nested=True)):
            value = new.get(key)
            if is_non_tensor(value) and unravel(key) not in skip_set:
                merge_non_tensor(new, old, key, value, mask)
    return new


_DONE_KEYS = ("done", "terminated", "truncated")


def _key_list(keys: NestedKey | Sequence[NestedKey], default: Any = None) -> list[NestedKey]:
    """One key (a string, or a tuple of strings naming one nested key) or a list of keys,
    as a list of keys."""
    if isinstance(keys, str):
        return [keys]
    if isinstance(keys, tuple) and keys != default and all(isinstance(k, str) for k in keys):
        return [keys]
    return list(keys)


def step_mdp(
    tensordict: TensorDictBase,
    next_tensordict: TensorDictBase | None = None,
    *,
    keep_other: bool = True,
    exclude_reward: bool = True,
    exclude_done: bool = False,
    exclude_action: bool = True,
    reward_keys: NestedKey | Sequence[NestedKey] = "reward",
    done_keys: NestedKey | Sequence[NestedKey] = ("done", "terminated", "truncated"),
    action_keys: NestedKey | Sequence[NestedKey] = "action",
    _tree: ExclusionTree | None = None,
    _next: TensorDictBase | None = None,
) -> TensorDictBase:
    """Build the input of the next step from a stepped tensordict.

    The ``"next"`` entries move to the root; root entries that ``"next"`` does not hold are
    kept when ``keep_other`` (policy states, for instance), except actions, rewards, done
    flags and private ``"_reset"``/``"_step"`` keys, each governed by its ``exclude_*`` flag.

    ``next_tensordict``, when given, is the destination (as in TorchRL): the result is
    written into it and it is returned.

    ``reward_keys``, ``done_keys`` and ``action_keys`` each take one key (a string or a
    tuple of strings: ``("agents", "reward")`` is one nested key) or a list of keys. The
    default ``done_keys`` tuple is read as three keys, as before.

    Example:
        >>> td = TensorDict({"obs": torch.zeros(1), "action": torch.ones(1),
        ...                  "next": {"obs": torch.ones(1), "reward": torch.ones(1)}}, [])
        >>> step_mdp(td)["obs"]
        tensor([1.])
    """
    reward_keys = _key_list(reward_keys)
    done_keys = _key_list(done_keys, _DONE_KEYS)
    action_keys = _key_list(action_keys)
    if next_tensordict is not None:
        out = step_mdp(
            tensordict,
            keep_other=keep_other,
            exclude_reward=exclude_reward,
            exclude_done=exclude_done,
            exclude_action=exclude_action,
            reward_keys=reward_keys,
            done_keys=done_keys,
            action_keys=action_keys,
            _tree=_tree,
            _next=_next,
        )
        return next_tensordict.update(out)
    nxt = tensordict.get("next") if _next is None else _next
    lazy = next((t for t in (tensordict, nxt) if isinstance(t, LazyStackedTensorDict)), None)
    if lazy is not None and tensordict.batch_size == nxt.batch_size:
        # element by element: the elements may differ in keys and shapes (heterogeneous
        # envs, dynamic specs), which reading the stack as one tensordict cannot hold
        dim = lazy.stack_dim
        parts = [
            step_mdp(
                root,
                _next=sub_next,
                keep_other=keep_other,
                exclude_reward=exclude_reward,
                exclude_done=exclude_done,
                exclude_action=exclude_action,
                reward_keys=reward_keys,
                done_keys=done_keys,
                action_keys=action_keys,
                _tree=_tree,
            )
            for root, sub_next in zip(tensordict.unbind(dim), nxt.unbind(dim))
        ]
        return LazyStackedTensorDict(*parts, stack_dim=dim)
    for value in nxt.values():
        if isinstance(value, TensorDictBase):
            # nested containers must not be shared with "next": a later reset updates the
            # new root in place, which would rewrite the stepped data
            nxt = nxt.clone(False)
            break
    if exclude_reward:
        out = nxt.exclude(*reward_keys, *(done_keys if exclude_done else ()))
    elif exclude_done:
        out = nxt.exclude(*done_keys)
    else:
        out = nxt.copy()
    if keep_other:
        if _tree is None:
            _tree = exclusion_tree(
                ["next", *reward_keys, *done_keys, *(action_keys if exclude_action else ())]
            )
        carry(tensordict, out, _tree)
    elif not exclude_action:
        for key in action_keys:
            value = tensordict.get(key, None)
            if value is not None:
                out.set(key, value)
    return out


def terminated_or_truncated(
    data: TensorDictBase,
    full_done_spec: Any = None,
    key: str | None = "_reset",
    write_full_false: bool = False,
) -> bool:
    """Say whether any sub-env is done, writing per-level masks under ``key``.

    For each level holding ``"terminated"`` / ``"truncated"`` / ``"done"`` entries, writes
    ``key`` (``"_reset"`` by default) at that level as the union of those flags, and returns
    True when any is set. With ``key=None`` nothing is written. Levels all-False get an entry
    only with ``write_full_false``.

    Example:
        >>> td = TensorDict({"done": torch.tensor([[True], [False]])}, [2])
        >>> terminated_or_truncated(td)
        True
        >>> td["_reset"].squeeze(-1)
        tensor([ True, False])
    """
    if full_done_spec is not None:
        done_keys: Iterable[NestedKey] = full_done_spec.keys(include_nested=True, leaves_only=True)
    else:
        done_keys = [
            k
            for k in data.keys(include_nested=True, leaves_only=True)
            if unravel(k)[-1] in ("done", "terminated", "truncated") and unravel(k)[0] != "next"
        ]
    any_done = False
    for prefix, names in done_groups(done_keys).items():
        sub = data.get(prefix, None) if prefix else data
        if sub is None:
            continue
        flags = [sub.get(n) for n in names if n in ("done", "terminated", "truncated")]
        flags = [f for f in flags if f is not None]
        if not flags:
            continue
        union = flags[0]
        for f in flags[1:]:
            union = union | f
        level_done = bool(union.any())
        any_done = any_done or level_done
        if key is not None and (level_done or write_full_false):
            sub.set(key, union.clone() if len(flags) == 1 else union)
    return any_done


def time_named(td: TensorDictBase) -> TensorDictBase:
    """Name the last batch dim ``"time"`` (in place where possible); returns ``td``."""
    with contextlib.suppress(RuntimeError, ValueError, NotImplementedError):
        td.refine_names(*([None] * (td.batch_dims - 1)), "time")
    return td
