"""Pool payloads and results as plain data, for the trips between processes.

A TensorDict pickles through ``torch.save`` per tensor and a tensorclass per non-tensor
entry: about 1 ms each way for a text env's observation of two strings and three flags (2
cores, Python 3.11), where its plain content (numpy arrays, strings) pickles in a few
microseconds. :func:`encode` turns TensorDicts of CPU tensors and non-tensor values (also
nested, and inside tuples and lists, as a step-and-maybe-reset's results come) into that plain
content, :func:`decode` rebuilds them; anything else (lazy stacks, gradients, other devices,
dtypes numpy lacks) raises :class:`Unpackable`, and the caller pickles it as it is.

Arrays of ``big`` bytes and more may travel beside the pickle (``big`` a list to append them
to: Ray's object store takes them without a copy); without ``big``, they are in the pickle.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, TensorDict

from aenv._mdp_tree import non_tensor

__all__ = ["BIG_BYTES", "Unpackable", "decode", "dumps", "encode", "loads"]

#: Arrays from this many bytes travel beside the pickle (when the caller takes them).
BIG_BYTES = 64 * 1024

_PROTOCOL = 5


class Unpackable(Exception):
    """Raised when a value has no plain form here (the caller pickles it as it is)."""


class _PackedTD:
    """A TensorDict's plain content: its batch size, device and entries (arrays as
    ``(dtype, shape, bytes)`` or :class:`_Big` s, packed TensorDicts, :class:`_Value` s)."""

    __slots__ = ("batch_size", "device", "entries")

    def __init__(self, batch_size: tuple[int, ...], device: str | None, entries: dict) -> None:
        self.batch_size = batch_size
        self.device = device
        self.entries = entries

    def __getstate__(self) -> tuple[Any, ...]:
        return self.batch_size, self.device, self.entries

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.batch_size, self.device, self.entries = state


class _Value:
    """A non-tensor entry's value (and the batch size it was stored with)."""

    __slots__ = ("batch_size", "data")

    def __init__(self, data: Any, batch_size: tuple[int, ...]) -> None:
        self.data = data
        self.batch_size = batch_size

    def __getstate__(self) -> tuple[Any, ...]:
        return self.data, self.batch_size

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.data, self.batch_size = state


class _Big(int):
    """Stands in a packed TensorDict for the array at this position of the list of big
    arrays that travels beside the pickle."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return _Big, (int(self),)


def _encode_td(td: TensorDict, big: list[np.ndarray] | None) -> _PackedTD:
    device = td.device
    if device is not None and device.type != "cpu":
        raise Unpackable
    entries: dict[str, Any] = {}
    for key, value in td._tensordict.items():
        kind = type(value)
        if kind is torch.Tensor:
            if value.requires_grad or value.dtype == torch.bfloat16 or value.device.type != "cpu":
                raise Unpackable
            array = value.numpy()
            if big is not None and array.nbytes >= BIG_BYTES:
                entries[key] = _Big(len(big))
                big.append(array)
            else:
                # (dtype, shape, raw bytes): a tenth of a numpy array's pickling cost for
                # the small arrays of a step (a reward, done flags)
                entries[key] = (array.dtype.str, array.shape, array.tobytes())
        elif kind is TensorDict:
            entries[key] = _encode_td(value, big)
        elif kind is NonTensorData:
            # (its fields, read without the tensorclass's attribute machinery)
            fields = value.__dict__
            inner = fields["_tensordict"]
            if inner.device is not None:
                raise Unpackable
            entries[key] = _Value(fields["_non_tensordict"]["data"], tuple(inner.batch_size))
        else:
            raise Unpackable  # lazy stacks, non-tensor stacks, tensor subclasses...
    return _PackedTD(tuple(td.batch_size), None if device is None else str(device), entries)


def encode(obj: Any, big: list[np.ndarray] | None = None) -> Any:
    """``obj`` as plain data: TensorDicts (in tuples too) packed, anything else as it is.

    Raises:
        Unpackable: a TensorDict holds something with no plain form here.
    """
    kind = type(obj)
    if kind is TensorDict:
        return _encode_td(obj, big)
    if kind is tuple:
        return tuple(encode(item, big) for item in obj)
    if kind is list:
        return [encode(item, big) for item in obj]
    return obj


#: numpy dtypes by their ``dtype.str`` (parsing the string costs more than the lookup)
_DTYPES: dict[str, np.dtype[Any]] = {}


def _tensor(value: Any, big: list[np.ndarray] | None) -> torch.Tensor:
    if type(value) is _Big:
        assert big is not None
        array = big[value]
        # (an array Ray read from its object store is a read-only view of shared memory)
        return torch.from_numpy(array if array.flags.writeable else array.copy())
    code, shape, raw = value
    dtype = _DTYPES.get(code)
    if dtype is None:
        dtype = _DTYPES[code] = np.dtype(code)
    # (a bytearray: the tensor owns writable memory)
    return torch.from_numpy(np.frombuffer(bytearray(raw), dtype=dtype).reshape(shape))


def _decode_td(packed: _PackedTD, big: list[np.ndarray] | None) -> TensorDict:
    source: dict[str, Any] = {}
    for key, value in packed.entries.items():
        kind = type(value)
        if kind is _PackedTD:
            source[key] = _decode_td(value, big)
        elif kind is _Value:
            source[key] = non_tensor(value.data, value.batch_size)
        else:
            source[key] = _tensor(value, big)
    device = None if packed.device is None else torch.device(packed.device)
    # fresh tensors and TensorDicts of the batch sizes they were packed with: nothing for
    # the checking constructor to check
    return TensorDict._new_unsafe(source, packed.batch_size, device, nested=False)  # type: ignore[arg-type]


def decode(obj: Any, big: list[np.ndarray] | None = None) -> Any:
    """The object :func:`encode` packed (``big``: the arrays that travelled beside it)."""
    kind = type(obj)
    if kind is _PackedTD:
        return _decode_td(obj, big)
    if kind is tuple:
        return tuple(decode(item, big) for item in obj)
    if kind is list:
        return [decode(item, big) for item in obj]
    return obj


def dumps(obj: Any) -> bytes:
    """``obj`` pickled, its TensorDicts as plain data where they have a plain form."""
    try:
        packed = encode(obj)
    except Unpackable:
        packed = obj
    return pickle.dumps(packed, protocol=_PROTOCOL)


def loads(data: bytes) -> Any:
    """The object :func:`dumps` pickled."""
    return decode(pickle.loads(data))
