"""Text and other python objects in TensorDicts: a spec shorthand and one accessor.

A string travels as ``NonTensorData`` in an unbatched TensorDict, and as a
``NonTensorStack`` (whose ``td[key]`` is a ``LinkedList``) once envs are stacked by a pool or
steps by a rollout; ``td[i][key]`` is then a plain ``str``. :func:`get_text` reads all of
these the same way: the batch size of the TensorDict, not the path the data took, decides
what comes back.
"""

from __future__ import annotations

from typing import Any

from tensordict import NonTensorData, NonTensorStack, TensorDictBase

from aenv._mdp_tree import non_tensor_value
from aenv.specs import NonTensor

__all__ = ["Text", "get_data", "get_text"]

_MISSING = object()


def Text(shape: Any = (), *, example: str = "", device: Any = None) -> NonTensor:
    """A spec for strings: ``NonTensor(shape, example_data=example)``.

    The example is only what ``spec.zero()`` holds; it takes no part in spec equality, so
    envs with different prompts stack densely in a pool.

    Example:
        >>> from aenv.llm import Text
        >>> Text().zero().data
        ''
        >>> Text((2,), example="hi").zero().tolist()
        ['hi', 'hi']
    """
    return NonTensor(shape=shape, device=device, example_data=example)


def _plain(value: Any) -> Any:
    """Python data out of a non-tensor value: nested lists follow the batch dims."""
    if isinstance(value, NonTensorStack):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, NonTensorData):
        return _plain(value.tolist()) if value.batch_size else non_tensor_value(value)
    if isinstance(value, list):  # tensordict's LinkedList is a list
        return [_plain(v) for v in value]
    return value


def _depth_ok(value: Any, ndim: int, leaf: type | None) -> bool:
    if ndim == 0:
        return leaf is None or isinstance(value, leaf)
    return isinstance(value, list) and all(_depth_ok(v, ndim - 1, leaf) for v in value)


def get_data(td: TensorDictBase, key: Any, *, _leaf: type | None = None) -> Any:
    """The python object(s) stored under ``key``: one object for an unbatched ``td``,
    nested lists following ``td.batch_size`` otherwise, whatever the path the data took
    (a single env, a pool row, a process backend, a rollout).

    Example:
        >>> from tensordict import NonTensorData, TensorDict
        >>> from aenv.llm import get_data
        >>> get_data(TensorDict(h=NonTensorData({"a": 1})), "h")
        {'a': 1}
    """
    value = td.get(key, _MISSING)
    if value is _MISSING:
        raise KeyError(f"no entry {key!r} in the tensordict (keys: {list(td.keys())})")
    if isinstance(value, TensorDictBase) and not isinstance(value, (NonTensorData, NonTensorStack)):
        raise TypeError(f"entry {key!r} is a nested TensorDict, not non-tensor data")
    out = _plain(value)
    ndim = len(td.batch_size)
    if ndim and not isinstance(out, list):
        # one value stored for the whole batch (NonTensorData with a batch size is
        # unpacked above; a plain object set on a batched td is shared by every element)
        out = _broadcast(out, list(td.batch_size))
    if not _depth_ok(out, ndim, _leaf):
        want = _leaf.__name__ if _leaf is not None else "objects"
        raise TypeError(
            f"entry {key!r} does not hold {want} of batch size {tuple(td.batch_size)}: "
            f"got {_describe(out)}"
        )
    return out


def get_text(td: TensorDictBase, key: Any) -> Any:
    """The string(s) under ``key``: ``str`` for an unbatched ``td``, ``list[str]`` for a
    batch of one dim (nested lists for more), on every path.

    Example:
        >>> import torch
        >>> from tensordict import NonTensorData, NonTensorStack, TensorDict
        >>> from aenv.llm import get_text
        >>> get_text(TensorDict(p=NonTensorData("hi")), "p")
        'hi'
        >>> td = TensorDict(p=NonTensorStack.from_list(["a", "b"]), batch_size=[2])
        >>> get_text(td, "p"), get_text(td[1], "p")
        (['a', 'b'], 'b')
    """
    return get_data(td, key, _leaf=str)


def _broadcast(value: Any, shape: list[int]) -> Any:
    if not shape:
        return value
    return [_broadcast(value, shape[1:]) for _ in range(shape[0])]


def _describe(value: Any) -> str:
    if isinstance(value, list):
        inner = _describe(value[0]) if value else "nothing"
        return f"a list of {len(value)} ({inner}, ...)"
    return f"a {type(value).__name__}"
