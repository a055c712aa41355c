"""How the Ray backend packs operations' payloads and results (see :mod:`aenv.pool._ray`).

A streamed step carries one env's TensorDict each way: a handful of small tensors
(observation, action, reward, done flags) at the top level. :mod:`aenv.pool._codec` packs
any TensorDict (nested ones, non-tensor entries, big arrays apart), at ~30 us to encode
and ~30 us to decode one of six leaves here, checking each tensor's properties and
building an object per level. Such a flat TensorDict of CPU tensors goes instead as
:class:`_Flat`: its keys, dtypes and shapes and all its leaves' bytes joined in one
``bytes`` (one copy out, one copy back into a buffer the rebuilt tensors share), with no
pickle of its own: the frame that carries it pickles it with the rest (a third of the
cost both ways). Everything else takes :mod:`aenv.pool._codec`'s path, or goes as it is.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from aenv.pool._codec import BIG_BYTES, decode, encode

__all__ = ["cat_flat", "pack", "unpack"]

#: torch dtypes by a short code (and back): what numpy can view, without bfloat16 and the
#: like (``Tensor.numpy`` refuses those, and they take the general path)
_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
_CODE_OF = {dtype: code for code, dtype in enumerate(_DTYPES)}
_NUMPY = tuple(torch.empty(0, dtype=dtype).numpy().dtype for dtype in _DTYPES)


class _Flat:
    """A flat TensorDict of CPU tensors: batch size, device, keys, dtype codes, shapes and
    the leaves' bytes, joined in order."""

    __slots__ = ("batch_size", "blob", "codes", "device", "keys", "shapes")

    def __init__(
        self,
        batch_size: tuple[int, ...],
        device: str | None,
        keys: tuple[str, ...],
        codes: tuple[int, ...],
        shapes: tuple[tuple[int, ...], ...],
        blob: bytes,
    ) -> None:
        self.batch_size = batch_size
        self.device = device
        self.keys = keys
        self.codes = codes
        self.shapes = shapes
        self.blob = blob

    def __reduce__(self) -> tuple[Any, ...]:
        return _Flat, (
            self.batch_size,
            self.device,
            self.keys,
            self.codes,
            self.shapes,
            self.blob,
        )


def _flat(td: TensorDict) -> _Flat | None:
    """``td`` as a :class:`_Flat`, or None where it is not one (a nested or non-tensor
    entry, a tensor numpy cannot view, a big leaf)."""
    device = td.device
    if device is not None and device.type != "cpu":
        return None
    codes: list[int] = []
    shapes: list[tuple[int, ...]] = []
    arrays: list[Any] = []  # (numpy arrays: buffers bytes.join takes)
    for value in td._tensordict.values():
        if type(value) is not torch.Tensor:
            return None
        code = _CODE_OF.get(value.dtype)
        if code is None:
            return None
        try:
            # (refuses a tensor that requires grad, lives elsewhere, or has a lazy conj or
            # neg bit: those take the general path)
            array = value.numpy()
        except (RuntimeError, TypeError):
            return None
        codes.append(code)
        shapes.append(array.shape)
        arrays.append(array)
    try:
        blob = b"".join(arrays)
    except TypeError:  # a strided view (not a contiguous buffer): one contiguous copy each
        blob = b"".join([np.ascontiguousarray(a) for a in arrays])  # type: ignore[misc]
    if len(blob) >= BIG_BYTES:
        return None  # (the general path sends big arrays apart, through Ray's store)
    return _Flat(
        tuple(td.batch_size),
        None if device is None else "cpu",
        tuple(td._tensordict),
        tuple(codes),
        tuple(shapes),
        blob,
    )


def _unflat(flat: _Flat) -> TensorDict:
    buffer = bytearray(flat.blob)  # (writable memory the tensors own)
    source: dict[str, torch.Tensor] = {}
    offset = 0
    for key, code, shape in zip(flat.keys, flat.codes, flat.shapes):
        dtype = _NUMPY[code]
        # (numpy's view then torch.from_numpy: a third of torch.frombuffer's cost here;
        # a 1-D leaf, most of a step's, is the view as it comes: a reshape cost ~0.5 us)
        if len(shape) == 1:
            count = shape[0]
            array = np.frombuffer(buffer, dtype, count, offset)
        else:
            count = 1
            for size in shape:
                count *= size
            array = np.frombuffer(buffer, dtype, count, offset).reshape(shape)
        source[key] = torch.from_numpy(array)
        offset += count * dtype.itemsize
    device = None if flat.device is None else torch.device(flat.device)
    # fresh tensors of the shapes they were packed with: nothing for the checking
    # constructor to check
    return TensorDict._new_unsafe(source, flat.batch_size, device, nested=False)  # type: ignore[arg-type]


_PLAIN = frozenset((type(None), bool, int, float, str))


def _plain(item: Any) -> bool:
    """A value with no TensorDict in it: a scalar, or a list of flags."""
    kind = type(item)
    return kind in _PLAIN or (kind is list and all(type(x) is bool for x in item))


def cat_flat(parts: list[Any]) -> TensorDict | None:
    """The flat TensorDicts ``parts`` (:class:`_Flat` s, as :func:`pack` made them) joined
    along their first dim, each leaf copied once from the parts' bytes into one new array
    (no TensorDict per part, no ``torch.cat`` of TensorDicts); None where they are not
    all flat TensorDicts of one structure with a first dim."""
    first = parts[0]
    if any(type(p) is not _Flat for p in parts) or not first.batch_size:
        return None
    keys, codes, device = first.keys, first.codes, first.device
    rest = first.batch_size[1:]
    if any(
        p.keys != keys or p.codes != codes or p.device != device or p.batch_size[1:] != rest
        for p in parts
    ):
        return None
    offsets = [0] * len(parts)
    source: dict[str, torch.Tensor] = {}
    for k, (key, code) in enumerate(zip(keys, codes)):
        dtype = _NUMPY[code]
        pieces = []
        for j, part in enumerate(parts):
            shape = part.shapes[k]
            count = 1
            for size in shape:
                count *= size
            pieces.append(np.frombuffer(part.blob, dtype, count, offsets[j]).reshape(shape))
            offsets[j] += count * dtype.itemsize
        try:
            source[key] = torch.from_numpy(np.concatenate(pieces))
        except ValueError:  # (leaves whose trailing shapes differ: not one structure)
            return None
    batch = (sum(p.batch_size[0] for p in parts), *rest)
    return TensorDict._new_unsafe(
        source,  # type: ignore[arg-type]
        batch,
        None if device is None else torch.device(device),
        nested=False,
    )


def pack(obj: Any) -> tuple[Any, ...]:
    """An operation's payload or result, ready for the wire or a Ray call.

    A flat TensorDict of CPU tensors, alone or in a tuple or list, as ``("f", obj)`` with
    each such TensorDict a :class:`_Flat`; other TensorDicts (also inside tuples and lists)
    as plain data (:mod:`aenv.pool._codec`) in one pickle, ``("p", bytes, big arrays)``,
    the arrays of :data:`~aenv.pool._codec.BIG_BYTES` or more apart (Ray serialises them
    out of band, through its shared-memory object store); anything else as it is
    (``("o", obj)``: pickled with the frame or by Ray, with cloudpickle where it must)."""
    kind = type(obj)
    if kind is TensorDict:
        flat: Any = _flat(obj)
        if flat is not None:
            return "f", flat
    elif (kind is tuple or kind is list) and obj:
        # (a step-and-maybe-reset's two TensorDicts, a reset's optional one, a whole-batch
        # answer's tag, rows and reset flags): flat where every TensorDict in it is and the
        # rest is plain
        items = []
        for item in obj:
            if type(item) is TensorDict:
                item = _flat(item)
                if item is None:
                    break
            elif not _plain(item):
                break
            items.append(item)
        else:
            if any(type(item) is _Flat for item in items):
                return "f", items if kind is list else tuple(items)
    big: list[np.ndarray] = []
    try:
        return "p", pickle.dumps(encode(obj, big), protocol=5), big
    except Exception:  # (Unpackable, or something plain pickle cannot take)
        return "o", obj


def unpack(packed: tuple[Any, ...]) -> Any:
    """The object :func:`pack` packed."""
    tag = packed[0]
    if tag == "f":
        obj = packed[1]
        if type(obj) is _Flat:
            return _unflat(obj)
        items = [_unflat(item) if type(item) is _Flat else item for item in obj]
        return items if type(obj) is list else tuple(items)
    if tag == "p":
        return decode(pickle.loads(packed[1]), packed[2])
    return packed[1]
